// E2M1 (FP4): code c, sign s = c >> 3, value = (-1)^s * {0, 0.5, 1, 1.5, 2, 3, 4, 6}[c & 7];
// code 8 is -0.0. Two codes per byte: element 2j in the low nibble, 2j+1 in the high nibble.
// Encoding is round-to-nearest-even with saturation to +-6 and must equal CUDA's
// __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) for every fp32 input (NaN -> 0x7).
#pragma once

#include <cstdint>

#include "mxq/core/macros.h"
#include "mxq/formats/detail/minifloat.h"

namespace mxq {

inline constexpr float kE2M1Max = 6.0F;

// Exact: every E2M1 value is an fp32 value. Built from the bit fields (no table), so it costs
// the same in a CUDA kernel as on the host.
MXQ_HD_INLINE constexpr float e2m1_to_float(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x8U) << 28;
  const std::uint32_t exponent = (code >> 1) & 0x3U;
  const std::uint32_t mantissa = code & 0x1U;
  // e = 0: 0 or 0.5 (0x3F000000); e > 0: 2^(e-1) * (1 + m/2).
  const std::uint32_t magnitude = detail::select(exponent == 0, mantissa * 0x3F000000U,
                                                 ((exponent + 126U) << 23) | (mantissa << 22));
  return detail::bits_float(sign | magnitude);
}

// Round to nearest even; |x| > 6 and +-Inf saturate to +-6; the sign is kept on zero results
// (-0.1 -> 0x8); NaN of either sign -> 0x7 (+6), as CUDA does. The magnitude code counts the
// midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 below |x| (on the fp32 bits, which order like
// the values); a tie counts only when it rounds up to the even code. NaN bits lie above every
// midpoint, so NaN counts 7.
MXQ_HD_INLINE constexpr std::uint8_t float_to_e2m1(float value) {
  const std::uint32_t bits = detail::float_bits(value);
  const std::uint32_t abs_bits = bits & detail::kF32AbsMask;
  // abs_bits > m counts a midpoint whose tie rounds down, abs_bits >= m one whose tie rounds up.
  const std::uint32_t magnitude = static_cast<std::uint32_t>(abs_bits > 0x3E800000U)     // 0.25
                                  + static_cast<std::uint32_t>(abs_bits >= 0x3F400000U)  // 0.75
                                  + static_cast<std::uint32_t>(abs_bits > 0x3FA00000U)   // 1.25
                                  + static_cast<std::uint32_t>(abs_bits >= 0x3FE00000U)  // 1.75
                                  + static_cast<std::uint32_t>(abs_bits > 0x40200000U)   // 2.5
                                  + static_cast<std::uint32_t>(abs_bits >= 0x40600000U)  // 3.5
                                  + static_cast<std::uint32_t>(abs_bits > 0x40A00000U);  // 5.0
  const std::uint32_t sign =
      detail::select(abs_bits > detail::kF32InfBits, 0U, (bits >> 28) & 0x8U);
  return static_cast<std::uint8_t>(sign | magnitude);
}

MXQ_HD_INLINE constexpr std::uint8_t pack_e2m1(std::uint8_t low, std::uint8_t high) {
  return static_cast<std::uint8_t>((low & 0xF) | ((high & 0xF) << 4));
}
MXQ_HD_INLINE constexpr std::uint8_t e2m1_low(std::uint8_t byte) { return byte & 0xF; }
MXQ_HD_INLINE constexpr std::uint8_t e2m1_high(std::uint8_t byte) { return byte >> 4; }

}  // namespace mxq
