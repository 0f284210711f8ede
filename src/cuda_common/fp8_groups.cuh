// Device pieces of the FP8 activation quantization in 1 x 128 groups, with the CPU quantizer's
// semantics (mxq::quantize_fp8_groups): the group's scale from the integer max of |bf16 bits|
// (mxq::fp8_block_scale), then q = E4M3-satfinite(x / scale) with IEEE division. Shared by the
// linear's and the MoE's quantize kernels.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace mxq::ptx {

// Two floats -> two E4M3 codes (first in the low byte), saturating, round-to-nearest-even: the
// sm_89+ `cvt.rn.satfinite.e4m3x2.f32`, which the codec GPU test compares with
// mxq::float_to_e4m3 on every fp32.
__device__ __forceinline__ std::uint16_t float2_to_e4m3x2(float lo, float hi) {
  return static_cast<std::uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// The larger |value| of a bf16 pair as fp32 bits. NaN and Inf order above every finite
// magnitude as integers, so a group holding one gets a NaN scale like the CPU quantizer's.
__device__ __forceinline__ std::uint32_t bf16x2_abs_max_bits(std::uint32_t pair) {
  return max((pair & 0x7FFFU) << 16, (pair >> 16 & 0x7FFFU) << 16);
}

// Four bf16 pairs (8 consecutive values, the first in the low half of pairs[0]) divided by the
// group's scale -> 8 E4M3 codes in two words, the first value in the low byte of codes[0].
__device__ __forceinline__ void bf16x8_to_e4m3(const std::uint32_t (&pairs)[4], float scale,
                                               std::uint32_t (&codes)[2]) {
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    std::uint32_t word = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t pair = pairs[2 * w + h];
      const float lo = __uint_as_float(pair << 16);
      const float hi = __uint_as_float(pair & 0xFFFF0000U);
      word |=
          static_cast<std::uint32_t>(float2_to_e4m3x2(__fdiv_rn(lo, scale), __fdiv_rn(hi, scale)))
          << (16 * h);
    }
    codes[w] = word;
  }
}

}  // namespace mxq::ptx
