// The block-FP8 linear deployments `mxq tune` knows (mxq/tune/presets.h).
#include <vector>

#include "mxq/linear/tune.h"
#include "mxq/tune/presets.h"

namespace mxq::tune {
namespace {

// DeepSeek-V3's block-FP8 linears (128x128 blocks) under tensor parallelism: the fused q/kv
// down-projection (2112, 7168) is replicated; q_b (24576, 1536), kv_b (32768, 512) and the
// shared expert's gate/up (4096, 7168) are column-parallel (N split); o_proj (7168, 16384) and
// the shared expert's down (7168, 2048) are row-parallel (K split).
std::vector<PresetProblem> deepseek_v3_linear(const ParallelLayout& layout) {
  const auto problem = [](std::int64_t n, std::int64_t k) {
    return linear::block_fp8_linear_problem(n, k, {128, 128});
  };
  const std::vector<std::int64_t> tokens = power_of_two_buckets(4096);
  const int tp = layout.tp;
  return {
      {problem(2112, 7168), tokens},
      {problem(split_evenly(24576, tp, "q_b N=24576"), 1536), tokens},
      {problem(split_evenly(32768, tp, "kv_b N=32768"), 512), tokens},
      {problem(7168, split_evenly(16384, tp, "o_proj K=16384")), tokens},
      {problem(split_evenly(4096, tp, "shared gate/up N=4096"), 7168), tokens},
      {problem(7168, split_evenly(2048, tp, "shared down K=2048")), tokens},
  };
}

}  // namespace

void register_linear_presets(std::vector<DeploymentPreset>& presets) {
  presets.push_back({"deepseek-v3-linear",
                     "DeepSeek-V3's six block-FP8 linear shapes (128x128 blocks), TP split",
                     deepseek_v3_linear});
}

}  // namespace mxq::tune
