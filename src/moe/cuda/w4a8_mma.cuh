// Device helpers of the W4A8 streaming GEMMs: one 128-wide K chunk (= one activation group) of
// kAcc 16x8 tiles that share their B operand, as m16n8k32 E4M3 mma — one per MX block, each
// started from zero and scaled into the fp32 sum by its block scale, then the chunk's sum by the
// activation group's scale (layouts: w4a8_layout.h). Starting every MX block from zero also keeps
// the tensor core's reduced-precision FP8 accumulation to 32 products.
#pragma once

#include <cstdint>

#include "cuda_common/mma.cuh"
#include "moe/layout/w4a8_layout.h"

namespace mxq::moe::gpu::detail {

// What one lane streams per chunk: word c of each of the chunk's 4 MX blocks of rows r and r+8 of
// every tile (uint4 component b = block b), those rows' 4 packed E8M0 scales, its token's 32
// E4M3 activations (bytes 8b..8b+7 = block b), and the activation scales of the accumulator's
// columns 2c and 2c+1.
template <int kAcc>
struct W4a8ChunkRegs {
  uint4 w[kAcc][2];
  std::uint32_t scale[kAcc][2];
  uint4 x[2];
  float xs[2];
};

__device__ __forceinline__ std::uint32_t uint4_word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// The fp32 factor of block b's scale: 2^(s - 121) (the 2^6 of the E4M3 placement folded in) on
// the fast path; 2^(s - 127) exactly (NaN for 255) on the large-scale path, whose products take
// the 2^6 separately. b is a compile-time constant after unrolling.
template <bool kLarge>
__device__ __forceinline__ float w4a8_block_factor(std::uint32_t packed, std::uint32_t biased,
                                                   int b) {
  if constexpr (kLarge) {
    return __uint_as_float(w4a8_exact_scale_bits((packed >> (8 * b)) & 0xFFU));
  } else {
    return __uint_as_float(b == 3 ? (biased >> 1) & 0x7F800000U
                                  : (biased << (23 - 8 * b)) & 0x7F800000U);
  }
}

template <int kAcc, bool kLarge>
__device__ __forceinline__ void w4a8_mma_chunk_path(const W4a8ChunkRegs<kAcc>& regs,
                                                    float (&acc)[kAcc][4]) {
  const std::uint32_t xw[8] = {regs.x[0].x, regs.x[0].y, regs.x[0].z, regs.x[0].w,
                               regs.x[1].x, regs.x[1].y, regs.x[1].z, regs.x[1].w};
  std::uint32_t biased[kAcc][2];
#pragma unroll
  for (int a = 0; a < kAcc; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) biased[a][h] = regs.scale[a][h] + kW4a8ScaleBias;
  float group[kAcc][4];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const std::uint32_t w_r = uint4_word(regs.w[a][0], b);
      const std::uint32_t w_r8 = uint4_word(regs.w[a][1], b);
      // m16n8k32 A: a0 / a1 = rows r / r+8 at k 4c..4c+3, a2 / a3 at k 16+4c..16+4c+3; the
      // activations' bytes 8b..8b+3 and 8b+4..8b+7 of this lane are B's b0 and b1 at those k.
      const std::uint32_t frag[4] = {w4a8_register_a(w_r), w4a8_register_a(w_r8),
                                     w4a8_register_b(w_r), w4a8_register_b(w_r8)};
      float t[4];
      ptx::mma_m16n8k32_e4m3_from_zero(t, frag, xw[2 * b], xw[2 * b + 1]);
      const float f_r = w4a8_block_factor<kLarge>(regs.scale[a][0], biased[a][0], b);
      const float f_r8 = w4a8_block_factor<kLarge>(regs.scale[a][1], biased[a][1], b);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float v = kLarge ? t[i] * 64.0F : t[i];
        const float f = i < 2 ? f_r : f_r8;
        group[a][i] = b == 0 ? f * v : fmaf(f, v, group[a][i]);
      }
    }
  }
#pragma unroll
  for (int a = 0; a < kAcc; ++a)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[a][i] = fmaf(regs.xs[i & 1], group[a][i], acc[a][i]);
}

// One chunk; a warp with a scale above 248 anywhere takes the exact-scale path (a vote: mma.sync
// needs the whole warp on one path).
template <int kAcc>
__device__ __forceinline__ void w4a8_mma_chunk(const W4a8ChunkRegs<kAcc>& regs,
                                               float (&acc)[kAcc][4]) {
  bool large = false;
#pragma unroll
  for (int a = 0; a < kAcc; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) large = large || w4a8_any_large_scale(regs.scale[a][h]);
  if (__any_sync(0xFFFFFFFFU, large)) {
    w4a8_mma_chunk_path<kAcc, true>(regs, acc);
  } else {
    w4a8_mma_chunk_path<kAcc, false>(regs, acc);
  }
}

}  // namespace mxq::moe::gpu::detail
