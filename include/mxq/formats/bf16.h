// bfloat16 <-> float, round-to-nearest-even (NaN stays NaN, quieted). Host and device.
#pragma once

#include <bit>
#include <cstdint>

#include "mxq/core/macros.h"

namespace mxq {

MXQ_HD_INLINE constexpr float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

MXQ_HD_INLINE constexpr std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<std::uint16_t>((bits >> 16) | 0x40U);
  const std::uint32_t rounding = 0x7FFFU + ((bits >> 16) & 1U);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// Rounds a float to the nearest bf16 value and returns it as float.
MXQ_HD_INLINE constexpr float round_to_bf16(float value) {
  return bf16_to_float(float_to_bf16(value));
}

}  // namespace mxq
