#include "mxq/tune/presets.h"

#include <vector>

#include "mxq/core/error.h"
#include "mxq/moe/prepare.h"
#include "mxq/moe/sharding.h"
#include "mxq/tune/block_fp8_linear.h"
#include "mxq/tune/moe_expert_gemm.h"
#include "mxq/tune/moe_gpu_forward.h"
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

// The toy presets tune the toy_gemm demo op (include/mxq/tune/toy_gemm.h): small and fast,
// they keep the tuner's own tests doing real measurements on a CPU-only machine. "toy-draft" shares
// one problem with "toy" (as a draft model shares layer shapes with its target) and serves odd
// draft token counts.
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

// One rank's MoE problem: experts split over EP ranks, the intermediate width over TP ranks
// (the layer's own TP shard width, a multiple of 32: mxq/moe/sharding.h).
Problem moe_rank_problem(std::int64_t experts, std::int64_t hidden, std::int64_t top_k,
                         const moe::TpShard& tp, const moe::EpShard& ep) {
  return moe_expert_gemm_problem({experts, ep.count, hidden, tp.width, top_k, true});
}

// The same rank on the GPU (moe_gpu_forward): the kernels stream the rank's valid channels of the
// width padded to the layer's default alignment (128), as `mxq run` / `mxq moe` prepare it.
Problem moe_gpu_rank_problem(std::int64_t experts, std::int64_t hidden, std::int64_t top_k,
                             const moe::TpShard& tp, const moe::EpShard& ep) {
  MoeGpuForwardShape shape;
  shape.rank = {experts, ep.count, hidden, tp.valid, top_k, true};
  shape.intermediate_padded = moe::padded_intermediate(tp.width, moe::kDefaultAlignment);
  shape.activation = moe::Activation::kSwigluOai;
  return moe_gpu_forward_problem(shape);
}

// A MoE preset's problems: the CPU expert computation and the GPU forward of every rank shape
// of the layout, once each. An uneven split gives the last EP rank fewer experts, the last TP
// rank fewer valid channels: keys of their own, which serving looks up and so must be tuned.
std::vector<PresetProblem> moe_rank(std::int64_t experts, std::int64_t hidden,
                                    std::int64_t intermediate, std::int64_t top_k,
                                    const ParallelLayout& layout,
                                    const std::vector<std::int64_t>& tokens) {
  std::vector<PresetProblem> cpu;
  std::vector<PresetProblem> gpu;
  const auto add_new = [&tokens](std::vector<PresetProblem>& list, Problem problem) {
    for (const PresetProblem& p : list) {
      if (p.problem.canonical() == problem.canonical()) return;
    }
    list.push_back({std::move(problem), tokens});
  };
  for (int ep_rank = 0; ep_rank < layout.ep; ++ep_rank) {
    const moe::EpShard ep = moe::ep_shard(experts, layout.ep, ep_rank);
    for (int tp_rank = 0; tp_rank < layout.tp; ++tp_rank) {
      const moe::TpShard tp = moe::tp_shard(intermediate, layout.tp, tp_rank);
      add_new(cpu, moe_rank_problem(experts, hidden, top_k, tp, ep));
      add_new(gpu, moe_gpu_rank_problem(experts, hidden, top_k, tp, ep));
    }
  }
  cpu.insert(cpu.end(), gpu.begin(), gpu.end());
  return cpu;
}

std::vector<std::int64_t> powers_of_two(std::int64_t max) {
  std::vector<std::int64_t> tokens;
  for (std::int64_t t = 1; t <= max; t *= 2) tokens.push_back(t);
  return tokens;
}

std::vector<PresetProblem> tiny_moe(const ParallelLayout& layout) {
  return moe_rank(8, 128, 128, 2, layout, powers_of_two(64));
}

// gpt-oss: H = I = 2880, top-4, biases; 20b has 32 experts, 120b 128.
std::vector<PresetProblem> gpt_oss_20b(const ParallelLayout& layout) {
  return moe_rank(32, 2880, 2880, 4, layout, powers_of_two(8192));
}
std::vector<PresetProblem> gpt_oss_120b(const ParallelLayout& layout) {
  return moe_rank(128, 2880, 2880, 4, layout, powers_of_two(8192));
}

// DeepSeek-V3's block-FP8 linears (128x128 blocks) under tensor parallelism: the fused q/kv
// down-projection (2112, 7168) is replicated; q_b (24576, 1536), kv_b (32768, 512) and the
// shared expert's gate/up (4096, 7168) are column-parallel (N split); o_proj (7168, 16384) and
// the shared expert's down (7168, 2048) are row-parallel (K split).
std::vector<PresetProblem> deepseek_v3_linear(const ParallelLayout& layout) {
  const auto problem = [](std::int64_t n, std::int64_t k) {
    return block_fp8_linear_problem(n, k, {128, 128});
  };
  const std::vector<std::int64_t> tokens = powers_of_two(4096);
  const int tp = layout.tp;
  return {
      {problem(2112, 7168), tokens},
      {problem(split(24576, tp, "q_b N=24576"), 1536), tokens},
      {problem(split(32768, tp, "kv_b N=32768"), 512), tokens},
      {problem(7168, split(16384, tp, "o_proj K=16384")), tokens},
      {problem(split(4096, tp, "shared gate/up N=4096"), 7168), tokens},
      {problem(7168, split(2048, tp, "shared down K=2048")), tokens},
  };
}

const std::vector<DeploymentPreset>& table() {
  static const std::vector<DeploymentPreset> presets = {
      {"toy", "demo: two toy_gemm layers (the tuner's tests)", toy_target},
      {"toy-draft", "demo draft model for \"toy\": one shared and one own toy_gemm layer",
       toy_draft},
      {"tiny-moe", "small MXFP4 MoE (E=8, H=I=128, top-2) that tunes in seconds", tiny_moe},
      {"gpt-oss-20b", "gpt-oss-20b MoE experts (E=32, H=I=2880, top-4), I split over TP",
       gpt_oss_20b},
      {"gpt-oss-120b", "gpt-oss-120b MoE experts (E=128, H=I=2880, top-4), I split over TP",
       gpt_oss_120b},
      {"deepseek-v3-linear", "DeepSeek-V3's six block-FP8 linear shapes (128x128 blocks), TP split",
       deepseek_v3_linear},
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
