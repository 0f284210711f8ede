// The CPU reference against a direct fp64 evaluation of the definition, its single rounding to
// bf16, the blocked fp32 CPU tactic against the reference, NaN propagation and bias.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "linear/linear_test_support.h"
#include "mxq/formats/e4m3.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"

namespace mxq::linear {
namespace {

using testing::compare;
using testing::random_bf16;
using testing::random_f32;
using testing::values_of;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// y[m, n] = sum_k q_x[m,k] s_x[m, k/bk] q_w[n,k] s_w[n/bn, k/bk] + bias[n], in long double,
// K-block by K-block (a different order from the reference's straight sum).
// `magnitude` receives sum |terms| per output, which bounds the fp64 summation error.
std::vector<long double> direct_formula(const Fp8BlockTensor& x, const BlockFp8Weight& w,
                                        const std::vector<float>& bias,
                                        std::vector<long double>& magnitude) {
  const std::int64_t m_total = x.q.shape()[0];
  const std::int64_t k_total = x.q.shape()[1];
  const std::int64_t n_total = w.n();
  const std::int64_t g_total = ceil_div(k_total, w.block.k);
  const auto* xq = static_cast<const std::uint8_t*>(x.q.data());
  const auto* wq = static_cast<const std::uint8_t*>(w.q.data());
  const float* xs = x.scale.data_as<float>();
  const float* ws = w.scale.data_as<float>();
  std::vector<long double> y(static_cast<std::size_t>(m_total * n_total));
  magnitude.assign(y.size(), 0.0L);
  for (std::int64_t m = 0; m < m_total; ++m) {
    for (std::int64_t n = 0; n < n_total; ++n) {
      long double total = bias.empty() ? 0.0L : bias[static_cast<std::size_t>(n)];
      long double abs_total = std::fabs(total);
      for (std::int64_t g = 0; g < g_total; ++g) {
        long double block_sum = 0.0L;
        long double block_abs = 0.0L;
        for (std::int64_t k = g * w.block.k; k < std::min(k_total, (g + 1) * w.block.k); ++k) {
          const long double product = static_cast<long double>(e4m3_to_float(xq[m * k_total + k])) *
                                      e4m3_to_float(wq[n * k_total + k]);
          block_sum += product;
          block_abs += std::fabs(product);
        }
        const long double scale =
            static_cast<long double>(xs[m * g_total + g]) * ws[(n / w.block.n) * g_total + g];
        total += block_sum * scale;
        abs_total += block_abs * scale;
      }
      y[static_cast<std::size_t>(m * n_total + n)] = total;
      magnitude[static_cast<std::size_t>(m * n_total + n)] = abs_total;
    }
  }
  return y;
}

struct Case {
  std::int64_t m, n, k;
  BlockShape block;
};

class ReferenceVsFormula : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceVsFormula, MatchesToOneF32RoundingAndBf16Closely) {
  const Case c = GetParam();
  const Tensor x = random_bf16(c.m, c.k, 1);
  const BlockFp8Weight w = quantize_weight(random_f32(c.n, c.k, 2), c.block);
  const Fp8BlockTensor xq = quantize_fp8_groups(x, c.block.k);
  Tensor bias = Tensor::empty(DType::kF32, {c.n});
  std::vector<float> bias_values(static_cast<std::size_t>(c.n));
  for (std::int64_t n = 0; n < c.n; ++n) {
    bias_values[static_cast<std::size_t>(n)] = 0.25F * static_cast<float>(n % 7) - 0.5F;
    bias.data_as<float>()[n] = bias_values[static_cast<std::size_t>(n)];
  }
  std::vector<long double> magnitude;
  const std::vector<long double> exact = direct_formula(xq, w, bias_values, magnitude);

  const Tensor y32 = linear_reference(xq, w, &bias.view(), DType::kF32);
  const Tensor y16 = linear_reference(xq, w, &bias.view(), DType::kBF16);
  ASSERT_EQ(y32.shape(), (Shape{c.m, c.n}));
  const std::vector<double> got32 = values_of(y32);
  const std::vector<double> got16 = values_of(y16);
  for (std::size_t i = 0; i < exact.size(); ++i) {
    const double e = static_cast<double>(exact[i]);
    // fp64 summation error bound: K * 2^-53 * sum |terms|.
    const double sum_error =
        static_cast<double>(c.k) * std::ldexp(1.0, -53) * static_cast<double>(magnitude[i]);
    // fp64 accumulation then one rounding: within half an f32 ulp (2^-24 relative).
    EXPECT_LE(std::fabs(got32[i] - e), std::ldexp(std::fabs(e), -24) + 2 * sum_error)
        << "index " << i;
    // bf16: one correct rounding, within half a bf16 ulp (2^-9 relative to the exponent's
    // power of two, at most 2^-8 relative to the value).
    EXPECT_LE(std::fabs(got16[i] - e), std::ldexp(std::fabs(e), -8) + 2 * sum_error)
        << "index " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReferenceVsFormula,
                         ::testing::Values(Case{1, 16, 128, {128, 128}},
                                           Case{3, 130, 200, {128, 128}}, Case{5, 64, 64, {64, 64}},
                                           Case{4, 96, 100, {32, 32}},
                                           Case{2, 257, 384, {256, 128}}, Case{7, 48, 80, {16, 48}},
                                           Case{6, 33, 70, {128, 64}}));

TEST(Reference, RoundsOnceToBf16) {
  // y = 1 * (1 + 2^-8) + 1 * 2^-40: just above the midpoint between bf16 1.0 and 1.0078125, so
  // the correct bf16 is 1.0078125. Rounding to f32 first lands exactly on the midpoint, and
  // ties-to-even would then give 1.0.
  const BlockShape block{1, 1};
  Tensor wq = Tensor::empty(DType::kE4M3, {1, 2});
  auto* w_codes = static_cast<std::uint8_t*>(wq.data());
  w_codes[0] = 0x38;  // 1.0
  w_codes[1] = 0x38;
  Tensor ws = Tensor::empty(DType::kF32, {1, 2});
  ws.data_as<float>()[0] = 1.0F + std::ldexp(1.0F, -8);
  ws.data_as<float>()[1] = std::ldexp(1.0F, -40);
  const BlockFp8Weight w = make_block_fp8_weight(wq, ws, block);
  Fp8BlockTensor x{Tensor::empty(DType::kE4M3, {1, 2}), Tensor::empty(DType::kF32, {1, 2}),
                   BlockShape{1, 1}};
  static_cast<std::uint8_t*>(x.q.data())[0] = 0x38;
  static_cast<std::uint8_t*>(x.q.data())[1] = 0x38;
  x.scale.data_as<float>()[0] = 1.0F;
  x.scale.data_as<float>()[1] = 1.0F;
  const Tensor y = linear_reference(x, w);
  EXPECT_EQ(reinterpret_cast<const std::uint16_t*>(y.data())[0], 0x3F81);  // 1.0078125
}

TEST(Reference, NanInABlockPropagatesToItsOutputsOnly) {
  Tensor xf = random_bf16(2, 256, 3);
  reinterpret_cast<std::uint16_t*>(xf.data())[0] = 0x7FC0;  // NaN in row 0, first K-group
  const BlockFp8Weight w = quantize_weight(random_f32(16, 256, 4), BlockShape{128, 128});
  const Fp8BlockTensor xq = quantize_fp8_groups(xf, 128);
  const std::vector<double> y = values_of(linear_reference(xq, w));
  for (std::int64_t n = 0; n < 16; ++n) {
    EXPECT_TRUE(std::isnan(y[static_cast<std::size_t>(n)])) << n;
    EXPECT_FALSE(std::isnan(y[static_cast<std::size_t>(16 + n)])) << n;
  }
}

TEST(BlockedF32, AgreesWithTheReference) {
  for (const Case c :
       {Case{9, 200, 384, {128, 128}}, Case{1, 77, 96, {32, 32}}, Case{17, 64, 130, {64, 64}}}) {
    const Tensor x = random_bf16(c.m, c.k, 5);
    const BlockFp8Weight w = quantize_weight(random_f32(c.n, c.k, 6), c.block);
    const Fp8BlockTensor xq = quantize_fp8_groups(x, c.block.k);
    for (const char* tactic : {"cpu.blocked_f32.n64", "cpu.blocked_f32.n16"}) {
      LinearOptions options;
      options.tactic = tactic;
      for (const DType out : {DType::kBF16, DType::kF32}) {
        options.out_dtype = out;
        const auto result =
            compare(linear(xq, w, nullptr, options), linear_reference(xq, w, nullptr, out));
        EXPECT_LE(result.normalized_error, out == DType::kF32 ? 1e-5 : 4e-3) << tactic;
        EXPECT_EQ(result.nan_mismatches, 0);
      }
    }
  }
}

}  // namespace
}  // namespace mxq::linear
