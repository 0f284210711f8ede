// nanobind's view of mxq::moe::MoeLayer, shared by every translation unit that binds or takes it
// (the trait must be the same everywhere).
#pragma once

#include <nanobind/nanobind.h>

#include <type_traits>

#include "mxq/moe/layer.h"

// MoeLayer is move-only (its ranks own storage), which std::is_copy_constructible cannot see
// through std::vector.
template <>
struct nanobind::detail::is_copy_constructible<mxq::moe::MoeLayer> : std::false_type {};
