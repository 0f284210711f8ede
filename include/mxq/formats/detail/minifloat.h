// Round-to-nearest-even of an fp32 magnitude onto a small binary float grid (E2M1, E4M3, ...),
// by integer arithmetic on the fp32 bits. Shared by the element encoders so each format states
// only its parameters. No floating-point operations: the result cannot depend on the FPU
// rounding mode, flush-to-zero or fast-math flags, on the host or on the device.
#pragma once

#include <bit>
#include <cstdint>

#include "mxq/core/macros.h"

namespace mxq::detail {

MXQ_HD_INLINE constexpr std::uint32_t float_bits(float value) {
  return std::bit_cast<std::uint32_t>(value);
}
MXQ_HD_INLINE constexpr float bits_float(std::uint32_t bits) { return std::bit_cast<float>(bits); }

inline constexpr std::uint32_t kF32AbsMask = 0x7FFFFFFFU;
inline constexpr std::uint32_t kF32InfBits = 0x7F800000U;
inline constexpr std::uint32_t kF32QuietNanBits = 0x7FC00000U;

// Code (without sign) of the value nearest to the magnitude whose fp32 bits are `abs_bits`, on
// the grid of a binary float with `kMantissaBits` stored mantissa bits and exponent bias `kBias`
// (subnormals included, ties to even). Codes count up with the value, so a mantissa carry moves
// into the exponent field naturally. Valid for finite inputs that do not round past the
// format's largest finite code; callers handle overflow, Inf and NaN first.
template <int kMantissaBits, int kBias>
MXQ_HD_INLINE constexpr std::uint32_t round_magnitude_rne(std::uint32_t abs_bits) {
  constexpr int kDropped = 23 - kMantissaBits;  // fp32 mantissa bits below the target ulp
  // fp32 exponent field of the target's smallest normal, 2^(1 - kBias).
  constexpr std::uint32_t kMinNormalField = 127U - kBias + 1U;
  const std::uint32_t exponent_field = abs_bits >> 23;

  // Normal range: keep the top bits, add just under half an ulp plus the lowest kept bit (ties
  // to even), then re-bias the exponent by subtraction.
  const std::uint32_t lowest_kept = (abs_bits >> kDropped) & 1U;
  const std::uint32_t rounded =
      (abs_bits + ((1U << (kDropped - 1)) - 1U) + lowest_kept) >> kDropped;
  const std::uint32_t normal_code = rounded - ((127U - kBias) << kMantissaBits);

  // Subnormal range: the code is the magnitude in units of the smallest subnormal,
  // 2^(1 - kBias - kMantissaBits), rounded to nearest even. The significand (implicit bit
  // included) is shifted right by the distance between the two grids, at most 31 places (the
  // significand has 24 bits, so larger shifts give 0 and so does 31).
  const std::uint32_t significand =
      exponent_field == 0 ? (abs_bits & 0x7FFFFFU) : ((abs_bits & 0x7FFFFFU) | 0x800000U);
  const std::uint32_t effective_field = exponent_field == 0 ? 1U : exponent_field;
  const std::uint32_t grid_distance = 151U - kBias - kMantissaBits - effective_field;
  const std::uint32_t shift = grid_distance > 31U ? 31U : grid_distance;
  const std::uint32_t truncated = significand >> shift;
  const std::uint32_t remainder = significand & ((1U << shift) - 1U);
  const std::uint32_t half = 1U << (shift - 1U);
  const std::uint32_t round_up =
      (remainder > half || (remainder == half && (truncated & 1U))) ? 1U : 0U;
  const std::uint32_t subnormal_code = truncated + round_up;

  return exponent_field >= kMinNormalField ? normal_code : subnormal_code;
}

}  // namespace mxq::detail
