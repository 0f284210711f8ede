#include "moe/cpu/fp8_groups.h"

#include <algorithm>
#include <cstdint>

#include "mxq/formats/e4m3.h"
#include "mxq/formats/fp8_block_scale.h"

namespace mxq::moe::cpu {

void quantize_dequantize_fp8_groups(double* values, std::int64_t n) {
  for (std::int64_t g = 0; g < n; g += kActivationGroup) {
    const std::int64_t end = std::min(n, g + kActivationGroup);
    // amax as the integer max of |bits|, as quantize_fp8_groups takes it: a NaN or Inf in the
    // group makes the scale NaN, so the whole group (and every dot product using it) is NaN.
    std::uint32_t amax_bits = 0;
    for (std::int64_t i = g; i < end; ++i) {
      const std::uint32_t abs_bits =
          detail::float_bits(static_cast<float>(values[i])) & detail::kF32AbsMask;
      amax_bits = std::max(amax_bits, abs_bits);
    }
    const float scale = fp8_block_scale(detail::bits_float(amax_bits), ScaleMode::kFp32);
    for (std::int64_t i = g; i < end; ++i) {
      const std::uint8_t q =
          float_to_e4m3(static_cast<float>(values[i]) / scale, Fp8Saturation::kSatFinite);
      values[i] = static_cast<double>(e4m3_to_float(q)) * static_cast<double>(scale);
    }
  }
}

}  // namespace mxq::moe::cpu
