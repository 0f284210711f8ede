// Scales of block-scaled FP8 (DeepSeek-V3 style): one fp32 scale per block,
//   scale = max(amax, 1e-4) / 448            (ScaleMode::kFp32)
//   scale = 2^ceil(log2(that))               (ScaleMode::kUe8m0: rounded up to a power of two)
// Host and device, no framework headers, so CUDA kernels include it; fp8_block.h has the
// tensor-level quantizers.
#pragma once

#include <cstdint>

#include "mxq/core/macros.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/e8m0.h"

namespace mxq {

enum class ScaleMode { kFp32, kUe8m0 };

inline constexpr float kFp8AmaxFloor = 1e-4F;

// Scale of one block from its amax (|x| max, sign ignored). Non-finite amax -> NaN.
MXQ_HD_INLINE constexpr float fp8_block_scale(float amax, ScaleMode mode) {
  const std::uint32_t abs_bits = detail::float_bits(amax) & detail::kF32AbsMask;
  if (abs_bits >= detail::kF32InfBits) return detail::bits_float(detail::kF32QuietNanBits);
  const float magnitude = detail::bits_float(abs_bits);
  const float scale = (magnitude > kFp8AmaxFloor ? magnitude : kFp8AmaxFloor) / kE4M3Max;
  // scale lies in [2.2e-7, 7.6e35]: a normal float, so the E8M0 ceil is exact and never clamps.
  return mode == ScaleMode::kUe8m0 ? e8m0_to_float(float_to_e8m0(scale, E8m0Rounding::kCeil))
                                   : scale;
}

}  // namespace mxq
