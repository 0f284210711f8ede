// Device helpers for MXFP4 x bf16 tensor-core products: decoding packed E2M1 bytes straight
// into bf16x2 mma operands with the block's E8M0 scale folded in, and the m16n8k16 mma.
#pragma once

#include <cstdint>

namespace mxq::moe::cuda::detail {

// One byte = two E2M1 codes (low nibble first) -> bf16x2 bits (low nibble in the low half),
// each value = e2m1 * 2^-126. Placing the code's 3 magnitude bits at bf16 bits 6..8 reads them
// as exponent/mantissa with bias 127 instead of 1, so every code (the subnormal 0.5 included)
// is exact after one multiplication by 2^126; that factor is folded into the scale below.
__device__ __forceinline__ std::uint32_t e2m1x2_to_bf16x2_unscaled(std::uint32_t byte) {
  const std::uint32_t u = byte * 0x1001U;  // low nibble at bits 0..3, high nibble at 16..19
  return ((u << 6) & 0x01C001C0U) | ((u << 12) & 0x80008000U);
}

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

__device__ __forceinline__ ScaleFactors e8m0_scale_factors(std::uint32_t scale) {
  ScaleFactors f;
  if (scale == 0xFFU) {  // NaN scale: the whole block decodes to NaN
    f.first = 0x7FC07FC0U;
    f.second = 0;
  } else if (scale <= 128U) {
    const std::uint32_t bits = (scale + 126U) << 7;
    f.first = bits | (bits << 16);
    f.second = 0;
  } else {
    f.first = 0x7E807E80U;                  // 2^126
    const std::uint32_t bits = scale << 7;  // 2^(scale - 127)
    f.second = bits | (bits << 16);
  }
  return f;
}

__device__ __forceinline__ std::uint32_t decode_e2m1x2(std::uint32_t byte, ScaleFactors f) {
  std::uint32_t v = bf16x2_mul(e2m1x2_to_bf16x2_unscaled(byte), f.first);
  if (f.second != 0) v = bf16x2_mul(v, f.second);
  return v;
}

// D = A(16x16 bf16, row) * B(16x8 bf16, col) + D, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                               std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-byte load that bypasses L1 (weights are streamed once).
__device__ __forceinline__ uint4 load_stream_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Halfword s (0..7) of a 16-byte chunk; s is a compile-time constant after unrolling.
__device__ __forceinline__ std::uint32_t halfword(const uint4& v, int s) {
  const std::uint32_t word = (s >> 1) == 0 ? v.x : (s >> 1) == 1 ? v.y : (s >> 1) == 2 ? v.z : v.w;
  return (s & 1) ? (word >> 16) : (word & 0xFFFFU);
}

}  // namespace mxq::moe::cuda::detail
