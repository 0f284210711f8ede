// The CPU reference of one rank's expert computation (grouped GEMM1 + bias, gated activation,
// GEMM2 + bias, weighted sum over the top-k slots). Rounding points, in order (docs/moe.md):
//   1. gate/up: h = fp32(dot_fp64(x, w13 row) + bias)                (x holds bf16 values)
//   2. a = bf16(fp32(activation(g, u) evaluated in fp64))           (the bf16 intermediate)
//   3. y = fp32(dot_fp64(a, w2 row) + bias)                          (bias on TP rank 0 only)
//   4. partial[t] = sum over the token's slots k (in slot order, fp32 adds from +0) of
//      fp32(weight_k * y_k) for the slots whose expert lives on this rank.
// The layer then sums the ranks' partials in rank order in fp32 and rounds to bf16 once.
// With config.activation_quant = kFp8Group128 (W4A8), x before step 1 and a before step 3 are
// replaced by their E4M3 group quantization (cpu/moe/fp8_groups.h), dequantized exactly.
#pragma once

#include <cstdint>

#include "mxq/moe/config.h"
#include "mxq/moe/rank_weights.h"

namespace mxq::moe::cpu {

struct RankForwardInput {
  const double* x = nullptr;  // [tokens, H], bf16 values
  std::int64_t tokens = 0;
  const std::int32_t* ids = nullptr;  // [tokens, top_k]; -1 = not routed
  const float* weights = nullptr;     // [tokens, top_k]
  std::int64_t top_k = 0;
};

// How the expert GEMMs are cut into tasks: tiles of routed (token, slot) pairs and of weight rows,
// and how many threads run the tasks (0 = mxq::num_threads()). Every output element is one
// fixed-order fp64 dot product whatever the tiling, so every tiling gives bit-identical results;
// they differ only in speed (the autotuner's moe_expert_gemm tactics choose one).
struct ExpertTiling {
  std::int64_t pair_tile = 16;
  std::int64_t row_tile = 32;
  int threads = 0;
};

// One rank's expert weights as the reference reads them, in the checkpoint layout (natural
// packed FP4 rows, E8M0 scales [rows, K/32]), I_rank = width (padded or not): w13 [E_local,
// 2 width, H/2] with the gate rows at [0, width) and the up rows at [width, 2 width) of each
// expert, w2 [E_local, H, width/2]; a null bias adds nothing.
struct RankWeightsView {
  std::int64_t hidden = 0;
  std::int64_t width = 0;
  std::int64_t experts_local = 0;
  std::int64_t first_expert = 0;  // global id of local expert 0
  const std::uint8_t* w13 = nullptr;
  const std::uint8_t* w13_scale = nullptr;
  const std::uint16_t* w13_bias = nullptr;
  const std::uint8_t* w2 = nullptr;
  const std::uint8_t* w2_scale = nullptr;
  const std::uint16_t* w2_bias = nullptr;
};
RankWeightsView view_of(const MoeRankWeights& weights);

// Overwrites partial [tokens, H] with this rank's fp32 partial output and adds the magnitude of
// every contribution, |fp32(weight_k * y_k)|, to magnitude [tokens, H].
void rank_expert_forward(const RankWeightsView& weights, const MoeConfig& config,
                         const RankForwardInput& input, float* partial, float* magnitude,
                         const ExpertTiling& tiling = {});
inline void rank_expert_forward(const MoeRankWeights& weights, const MoeConfig& config,
                                const RankForwardInput& input, float* partial, float* magnitude,
                                const ExpertTiling& tiling = {}) {
  rank_expert_forward(view_of(weights), config, input, partial, magnitude, tiling);
}

}  // namespace mxq::moe::cpu
