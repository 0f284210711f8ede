// E2M1 (FP4): code c, sign s = c >> 3, value = (-1)^s * {0, 0.5, 1, 1.5, 2, 3, 4, 6}[c & 7];
// code 8 is -0.0. Two codes per byte: element 2j in the low nibble, 2j+1 in the high nibble.
// Encoding is round-to-nearest-even with saturation to +-6 and must equal CUDA's
// __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest) for every fp32 input (NaN -> 0x7).
#pragma once

#include <cstdint>

#include "mxq/core/macros.h"

namespace mxq {

MXQ_HD_INLINE constexpr float e2m1_to_float(std::uint8_t code);
MXQ_HD_INLINE constexpr std::uint8_t float_to_e2m1(float value);

MXQ_HD_INLINE constexpr std::uint8_t pack_e2m1(std::uint8_t low, std::uint8_t high) {
  return static_cast<std::uint8_t>((low & 0xF) | ((high & 0xF) << 4));
}
MXQ_HD_INLINE constexpr std::uint8_t e2m1_low(std::uint8_t byte) { return byte & 0xF; }
MXQ_HD_INLINE constexpr std::uint8_t e2m1_high(std::uint8_t byte) { return byte >> 4; }

}  // namespace mxq
