// The MoE deployments `mxq tune` knows (mxq/tune/presets.h): each preset lists the problems of
// every rank shape of a TP x EP layout, for the CPU expert computation (moe_expert_gemm) and the
// GPU forward (moe_gpu_forward), as the layer shards them (mxq/moe/sharding.h).
#include <vector>

#include "mxq/moe/prepare.h"
#include "mxq/moe/sharding.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/presets.h"

namespace mxq::tune {
namespace {

// The problems of every rank shape of `layout`, once each. An uneven split gives the last EP ranks
// fewer experts and the last TP ranks fewer valid channels: keys of their own, which serving
// looks up and so must be tuned. A TP rank left without channels (tp_size > I / 32 leaves the
// last ranks empty) runs no kernel on the GPU (MoeGpuLayer: an inactive rank) and has no GPU key;
// on the CPU it still runs its zero-filled shard.
std::vector<PresetProblem> moe_rank_problems(
    std::int64_t experts, std::int64_t hidden, std::int64_t intermediate, std::int64_t top_k,
    const ParallelLayout& layout, const std::vector<std::int64_t>& tokens,
    moe::ActivationQuant quant = moe::ActivationQuant::kBf16) {
  std::vector<PresetProblem> cpu;
  std::vector<PresetProblem> gpu;
  const auto add_new = [&tokens](std::vector<PresetProblem>& list, Problem problem) {
    for (const PresetProblem& p : list) {
      if (p.problem == problem) return;
    }
    list.push_back({std::move(problem), tokens});
  };
  for (int ep_rank = 0; ep_rank < layout.ep; ++ep_rank) {
    const moe::EpShard ep = moe::ep_shard(experts, layout.ep, ep_rank);
    for (int tp_rank = 0; tp_rank < layout.tp; ++tp_rank) {
      const moe::TpShard tp = moe::tp_shard(intermediate, layout.tp, tp_rank);
      add_new(cpu,
              moe::moe_expert_gemm_problem({experts, ep.count, hidden, tp.width, top_k, true}));
      if (tp.valid == 0) continue;
      // The kernels stream the valid channels of the width padded to the layer's default
      // alignment, as `mxq run` / `mxq moe` prepare it.
      moe::MoeGpuForwardShape shape;
      shape.experts = experts;
      shape.experts_local = ep.count;
      shape.hidden = hidden;
      shape.intermediate_valid = tp.valid;
      shape.intermediate_after_pad = moe::padded_intermediate(tp.width, moe::kDefaultAlignment);
      shape.top_k = top_k;
      shape.has_bias = true;
      shape.activation = moe::Activation::kSwigluOai;
      shape.activation_quant = quant;
      add_new(gpu, moe::moe_gpu_forward_problem(shape));
    }
  }
  cpu.insert(cpu.end(), gpu.begin(), gpu.end());
  return cpu;
}

std::vector<PresetProblem> tiny_moe(const ParallelLayout& layout) {
  return moe_rank_problems(8, 128, 128, 2, layout, power_of_two_buckets(64));
}

// gpt-oss: H = I = 2880, top-4, biases; 20b has 32 experts, 120b 128.
std::vector<PresetProblem> gpt_oss_20b(const ParallelLayout& layout) {
  return moe_rank_problems(32, 2880, 2880, 4, layout, power_of_two_buckets(8192));
}
std::vector<PresetProblem> gpt_oss_120b(const ParallelLayout& layout) {
  return moe_rank_problems(128, 2880, 2880, 4, layout, power_of_two_buckets(8192));
}
// The same layers served W4A8 (activation_quant fp8_g128): the GPU keys of that precision; the
// CPU expert computation's keys are the W4A16 presets' (its tilings do not depend on it).
std::vector<PresetProblem> gpt_oss_20b_w4a8(const ParallelLayout& layout) {
  return moe_rank_problems(32, 2880, 2880, 4, layout, power_of_two_buckets(8192),
                           moe::ActivationQuant::kFp8Group128);
}
std::vector<PresetProblem> gpt_oss_120b_w4a8(const ParallelLayout& layout) {
  return moe_rank_problems(128, 2880, 2880, 4, layout, power_of_two_buckets(8192),
                           moe::ActivationQuant::kFp8Group128);
}

}  // namespace

void register_moe_presets(std::vector<DeploymentPreset>& presets) {
  presets.push_back(
      {"tiny-moe", "small MXFP4 MoE (E=8, H=I=128, top-2) that tunes in seconds", tiny_moe});
  presets.push_back({"gpt-oss-20b",
                     "gpt-oss-20b MoE experts (E=32, H=I=2880, top-4), I split over TP",
                     gpt_oss_20b});
  presets.push_back({"gpt-oss-120b",
                     "gpt-oss-120b MoE experts (E=128, H=I=2880, top-4), I split over TP",
                     gpt_oss_120b});
  presets.push_back({"gpt-oss-20b-w4a8",
                     "gpt-oss-20b MoE experts served W4A8 (activation_quant fp8_g128)",
                     gpt_oss_20b_w4a8});
  presets.push_back({"gpt-oss-120b-w4a8",
                     "gpt-oss-120b MoE experts served W4A8 (activation_quant fp8_g128)",
                     gpt_oss_120b_w4a8});
}

}  // namespace mxq::tune
