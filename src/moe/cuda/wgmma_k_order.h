// The K order of the activations in the wgmma GEMMs (GemmVariant::kPrefillWgmma), shared by the
// host (tests) and the device (the permutation kernel and the GEMM1 epilogue).
//
// wgmma takes its B operand (the activations) from shared memory in the instruction's own K
// order, and its A operand (the decoded weights) from registers in the mma.m16n8k16 fragment
// layout: lane (r, c) holds K 2c, 2c+1 (registers 0, 1) and 2c+8, 2c+9 (registers 2, 3) of each
// 16-wide k-step. A lane decodes one packed word of an MX block: 8 consecutive weights 8c..8c+7,
// i.e. the bf16x2 pairs P = 4c + i (i = 0..3) of the block's 16 pairs. Pair i = 2h + u of the
// word goes to k-step h of the block at K 2c + 8u; so the activations of an MX block are stored
// with pair P = 4c + 2h + u at position L = 8h + 4u + c. The permutation stays inside each
// 32-wide MX block, so rows keep their length (H or I, multiples of 32) and their alignment.
#pragma once

#include "mxq/core/macros.h"

namespace mxq::moe::gpu::detail {

// Position of bf16x2 pair `pair` (0..15) of an MX block in the wgmma K order.
MXQ_HD_INLINE constexpr int wgmma_pair_position(int pair) {
  const int c = pair >> 2;
  const int h = (pair >> 1) & 1;
  const int u = pair & 1;
  return (h << 3) | (u << 2) | c;
}

// The pair stored at `position` (0..15) of an MX block: the inverse of wgmma_pair_position.
MXQ_HD_INLINE constexpr int wgmma_position_pair(int position) {
  const int h = position >> 3;
  const int u = (position >> 2) & 1;
  const int c = position & 3;
  return (c << 2) | (h << 1) | u;
}

// Position of activation element k (any k >= 0) in the wgmma K order.
MXQ_HD_INLINE constexpr int wgmma_k_position(int k) {
  return (k & ~31) | (wgmma_pair_position((k & 31) >> 1) << 1) | (k & 1);
}

}  // namespace mxq::moe::gpu::detail
