#include "mxq/moe/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mxq/core/error.h"
#include "mxq/formats/bf16.h"

namespace mxq::moe {
namespace {

std::uint32_t bits_of(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Distance in bf16 steps between two bf16 values of the same sign (monotone bit order).
std::int64_t bf16_steps(float a, float b) {
  const auto key = [](float v) {
    const std::int32_t bits = static_cast<std::int32_t>(float_to_bf16(v));
    return bits & 0x8000 ? -(bits & 0x7FFF) : bits;  // sign-magnitude to a monotone line
  };
  return std::abs(static_cast<std::int64_t>(key(a)) - key(b));
}

}  // namespace

ForwardComparison compare_forward(const MoeForwardResult& a, int ranks_a, const MoeForwardResult& b,
                                  int ranks_b, std::int64_t top_k) {
  require_shape(b.output, "b.output", a.output.shape());
  require_shape(b.accumulator, "b.accumulator", a.accumulator.shape());
  const std::int64_t n = a.output.numel();
  const auto* out_a = a.output.data_as<float>();
  const auto* out_b = b.output.data_as<float>();
  const auto* acc_a = a.accumulator.data_as<float>();
  const auto* acc_b = b.accumulator.data_as<float>();
  const auto* mag_a = a.magnitude.data_as<float>();
  const auto* mag_b = b.magnitude.data_as<float>();
  const double factor = static_cast<double>(2 * top_k + ranks_a + ranks_b + 4) * 0x1.0p-24;
  ForwardComparison result;
  result.elements = n;
  for (std::int64_t i = 0; i < n; ++i) {
    if (bits_of(out_a[i]) != bits_of(out_b[i])) ++result.bitwise_different;
    const bool nan_a = std::isnan(out_a[i]);
    const bool nan_b = std::isnan(out_b[i]);
    if (nan_a || nan_b) {
      if (nan_a != nan_b) ++result.nan_mismatches;
      continue;
    }
    result.max_abs_difference =
        std::max(result.max_abs_difference, std::fabs(static_cast<double>(out_a[i]) - out_b[i]));
    if (bf16_steps(out_a[i], out_b[i]) > 1) ++result.beyond_one_ulp;
    const double difference = std::fabs(static_cast<double>(acc_a[i]) - acc_b[i]);
    // The magnitudes are themselves fp32 sums: allow them 1% slack; 1e-30 covers all-zero rows.
    const double bound = factor * 1.01 * std::max<double>(mag_a[i], mag_b[i]) + 1e-30;
    result.max_bound_ratio = std::max(result.max_bound_ratio, difference / bound);
    if (difference > bound) ++result.beyond_bound;
  }
  return result;
}

double normalized_error(const TensorView& out, const TensorView& ref,
                        std::int64_t* nan_mismatches) {
  require_dtype(out, "out", DType::kF32);
  require_dtype(ref, "ref", DType::kF32);
  require_shape(out, "out", ref.shape());
  require_contiguous(out, "out");
  require_contiguous(ref, "ref");
  // A host function: copy a device output to the host first.
  require_device(out, "out", Device::cpu());
  require_device(ref, "ref", Device::cpu());
  const float* a = out.data_as<float>();
  const float* b = ref.data_as<float>();
  double num = 0.0;
  double den = 0.0;
  std::int64_t mismatches = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      mismatches += std::isnan(a[i]) != std::isnan(b[i]);
      continue;
    }
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (nan_mismatches != nullptr) *nan_mismatches = mismatches;
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace mxq::moe
