#include "mxq/tune/presets.h"

#include <vector>

#include "mxq/core/error.h"
#include "mxq/tune/toy_gemm.h"

namespace mxq::tune {
namespace {

std::int64_t split(std::int64_t size, int parts, const char* what) {
  if (parts < 1 || size % parts != 0) {
    fail_argument(ErrorCode::kInvalidArgument, std::string("parallel split of ") + what,
                  "a divisor of " + std::to_string(size), parts);
  }
  return size / parts;
}

// The toy presets tune the toy_gemm demo op (include/mxq/tune/toy_gemm.h) until the real
// MoE and linear ops register their tactics; they keep `mxq tune` and the tuner's tests
// doing real measurements on a CPU-only machine. "toy-draft" shares one problem with "toy"
// (as a draft model shares layer shapes with its target) and serves odd draft token counts.
std::vector<PresetProblem> toy_target(const ParallelLayout& layout) {
  return {
      {toy_gemm_problem(split(512, layout.tp, "toy N=512"), 256), {1, 2, 4, 8, 16, 32, 64}},
      {toy_gemm_problem(256, split(512, layout.tp, "toy K=512")), {1, 2, 4, 8, 16, 32, 64}},
  };
}

std::vector<PresetProblem> toy_draft(const ParallelLayout& layout) {
  return {
      {toy_gemm_problem(split(512, layout.tp, "toy N=512"), 256), {1, 3, 24}},
      {toy_gemm_problem(split(192, layout.tp, "toy-draft N=192"), 128), {1, 3, 12, 24}},
  };
}

const std::vector<DeploymentPreset>& table() {
  static const std::vector<DeploymentPreset> presets = {
      {"toy", "demo: two toy_gemm layers (stands in for a model until the real ops land)",
       toy_target},
      {"toy-draft", "demo draft model for \"toy\": one shared and one own toy_gemm layer",
       toy_draft},
  };
  return presets;
}

}  // namespace

std::span<const DeploymentPreset> deployment_presets() { return table(); }

const DeploymentPreset& find_preset(std::string_view name) {
  std::string known;
  for (const DeploymentPreset& preset : table()) {
    if (preset.name == name) return preset;
    known += (known.empty() ? "" : ", ") + preset.name;
  }
  fail_argument(ErrorCode::kInvalidArgument, "preset", "one of " + known,
                std::string("'").append(name).append("'"));
}

}  // namespace mxq::tune
