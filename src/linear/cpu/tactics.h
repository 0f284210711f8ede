// Registration of the CPU tactics (internal).
#pragma once

#include <memory>
#include <vector>

#include "mxq/linear/tactic.h"

namespace mxq::linear::internal {

void append_cpu_tactics(std::vector<std::unique_ptr<LinearTactic>>& tactics);

}  // namespace mxq::linear::internal
