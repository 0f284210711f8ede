// Deployment presets for `mxq tune`: the problems (op + static shape) a model deployment runs
// and the token counts it serves, for a given tensor/expert-parallel layout. The tuning plan of
// a deployment is derived from these, not from whatever a warm-up forward happens to touch.
//
// A preset lists the problems of every backend (e.g. a MoE layer's CPU moe_expert_gemm and its
// GPU moe_gpu_forward); `mxq tune --device D` tunes those whose op has tactics for D.
//
// Adding a model: one entry in the table in src/tune/presets.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/tune/problem.h"

namespace mxq::tune {

struct ParallelLayout {
  int tp = 1;  // tensor-parallel ranks
  int ep = 1;  // expert-parallel ranks
};

struct PresetProblem {
  Problem problem;
  std::vector<std::int64_t> tokens;  // token counts served (mapped to the op's buckets)
};

struct DeploymentPreset {
  std::string name;
  std::string description;
  // The problems the ranks run under `layout`, each distinct shape once (an uneven split adds
  // the odd ranks' keys); throws when the layout does not divide the model's shapes.
  std::function<std::vector<PresetProblem>(const ParallelLayout& layout)> problems;
};

std::span<const DeploymentPreset> deployment_presets();
// Throws mxq::Error listing the known presets when `name` is not one.
const DeploymentPreset& find_preset(std::string_view name);

}  // namespace mxq::tune
