// The epilogue of the wgmma GEMMs (both activation precisions): a consumer lane's accumulators of
// one work tile to the GEMM outputs, through gemm_common.cuh's rounding (GEMM1: biases + SwiGLU
// variant -> bf16 activations; GEMM2: bias -> fp32 rows).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>

#include "gemm_common.cuh"

namespace mxq::moe::gpu::detail {

// Calls f(i_lo, i_hi, col) for each slot column col < rows of lane (r, c)'s accumulators: acc[i_lo]
// is A row 16 warp + r, acc[i_hi] row 16 warp + r + 8 (the wgmma accumulator layout: acc[4 i + j]
// is column 8 i + 2 c + (j & 1), row + 8 for j >= 2).
template <int kN, typename F>
__device__ __forceinline__ void for_each_tile_column(int c, int rows, F&& f) {
#pragma unroll
  for (int i = 0; i < kN / 8; ++i)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int col = 8 * i + 2 * c + t;
      if (col < rows) f(4 * i + t, 4 * i + 2 + t, col);
    }
}

// Stores lane (r, c)'s outputs of `tile`. GEMM1: its A rows r and r + 8 are the gate and up rows
// of channel `first_row`, written at gemm1_column<kWgmmaOrder> of each slot's activation row;
// GEMM2: they are w2 rows first_row and first_row + 8. Every output of a lane is one channel
// (GEMM1) or one of two rows (GEMM2), so the biases load once.
template <bool kGemm1, int kN, bool kWgmmaOrder>
__device__ __forceinline__ void store_wgmma_tile(const GemmArgs& args, const WorkTile& tile,
                                                 const float (&acc)[kN / 2], int first_row, int c) {
  const int matrix_rows = kGemm1 ? args.w.inter : args.w.hidden;
  if constexpr (kGemm1) {
    if (first_row >= matrix_rows) return;
    const Gemm1Bias bias = load_gemm1_bias(args, tile.expert, first_row);
    __nv_bfloat16* const out = args.ws.act + gemm1_column<kWgmmaOrder>(first_row);
    const float alpha = args.p.swiglu_alpha;
    const float limit = args.p.swiglu_limit;
    with_activation(args.p.activation, [&](auto kind) {
      for_each_tile_column<kN>(c, tile.rows, [&](int gate, int up, int col) {
        out[static_cast<std::size_t>(tile.slot0 + col) * args.w.inter] =
            __float2bfloat16_rn(activate<decltype(kind)::value>(acc[gate] + bias.gate,
                                                                acc[up] + bias.up, alpha, limit));
      });
    });
  } else {
    const float bias_lo =
        first_row < matrix_rows ? load_gemm2_bias(args, tile.expert, first_row) : 0.0F;
    const float bias_hi =
        first_row + 8 < matrix_rows ? load_gemm2_bias(args, tile.expert, first_row + 8) : 0.0F;
    float* const out = args.ws.y + first_row;
    for_each_tile_column<kN>(c, tile.rows, [&](int lo, int hi, int col) {
      float* const y = out + static_cast<std::size_t>(tile.slot0 + col) * args.w.hidden;
      if (first_row < matrix_rows) y[0] = acc[lo] + bias_lo;
      if (first_row + 8 < matrix_rows) y[8] = acc[hi] + bias_hi;
    });
  }
}

// Stores a tile whose slots two instructions computed (gemm_wgmma.cuh's wide tiles): its first kN
// slots from `acc`, the rest (at most kExtra) from `acc_extra`. With kExtra == 0, `acc` holds the
// whole tile and `acc_extra` is not read.
template <bool kGemm1, int kN, int kExtra, bool kWgmmaOrder>
__device__ __forceinline__ void store_wgmma_tile_parts(
    const GemmArgs& args, const WorkTile& tile, const float (&acc)[kN / 2],
    const float (&acc_extra)[kExtra > 0 ? kExtra / 2 : 1], int first_row, int c) {
  if constexpr (kExtra > 0) {
    store_wgmma_tile<kGemm1, kN, kWgmmaOrder>(args, WorkTile{tile.expert, tile.slot0, kN}, acc,
                                              first_row, c);
    store_wgmma_tile<kGemm1, kExtra, kWgmmaOrder>(
        args, WorkTile{tile.expert, tile.slot0 + kN, tile.rows - kN}, acc_extra, first_row, c);
  } else {
    store_wgmma_tile<kGemm1, kN, kWgmmaOrder>(args, tile, acc, first_row, c);
  }
}

}  // namespace mxq::moe::gpu::detail
