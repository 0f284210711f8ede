// Deployment presets for `mxq tune`: the problems (op + static shape) a model deployment runs
// and the token counts it serves, for a given tensor/expert-parallel layout. The tuning plan of
// a deployment is derived from these, not from whatever a warm-up forward happens to touch.
//
// A preset lists the problems of every backend (e.g. a MoE layer's CPU moe_expert_gemm and its
// GPU moe_gpu_forward); `mxq tune --device D` tunes those whose op has tactics for D.
//
// The tuner knows no model: each op registers its presets from its own folder. Every source file
// named `*_presets.cpp` under src/ defines
//     void mxq::tune::register_<file stem>(std::vector<DeploymentPreset>& presets);
// (e.g. src/moe/moe_presets.cpp: tiny-moe, gpt-oss-20b, gpt-oss-120b); CMake generates the call
// list (cmake/MxqTactics.cmake). Adding a model: one entry in its op's presets file.
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

// The built-in presets, in the order their files register them (frozen on first use,
// thread-safe).
std::span<const DeploymentPreset> deployment_presets();
// Throws mxq::Error listing the known presets when `name` is not one.
const DeploymentPreset& find_preset(std::string_view name);
// The same among `presets` (for test presets next to the built-in ones).
const DeploymentPreset& find_preset(std::span<const DeploymentPreset> presets,
                                    std::string_view name);

// For an op's presets: `size` split over `parts` ranks; throws mxq::Error naming `what` unless
// `parts` divides `size`.
std::int64_t split_evenly(std::int64_t size, int parts, std::string_view what);

// Fills `presets` with the built-in ones (generated: calls every register_<stem>).
void register_builtin_presets(std::vector<DeploymentPreset>& presets);

}  // namespace mxq::tune
