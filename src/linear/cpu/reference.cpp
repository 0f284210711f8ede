#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "linear/cpu/block_fp8_linear.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"
#include "mxq/formats/e4m3.h"

namespace mxq::linear::cpu {
namespace {

constexpr std::int64_t kRowsPerTile = 8;    // weight rows dequantized together
constexpr std::int64_t kRowsPerBlock = 64;  // rows of x dequantized together

double bias_at(const LinearOperands& ops, std::int64_t n) {
  if (ops.bias == nullptr) return 0.0;
  if (ops.bias_dtype == DType::kF32) return static_cast<const float*>(ops.bias)[n];
  return bf16_to_float(static_cast<const std::uint16_t*>(ops.bias)[n]);
}

void store(const LinearOperands& ops, const LinearProblem& problem, std::int64_t m, std::int64_t n,
           double value) {
  const std::int64_t offset = m * ops.ldo + n;
  if (problem.out_dtype == DType::kF32) {
    static_cast<float*>(ops.out)[offset] = static_cast<float>(value);
  } else {
    static_cast<std::uint16_t*>(ops.out)[offset] = double_to_bf16_bits(value);
  }
}

}  // namespace

std::uint16_t double_to_bf16_bits(double value) {
  float rounded = static_cast<float>(value);  // round-to-nearest-even
  if (std::isfinite(rounded) && static_cast<double>(rounded) != value) {
    // Round to odd instead: truncate toward zero, then set the last bit. With 16 more bits
    // than bf16, the second rounding then equals one correct rounding of `value`.
    std::uint32_t bits = std::bit_cast<std::uint32_t>(rounded);
    if (std::fabs(static_cast<double>(rounded)) > std::fabs(value)) bits -= 1;
    rounded = std::bit_cast<float>(bits | 1U);
  }
  return float_to_bf16(rounded);
}

void linear_reference(const LinearOperands& ops, const LinearProblem& problem) {
  const std::int64_t m_total = problem.m;
  const std::int64_t n_total = problem.n;
  const std::int64_t k_total = problem.k;
  const std::int64_t bn = problem.block.n;
  const std::int64_t bk = problem.block.k;
  const std::int64_t tiles = (n_total + kRowsPerTile - 1) / kRowsPerTile;

  // Rows of x are taken kRowsPerBlock at a time, dequantized exactly in fp64 (4 significant
  // bits times 24), so memory stays bounded and the block is reused across every weight row.
  std::vector<double> x(static_cast<std::size_t>(std::min(kRowsPerBlock, m_total) * k_total));
  for (std::int64_t m0 = 0; m0 < m_total; m0 += kRowsPerBlock) {
    const std::int64_t rows = std::min(kRowsPerBlock, m_total - m0);
    parallel_for(rows, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        const std::int64_t m = m0 + r;
        for (std::int64_t k = 0; k < k_total; ++k) {
          const float scale =
              ops.a_scale[(k / bk) * ops.a_scale_group_stride + m * ops.a_scale_row_stride];
          x[static_cast<std::size_t>(r * k_total + k)] =
              static_cast<double>(e4m3_to_float(ops.a[m * ops.lda + k])) *
              static_cast<double>(scale);
        }
      }
    });
    parallel_for(tiles, 1, [&](std::int64_t begin, std::int64_t end) {
      std::vector<double> w(static_cast<std::size_t>(kRowsPerTile * k_total));
      for (std::int64_t tile = begin; tile < end; ++tile) {
        const std::int64_t n0 = tile * kRowsPerTile;
        const std::int64_t cols = std::min(kRowsPerTile, n_total - n0);
        for (std::int64_t c = 0; c < cols; ++c) {
          const std::int64_t n = n0 + c;
          for (std::int64_t k = 0; k < k_total; ++k) {
            const float scale = ops.w_scale[(n / bn) * ops.w_scale_ld + k / bk];
            w[static_cast<std::size_t>(c * k_total + k)] =
                static_cast<double>(e4m3_to_float(ops.w[n * ops.ldw + k])) *
                static_cast<double>(scale);
          }
        }
        for (std::int64_t r = 0; r < rows; ++r) {
          const double* x_row = x.data() + r * k_total;
          for (std::int64_t c = 0; c < cols; ++c) {
            const double* w_row = w.data() + c * k_total;
            double sum = 0.0;
            for (std::int64_t k = 0; k < k_total; ++k) sum += x_row[k] * w_row[k];
            store(ops, problem, m0 + r, n0 + c, sum + bias_at(ops, n0 + c));
          }
        }
      }
    });
  }
}

}  // namespace mxq::linear::cpu
