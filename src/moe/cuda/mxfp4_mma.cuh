// Device helpers for MXFP4 x bf16 tensor-core products: decoding packed E2M1 words (in the
// device layout of mxfp4_device_layout.h) straight into bf16x2 mma operands with the block's
// E8M0 scale folded in, and the m16n8k16 mma.
#pragma once

#include <cstdint>

#include "cuda_common/mma.cuh"
#include "moe/layout/mxfp4_device_layout.h"

namespace mxq::moe::gpu::detail {

// bf16x2 multiply (exact here: one factor is a power of two).
__device__ __forceinline__ std::uint32_t bf16x2_mul(std::uint32_t a, std::uint32_t b) {
  std::uint32_t out;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
}

// The two bf16x2 factors that turn e2m1 * 2^-126 into e2m1 * 2^(scale - 127):
// 2^(scale - 1) fits bf16 for scale <= 128; larger scales take a second factor.
struct ScaleFactors {
  std::uint32_t first;
  std::uint32_t second;  // 0 when one factor suffices
};

// Branch-free, every scale byte (NaN 255 included): the decode's slow path, taken by a warp only
// when one of its lanes holds a scale above 128 (warp_any_wide_scale).
__device__ __forceinline__ ScaleFactors e8m0_scale_factors(std::uint32_t scale) {
  const std::uint32_t narrow = ((scale + 126U) << 7) * 0x10001U;  // 2^(scale - 1), scale <= 128
  const std::uint32_t wide = (scale << 7) * 0x10001U;             // 2^(scale - 127)
  ScaleFactors f;
  f.first = scale <= 128U ? narrow : (scale == 0xFFU ? 0x7FC07FC0U : 0x7E807E80U);
  f.second = scale > 128U && scale != 0xFFU ? wide : 0U;
  return f;
}

// The factors of a scale for the decode path kWideScales (false: every scale of the warp <= 128).
template <bool kWideScales>
__device__ __forceinline__ ScaleFactors scale_factors(std::uint32_t scale) {
  if constexpr (kWideScales) {
    return e8m0_scale_factors(scale);
  } else {
    return {narrow_scale_factor(scale), 0U};
  }
}

// The 4 registers of a word in the device layout (mxfp4_device_layout.h), scaled:
// out[i] = (e_{2i}, e_{2i+1}) * 2^(scale - 127), the natural bf16x2 pairs, so a register pairs
// with the activations' bf16x2 word of the same elements as it lies in memory.
template <bool kWideScales>
__device__ __forceinline__ void decode_e2m1x8(std::uint32_t word, ScaleFactors f,
                                              std::uint32_t (&out)[4]) {
  out[0] = bf16x2_mul(device_word_register<0>(word), f.first);
  out[1] = bf16x2_mul(device_word_register<1>(word), f.first);
  out[2] = bf16x2_mul(device_word_register<2>(word), f.first);
  out[3] = bf16x2_mul(device_word_register<3>(word), f.first);
  if constexpr (kWideScales) {
    if (f.second != 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = bf16x2_mul(out[i], f.second);
    }
  }
}

// Decodes one word of the MX blocks of rows r (word_r) and r+8 (word_r8) of a 16-row mma tile
// into the A registers of two k-steps. Why a word pair gives two: lane (r, c)'s m16n8k16 A
// registers are rows r (a0, a2) and r+8 (a1, a3) at k pairs (2c, 2c+1) (a0, a1) and
// (2c+8, 2c+9) (a2, a3), i.e. 2 bf16x2 of each row per k-step, and a word decodes to 4 bf16x2 of
// its row: registers 2h, 2h+1 of both rows make k-step h (the k order of both operands is
// permuted to match; mma_mx_chunk).
template <bool kWideScales>
__device__ __forceinline__ void decode_word_pair_fragments(std::uint32_t word_r,
                                                           std::uint32_t word_r8, ScaleFactors f_r,
                                                           ScaleFactors f_r8,
                                                           std::uint32_t (&frag_k0)[4],
                                                           std::uint32_t (&frag_k1)[4]) {
  std::uint32_t lo[4];  // row r
  std::uint32_t hi[4];  // row r + 8
  decode_e2m1x8<kWideScales>(word_r, f_r, lo);
  decode_e2m1x8<kWideScales>(word_r8, f_r8, hi);
  frag_k0[0] = lo[0];
  frag_k0[1] = hi[0];
  frag_k0[2] = lo[1];
  frag_k0[3] = hi[1];
  frag_k1[0] = lo[2];
  frag_k1[1] = hi[2];
  frag_k1[2] = lo[3];
  frag_k1[3] = hi[3];
}

// The E8M0 scales of one row's 4 MX blocks of 128-wide K chunk `chunk`, block b in byte b: one
// aligned word of the device scale layout (moe_scale_pitch: rows padded with zeros to 16 bytes,
// so blocks past K read 0, and their weights are zero too).
__device__ __forceinline__ std::uint32_t load_chunk_scales(const std::uint8_t* row, int chunk) {
  return __ldg(reinterpret_cast<const std::uint32_t*>(row) + chunk);
}

// Whether any lane of the warp holds a scale byte above 128 (E8M0 129..254 = 2^2..2^127, which
// need the two-multiply decode, or 255 = NaN), so the warp must take the slow path
// (scale_factors<true>, decode_e2m1x8<true>). A warp vote because the choice must be uniform:
// mma.sync needs the whole warp on one path. The scales are bytes; written as one unsigned
// range test (ptxas kept GEMM1's streaming kernel at 127 registers this way; `> 128` spilled).
template <int kAcc>
__device__ __forceinline__ bool warp_any_wide_scale(const std::uint32_t (&scale)[kAcc][2]) {
  bool wide = false;
#pragma unroll
  for (int a = 0; a < kAcc; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) wide = wide || (scale[a][h] - 129U < 127U);
  return __any_sync(0xFFFFFFFFU, wide);
}

// One 128-wide K chunk of kAcc 16x8 weight tiles times kNT 8-slot token tiles, the weight tiles
// sharing their B operands (GEMM1: gate and up rows of the same channels) and the token tiles
// their A operands (each fragment is decoded once for all of them): lane (r = lane/4, c = lane%4)
// holds the 16-byte MX block c of rows r (wv[a][0]) and r+8 (wv[a][1]) of tile a with their E8M0
// scales, and elements 32c..32c+31 of token r of each token tile (xv[n], B column lane/4).
// acc[a * kNT + n]: D[r][2c], D[r][2c+1], D[r+8][2c], D[r+8][2c+1] of weight tile a and token
// tile n. Word j of a block holds elements 8j..8j+7 and gives k-steps 2j, 2j+1: k-step h takes
// registers 2h, 2h+1 (elements 8j+4h..8j+4h+3) as the mma's k pairs (2c, 2c+1) and (2c+8, 2c+9),
// and the activation words 4j+2h, 4j+2h+1 holding the same elements as B. Each accumulator sees
// the same mma sequence whatever kNT is. Activation vector j (xv[n][j]) is read only in word j,
// and `after_word(j)` runs once word j's mma are issued: a caller may then reuse xv[n][j]'s
// registers (the rolling activation stream of the 16-slot kernels loads the next chunk's vector
// j into them).
struct NoWordHook {
  __device__ __forceinline__ void operator()(int /*word*/) const {}
};
template <int kAcc, bool kWideScales, int kNT = 1, class AfterWord = NoWordHook>
__device__ __forceinline__ void mma_mx_chunk(const uint4 (&wv)[kAcc][2],
                                             const std::uint32_t (&sc)[kAcc][2],
                                             const uint4 (&xv)[kNT][4], float (&acc)[kAcc * kNT][4],
                                             AfterWord after_word = {}) {
  ScaleFactors f[kAcc][2];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    f[a][0] = scale_factors<kWideScales>(sc[a][0]);
    f[a][1] = scale_factors<kWideScales>(sc[a][1]);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    std::uint32_t xw[kNT][4];  // vector j of each token tile
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      xw[n][0] = xv[n][j].x;
      xw[n][1] = xv[n][j].y;
      xw[n][2] = xv[n][j].z;
      xw[n][3] = xv[n][j].w;
    }
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const std::uint32_t w0[4] = {wv[a][0].x, wv[a][0].y, wv[a][0].z, wv[a][0].w};
      const std::uint32_t w1[4] = {wv[a][1].x, wv[a][1].y, wv[a][1].z, wv[a][1].w};
      std::uint32_t frag[2][4];  // [k-step][A registers]
      decode_word_pair_fragments<kWideScales>(w0[j], w1[j], f[a][0], f[a][1], frag[0], frag[1]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int n = 0; n < kNT; ++n)
          ptx::mma_m16n8k16_bf16(acc[a * kNT + n], frag[h], xw[n][2 * h], xw[n][2 * h + 1]);
    }
    after_word(j);
  }
}

// 16-byte load that bypasses L1 (weights are streamed once).
__device__ __forceinline__ uint4 load_stream_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace mxq::moe::gpu::detail
