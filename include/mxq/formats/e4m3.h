// FP8 E4M3 ("e4m3fn", OFP8): s eeee mmm, bias 7, largest finite 448 (0x7E), NaN = 0x7F / 0xFF,
// no Inf. Encoding is round-to-nearest-even; the saturating mode equals CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) and the non-saturating mode
// __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3), for every fp32 input.
#pragma once

#include <cstdint>

#include "mxq/core/macros.h"
#include "mxq/formats/detail/minifloat.h"

namespace mxq {

inline constexpr float kE4M3Max = 448.0F;

// What happens to magnitudes above 464 (448 plus half an ulp; 464 itself is a tie that rounds
// to 448) and to +-Inf: kSatFinite clamps them to +-448 (what quantizers use), kNoSat makes
// them NaN (0x7F | sign).
enum class Fp8Saturation { kSatFinite, kNoSat };

// Exact. NaN codes (0x7F, 0xFF) decode to the positive quiet NaN 0x7FC00000.
MXQ_HD_INLINE constexpr float e4m3_to_float(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80U) << 24;
  const std::uint32_t exponent = (code >> 3) & 0xFU;
  const std::uint32_t mantissa = code & 0x7U;
  const std::uint32_t normal = ((exponent + 120U) << 23) | (mantissa << 20);
  // Subnormal: m * 2^-9, exact in fp32.
  const std::uint32_t subnormal = detail::float_bits(static_cast<float>(mantissa) * 0.001953125F);
  const std::uint32_t magnitude = detail::select(exponent == 0, subnormal, normal);
  return detail::bits_float(
      detail::select((code & 0x7FU) == 0x7FU, detail::kF32QuietNanBits, sign | magnitude));
}

// NaN of either sign -> 0x7F (CUDA canonicalises NaN to +NaN before converting).
MXQ_HD_INLINE constexpr std::uint8_t float_to_e4m3(
    float value, Fp8Saturation saturation = Fp8Saturation::kSatFinite) {
  const std::uint32_t bits = detail::float_bits(value);
  const std::uint32_t abs_bits = bits & detail::kF32AbsMask;
  const std::uint32_t sign = (bits >> 24) & 0x80U;
  constexpr std::uint32_t kOverflowBits = 0x43E80000U;  // 464.0f
  const std::uint32_t overflow_code = saturation == Fp8Saturation::kSatFinite ? 0x7EU : 0x7FU;
  const std::uint32_t magnitude = detail::select(abs_bits > kOverflowBits, overflow_code,
                                                 detail::round_magnitude_rne<3, 7>(abs_bits));
  const std::uint32_t code =
      detail::select(abs_bits > detail::kF32InfBits, 0x7FU, sign | magnitude);
  return static_cast<std::uint8_t>(code);
}

// E2M1 -> E4M3 is exact for all 16 codes (-0.0 -> 0x80): with s = c>>3, e = (c>>1)&3,
// m = c&1: e = 0 gives 0x00 or 0x30 (0.5 = 2^-1); e > 0 gives exponent e+6, mantissa m<<2.
MXQ_HD_INLINE constexpr std::uint8_t e2m1_to_e4m3(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x8U) << 4;
  const std::uint32_t exponent = (code >> 1) & 0x3U;
  const std::uint32_t mantissa = code & 0x1U;
  const std::uint32_t magnitude =
      exponent == 0 ? (mantissa != 0 ? 0x30U : 0U) : (((exponent + 6U) << 3) | (mantissa << 2));
  return static_cast<std::uint8_t>(sign | magnitude);
}

}  // namespace mxq
