// E8M0 / UE8M0 power-of-two scale byte (OCP MX v1.0): byte b -> 2^(b-127) for b <= 254, so
// b = 0 is 2^-127, an fp32 subnormal (bits 0x00400000); 0xFF is NaN. No zero, no sign, no Inf.
// Decoding never uses a bare `b << 23` (that gives 0 for b = 0 and Inf for 0xFF); encoding uses
// the fp32 exponent bits, never log2f (which is wrong within an ulp of powers of two).
#pragma once

#include <cstdint>

#include "mxq/core/macros.h"
#include "mxq/formats/detail/minifloat.h"

namespace mxq {

inline constexpr std::uint8_t kE8M0One = 127;  // 2^0
inline constexpr std::uint8_t kE8M0Nan = 0xFF;

MXQ_HD_INLINE constexpr float e8m0_to_float(std::uint8_t code) {
  constexpr std::uint32_t kTwoToMinus127Bits = 0x00400000U;
  const std::uint32_t bits = code == kE8M0Nan ? detail::kF32QuietNanBits
                             : code == 0      ? kTwoToMinus127Bits
                                              : static_cast<std::uint32_t>(code) << 23;
  return detail::bits_float(bits);
}

// kFloor: the largest power of two <= |x| (CUDA cudaRoundZero); kCeil: the smallest power of
// two >= |x| (cudaRoundPosInf).
enum class E8m0Rounding { kFloor, kCeil };

// Equals __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundZero / cudaRoundPosInf) for every
// fp32 input: the sign is ignored; results clamp to [2^-127, 2^127] (0 and every |x| <= 2^-127
// give 0x00; |x| >= 2^128, i.e. +-Inf, gives 0xFE); NaN gives 0xFF.
MXQ_HD_INLINE constexpr std::uint8_t float_to_e8m0(float value, E8m0Rounding rounding) {
  const std::uint32_t abs_bits = detail::float_bits(value) & detail::kF32AbsMask;
  constexpr std::uint32_t kTwoToMinus127Bits = 0x00400000U;
  std::uint32_t exponent = abs_bits >> 23;
  if (rounding == E8m0Rounding::kCeil) {
    // Up one binade when any mantissa bit is set; at or below 2^-127 the result is 2^-127.
    exponent = abs_bits <= kTwoToMinus127Bits ? 0U : (abs_bits + 0x7FFFFFU) >> 23;
  }
  const std::uint32_t saturated = exponent > 254U ? 254U : exponent;
  return static_cast<std::uint8_t>(abs_bits > detail::kF32InfBits ? 0xFFU : saturated);
}

}  // namespace mxq
