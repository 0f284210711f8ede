// moe_expert_gemm: the autotuner's view of one rank's MXFP4 MoE expert computation on the CPU
// (GEMM1 + bias + activation, GEMM2 + bias, weighted sum over the top-k slots; the reference of
// docs/moe.md, src/cpu/moe/expert_forward.h). Its tactics are tilings of the expert GEMMs: tiles
// of routed (token, slot) pairs, of weight rows, and the thread count. Every output element is
// one fixed-order fp64 dot product whatever the tiling, so every tactic must give bit-identical
// output to the reference; the workload checks exactly that.
#pragma once

#include <cstdint>
#include <string_view>

#include "mxq/tune/problem.h"

namespace mxq::moe {
class MoeRankWeights;
struct MoeConfig;
}  // namespace mxq::moe

namespace mxq::tune {

inline constexpr std::string_view kMoeExpertGemmOp = "moe_expert_gemm";

// The shape one rank runs: `experts` global experts of which `experts_local` live on this rank
// (EP), hidden size H, intermediate width per rank I (the TP shard, a multiple of 32), top_k.
struct MoeExpertGemmShape {
  std::int64_t experts = 0;
  std::int64_t experts_local = 0;
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;
  std::int64_t top_k = 0;
  bool has_bias = true;
};

// Throws mxq::Error naming the field when the shape is not one the MoE layer runs.
Problem moe_expert_gemm_problem(const MoeExpertGemmShape& shape);

// What a moe_expert_gemm tactic runs on (the arguments of cpu::rank_expert_forward).
struct MoeExpertGemmArgs {
  const moe::MoeRankWeights* weights = nullptr;
  const moe::MoeConfig* config = nullptr;
  const double* x = nullptr;  // [tokens, H], bf16 values
  std::int64_t tokens = 0;
  const std::int32_t* ids = nullptr;  // [tokens, top_k]
  const float* routing_weights = nullptr;
  std::int64_t top_k = 0;
  float* partial = nullptr;    // [tokens, H]
  float* magnitude = nullptr;  // [tokens, H], zeroed by the caller
};

}  // namespace mxq::tune
