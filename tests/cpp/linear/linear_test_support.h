// Helpers shared by the linear tests (CPU and GPU): random inputs, error metrics, messages.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/core/tensor.h"
#include "mxq/formats/bf16.h"
#include "mxq/linear/linear.h"

namespace mxq::linear::testing {

// bf16 [rows, cols] on the host, uniform in [-1, 1) times a per-row and per-column-group
// magnitude spanning several binades, so neighbouring groups get different scales.
inline Tensor random_bf16(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0F, 1.0F);
  std::uniform_int_distribution<int> exponent(-4, 4);
  Tensor t = Tensor::empty(DType::kBF16, {rows, cols});
  auto* bits = reinterpret_cast<std::uint16_t*>(t.data());
  std::vector<float> column_magnitude(static_cast<std::size_t>((cols + 15) / 16));
  for (float& m : column_magnitude) m = std::ldexp(1.0F, exponent(rng));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float row_magnitude = std::ldexp(1.0F, exponent(rng));
    for (std::int64_t c = 0; c < cols; ++c) {
      const float value =
          uniform(rng) * row_magnitude * column_magnitude[static_cast<std::size_t>(c / 16)];
      bits[r * cols + c] = float_to_bf16(value);
    }
  }
  return t;
}

inline Tensor random_f32(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0F, 1.0F);
  Tensor t = Tensor::empty(DType::kF32, {rows, cols});
  for (std::int64_t i = 0; i < rows * cols; ++i) t.data_as<float>()[i] = uniform(rng);
  return t;
}

// Values of a host bf16 or f32 tensor as doubles.
inline std::vector<double> values_of(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<double> out(static_cast<std::size_t>(host.numel()));
  for (std::int64_t i = 0; i < host.numel(); ++i) {
    out[static_cast<std::size_t>(i)] =
        host.dtype() == DType::kF32
            ? host.data_as<float>()[i]
            : bf16_to_float(reinterpret_cast<const std::uint16_t*>(host.data())[i]);
  }
  return out;
}

struct Comparison {
  double normalized_error = 0.0;    // ||out - ref||_2 / ||ref||_2
  std::int64_t nan_mismatches = 0;  // NaN in one but not the other
  std::int64_t first_bad = -1;      // first index with a NaN mismatch
};

inline Comparison compare(const Tensor& out, const Tensor& ref) {
  const std::vector<double> a = values_of(out);
  const std::vector<double> b = values_of(ref);
  Comparison result;
  double diff = 0.0;
  double norm = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) {
      if (result.first_bad < 0) result.first_bad = static_cast<std::int64_t>(i);
      ++result.nan_mismatches;
      continue;
    }
    if (std::isnan(a[i])) continue;
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  result.normalized_error = norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return result;
}

inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "expected an mxq::Error";
  return ErrorCode::kInternal;
}

}  // namespace mxq::linear::testing
