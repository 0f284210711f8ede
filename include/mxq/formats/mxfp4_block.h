// MXFP4 (OCP MX v1.0): blocks of 32 E2M1 elements along the last axis sharing one E8M0 scale
// X; element i decodes to X * e2m1(code_i). Two scale rules, both exact functions of the block's
// amax = max |x_i| (written amax = 2^E * m, 1 <= m < 2):
//   floor (default, OCP MX v1.0 section 6.3): X = 2^(E - 2); x/X lies in [4, 8) at the block
//        max, so elements above 6X are clamped to +-6X (the E2M1 encoder saturates).
//   ceil: X = 2^ceil(log2(amax / 6)) = 2^(E - 2 + [m > 1.5]); |x/X| <= 6, never clamps.
// X is clamped below to 2^-127 (scale byte 0x00). An all-zero block (+-0 only) gets scale 0x00
// and +0 codes. A block holding a NaN or an Inf gets scale 0xFF (NaN) and all-zero codes; it
// dequantizes to NaN everywhere. Elements are RNE(x / X) in E2M1, packed two per byte, element
// 2j in the low nibble.
//
// This header holds the scalar and per-block codec (host and device, no framework headers, so
// CUDA kernels include it); mxfp4.h adds the tensor-level API.
#pragma once

#include <cstdint>

#include "mxq/core/macros.h"
#include "mxq/formats/e2m1.h"
#include "mxq/formats/e8m0.h"

namespace mxq {

inline constexpr int kMxfp4BlockSize = 32;
inline constexpr int kMxfp4PackedBlockBytes = kMxfp4BlockSize / 2;

enum class ScaleRule { kFloor, kCeil };

// Scale byte for a block with maximum magnitude `amax` (its sign is ignored). NaN or Inf ->
// 0xFF. Pure exponent-bit arithmetic, so it is exact for every fp32 amax, subnormals included.
MXQ_HD_INLINE constexpr std::uint8_t mxfp4_scale_code(float amax, ScaleRule rule) {
  const std::uint32_t abs_bits = detail::float_bits(amax) & detail::kF32AbsMask;
  const std::int32_t exponent_field = static_cast<std::int32_t>(abs_bits >> 23);
  // floor(log2 amax) + 127 - 2 for normal amax; a subnormal amax (field 0) is below 2^-126, so
  // every rule gives X <= 2^-128, clamped to 2^-127.
  std::int32_t code = exponent_field - 2;
  // ceil wants the smallest X with 6X >= amax = m * 2^E. X = 2^(E-2) gives 6X = 1.5 * 2^E,
  // enough iff m <= 1.5 (mantissa field <= 0x400000); otherwise 2^(E-1) (6X = 3 * 2^E).
  if (rule == ScaleRule::kCeil && (abs_bits & 0x7FFFFFU) > 0x400000U) code += 1;
  if (exponent_field == 0 || code < 0) code = 0;
  return abs_bits >= detail::kF32InfBits ? kE8M0Nan : static_cast<std::uint8_t>(code);
}

// 1/X for a finite scale byte, exact (2^(127-code); code 254 needs the subnormal 2^-127).
MXQ_HD_INLINE constexpr float mxfp4_inverse_scale(std::uint8_t code) {
  return detail::bits_float(code == 254 ? 0x00400000U
                                        : static_cast<std::uint32_t>(254 - code) << 23);
}

// Quantizes one block of 32 floats into 16 packed bytes and one scale byte.
MXQ_HD_INLINE constexpr void quantize_mxfp4_block(const float* x32, std::uint8_t* packed16,
                                                  std::uint8_t* scale,
                                                  ScaleRule rule = ScaleRule::kFloor) {
  // Integer max of |bits|: orders finite magnitudes like floats, and Inf/NaN compare above
  // every finite value, so one reduction finds both amax and "block is not finite".
  std::uint32_t amax_bits = 0;
  for (int i = 0; i < kMxfp4BlockSize; ++i) {
    const std::uint32_t abs_bits = detail::float_bits(x32[i]) & detail::kF32AbsMask;
    amax_bits = abs_bits > amax_bits ? abs_bits : amax_bits;
  }
  const bool finite = amax_bits < detail::kF32InfBits;
  const std::uint8_t code = mxfp4_scale_code(detail::bits_float(amax_bits), rule);
  *scale = code;
  if (!finite || amax_bits == 0) {  // NaN block or all-zero block: +0 codes
    for (int j = 0; j < kMxfp4PackedBlockBytes; ++j) packed16[j] = 0;
    return;
  }
  // x * 2^(127-code) is exactly x / X (or rounds only below 2^-126, where E2M1 gives 0 anyway).
  const float inverse = mxfp4_inverse_scale(code);
  for (int j = 0; j < kMxfp4PackedBlockBytes; ++j) {
    packed16[j] =
        pack_e2m1(float_to_e2m1(x32[2 * j] * inverse), float_to_e2m1(x32[2 * j + 1] * inverse));
  }
}

// Dequantizes one block: out32[i] = e2m1(code_i) * 2^(scale-127); scale 0xFF gives NaN for all
// 32. The product is exact unless it exceeds FLT_MAX (only for scales >= 2^126), then it is Inf.
MXQ_HD_INLINE constexpr void dequantize_mxfp4_block(const std::uint8_t* packed16,
                                                    std::uint8_t scale, float* out32) {
  const float x = e8m0_to_float(scale);
  for (int j = 0; j < kMxfp4PackedBlockBytes; ++j) {
    out32[2 * j] = e2m1_to_float(e2m1_low(packed16[j])) * x;
    out32[2 * j + 1] = e2m1_to_float(e2m1_high(packed16[j])) * x;
  }
}

}  // namespace mxq
