// BlockShape from Python: a BlockShape, a "128x128" string, or any sequence of two positive
// integers ((128, 128) and [128, 128] alike). Every block-shape argument goes through here, so a
// tuple and a list can never compare differently (the seed bug).
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <string_view>

#include "mxq/formats/fp8_block.h"

namespace mxq::python {

namespace nb = nanobind;

std::optional<BlockShape> try_block_shape(nb::handle value);
// Raises TypeError naming `argument` for anything else; mxq.Error for non-positive extents.
BlockShape block_shape_arg(nb::handle value, std::string_view argument);

}  // namespace mxq::python
