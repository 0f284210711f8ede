// Token -> expert routing for the MoE layer (CPU reference).
#pragma once

#include <cstdint>

#include "mxq/core/tensor.h"

namespace mxq::moe {

// Slot k of token t sends the token to expert ids[t, k] with weight weights[t, k].
// ids = -1 marks a slot routed nowhere: it contributes nothing. The router gives all k slots of a
// token whose input row is not finite -1 (and NaN weights: that token's output is NaN); a
// caller's routing may use -1 for a dropped slot of any token.
struct Routing {
  Tensor ids;      // i32 [T, K]
  Tensor weights;  // f32 [T, K]
};

// gpt-oss routing of x (f32 [T, H], bf16 values; rows flagged in `finite_rows` only):
//   logit_e = fp32(sum_h x_h * Wr[e, h] + br[e])   (products exact, summed in fp64 in the order
//                                                   of mxq's 8-lane dot product, then rounded)
//   top-k by logit, larger first; equal logits: the lower expert index wins; NaN logits rank
//   below every number;
//   weights = fp32(softmax over the k selected logits), computed in fp64.
// router_weight: bf16 [E, H]; router_bias: bf16 [E] or an empty view (no bias).
// finite_rows: T bytes, 1 when the token's input row is finite (others get ids -1, weights NaN).
Routing route_topk_softmax(const TensorView& x, const std::uint8_t* finite_rows,
                           const TensorView& router_weight, const TensorView& router_bias,
                           std::int64_t top_k);

// Checks caller-provided routing: i32 ids and f32 weights of shape [T, K], ids in [0, E)
// (or -1). Throws mxq::Error naming the argument.
void validate_routing(const Routing& routing, std::int64_t tokens, std::int64_t top_k,
                      std::int64_t num_experts);

}  // namespace mxq::moe
