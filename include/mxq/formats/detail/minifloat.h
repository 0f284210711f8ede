// Round-to-nearest-even of an fp32 magnitude onto a small binary float grid (E2M1, E4M3, ...),
// by integer arithmetic on the fp32 bits. Shared by the element encoders so each format states
// only its parameters. No floating-point operations: the result cannot depend on the FPU
// rounding mode, flush-to-zero or fast-math flags, on the host or on the device. No branches
// and no variable shifts either, so loops over it vectorize with plain SSE2.
#pragma once

#include <bit>
#include <cstdint>
#include <utility>

#include "mxq/core/macros.h"

namespace mxq::detail {

MXQ_HD_INLINE constexpr std::uint32_t float_bits(float value) {
  return std::bit_cast<std::uint32_t>(value);
}
MXQ_HD_INLINE constexpr float bits_float(std::uint32_t bits) { return std::bit_cast<float>(bits); }

// cond ? a : b without a branch: compilers keep ternaries on these paths as jumps, which stops
// loops over the codecs from vectorizing.
MXQ_HD_INLINE constexpr std::uint32_t select(bool cond, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t mask = 0U - static_cast<std::uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

inline constexpr std::uint32_t kF32AbsMask = 0x7FFFFFFFU;
inline constexpr std::uint32_t kF32InfBits = 0x7F800000U;
inline constexpr std::uint32_t kF32QuietNanBits = 0x7FC00000U;

// fp32 bits of the exact value odd * 2^exponent (odd < 2^23 and the result a normal float).
MXQ_HD_INLINE constexpr std::uint32_t odd_times_power_of_two_bits(std::uint32_t odd, int exponent) {
  int top = 0;  // floor(log2 odd)
  while ((odd >> (top + 1)) != 0) ++top;
  const std::uint32_t fraction = (odd - (1U << top)) << (23 - top);
  return (static_cast<std::uint32_t>(127 + top + exponent) << 23) | fraction;
}

// 1 when the magnitude lies above the k-th subnormal midpoint (k + 1/2) u of a grid whose
// smallest subnormal is u = 2^(1 - kBias - kMantissaBits), or exactly on it when that rounds up
// to the even code k + 1 (k odd). The midpoint is a compile-time constant.
template <int kMantissaBits, int kBias, std::uint32_t kK>
MXQ_HD_INLINE constexpr std::uint32_t above_subnormal_midpoint(std::uint32_t abs_bits) {
  // (k + 1/2) u = (2k + 1) * 2^(-kBias - kMantissaBits)
  constexpr std::uint32_t kMidpoint =
      odd_times_power_of_two_bits(2 * kK + 1, -kBias - kMantissaBits);
  if constexpr ((kK & 1U) != 0) return static_cast<std::uint32_t>(abs_bits >= kMidpoint);
  return static_cast<std::uint32_t>(abs_bits > kMidpoint);
}

template <int kMantissaBits, int kBias, std::uint32_t... kKs>
MXQ_HD_INLINE constexpr std::uint32_t count_subnormal_midpoints(
    std::uint32_t abs_bits, std::integer_sequence<std::uint32_t, kKs...> /*unused*/) {
  return (0U + ... + above_subnormal_midpoint<kMantissaBits, kBias, kKs>(abs_bits));
}

// Code (without sign) of the value nearest to the magnitude whose fp32 bits are `abs_bits`, on
// the grid of a binary float with `kMantissaBits` stored mantissa bits and exponent bias `kBias`
// (subnormals included, ties to the even code). Codes count up with the value, so a mantissa
// carry moves into the exponent field naturally. Valid for finite inputs that do not round
// past the format's largest finite code; callers handle overflow, Inf and NaN first (they may
// pass them: the result is then some code that the caller replaces).
template <int kMantissaBits, int kBias>
MXQ_HD_INLINE constexpr std::uint32_t round_magnitude_rne(std::uint32_t abs_bits) {
  constexpr int kDropped = 23 - kMantissaBits;  // fp32 mantissa bits below the target ulp
  // fp32 exponent field of the target's smallest normal, 2^(1 - kBias).
  constexpr std::uint32_t kMinNormalField = 127U - kBias + 1U;

  // Normal range: keep the top bits, add just under half an ulp plus the lowest kept bit (ties
  // to even), then re-bias the exponent by subtraction.
  const std::uint32_t lowest_kept = (abs_bits >> kDropped) & 1U;
  const std::uint32_t rounded =
      (abs_bits + ((1U << (kDropped - 1)) - 1U) + lowest_kept) >> kDropped;
  const std::uint32_t normal_code = rounded - ((127U - kBias) << kMantissaBits);

  // Subnormal range (below 2^(1 - kBias)): codes 0 .. 2^kMantissaBits are the multiples of the
  // smallest subnormal u (the last one is the smallest normal), so the code is the number of
  // midpoints between them that the magnitude passes (ties to even).
  const std::uint32_t subnormal_code = count_subnormal_midpoints<kMantissaBits, kBias>(
      abs_bits, std::make_integer_sequence<std::uint32_t, (1U << kMantissaBits)>{});

  return select((abs_bits >> 23) >= kMinNormalField, normal_code, subnormal_code);
}

}  // namespace mxq::detail
