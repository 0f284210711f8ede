// Element and scale codecs (E2M1, E4M3, E8M0) against CUDA's host conversion functions and
// against brute-force references built from the formats' definitions. The default run covers
// every rounding boundary of every fp32 binade (with neighbours), the special values and 2x10^7
// random inputs per encoder; codecs_exhaustive_slow_test.cpp covers all 2^32 inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "formats/codec_oracles.h"
#include "mxq/formats/e2m1.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/e8m0.h"

namespace mxq {
namespace {

using test::from_bits;
using test::to_bits;

constexpr std::size_t kRandomCount = 10'000'000;  // per kind (raw bits, in-range), per encoder

// The encoders are constexpr: these are evaluated by the compiler.
static_assert(float_to_e2m1(0.75F) == 0x2 && float_to_e2m1(-5.0F) == 0xE);
static_assert(float_to_e4m3(464.0F) == 0x7E &&
              float_to_e4m3(465.0F, Fp8Saturation::kNoSat) == 0x7F);
static_assert(float_to_e8m0(3.0F, E8m0Rounding::kCeil) == 129 && e8m0_to_float(0) > 0.0F);
static_assert(e2m1_to_float(0xF) == -6.0F && e4m3_to_float(0x7E) == 448.0F);

const std::vector<std::uint32_t>& boundary_inputs() {
  static const std::vector<std::uint32_t> inputs = test::boundary_inputs();
  return inputs;
}

TEST(BoundaryInputs, ContainEveryMidpointAndItsNeighbours) {
  const auto& inputs = boundary_inputs();
  const auto contains = [&](float x) {
    return std::find(inputs.begin(), inputs.end(), to_bits(x)) != inputs.end();
  };
  // E2M1 midpoints, E4M3 midpoints (subnormal, normal, overflow), E8M0 edges.
  for (float x : {0.25F, 0.75F, 1.25F, 1.75F, 2.5F, 3.5F, 5.0F, 6.0F, 464.0F, 248.0F, 0.0146484375F,
                  0.0009765625F, 1.0625F, 1.5F, 0x1p-127F, 0x1p127F, -3.5F}) {
    EXPECT_TRUE(contains(x)) << x;
    EXPECT_TRUE(contains(std::nextafter(x, 0.0F))) << x;
    EXPECT_TRUE(contains(std::nextafter(x, 1e30F))) << x;
  }
}

// ---- E2M1 ------------------------------------------------------------------------------------

TEST(E2M1, DecodesEveryCodeByTheFormula) {
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float value = e2m1_to_float(code);
    EXPECT_EQ(static_cast<double>(value), test::e2m1_value(code)) << c;
    EXPECT_EQ(std::signbit(value), c >= 8) << c;  // code 8 is -0.0
  }
}

#if MXQ_HAVE_CUDA_HEADERS
TEST(E2M1, DecodesEveryCodeLikeCuda) {
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    EXPECT_EQ(to_bits(e2m1_to_float(code)), to_bits(test::cuda_e2m1_to_float(code))) << c;
  }
}
#endif

TEST(E2M1, SpecialValuesAndTies) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_e2m1(nan), 0x7);
  EXPECT_EQ(float_to_e2m1(-nan), 0x7);
  EXPECT_EQ(float_to_e2m1(from_bits(0xFF800001U)), 0x7);  // signalling, negative
  EXPECT_EQ(float_to_e2m1(inf), 0x7);
  EXPECT_EQ(float_to_e2m1(-inf), 0xF);
  EXPECT_EQ(float_to_e2m1(0.0F), 0x0);
  EXPECT_EQ(float_to_e2m1(-0.0F), 0x8);
  EXPECT_EQ(float_to_e2m1(-0.1F), 0x8);
  EXPECT_EQ(float_to_e2m1(std::numeric_limits<float>::denorm_min()), 0x0);
  EXPECT_EQ(float_to_e2m1(std::numeric_limits<float>::max()), 0x7);
  // Ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
  const float ties[] = {0.25F, 0.75F, 1.25F, 1.75F, 2.5F, 3.5F, 5.0F};
  const std::uint8_t tie_codes[] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(float_to_e2m1(ties[i]), tie_codes[i]) << ties[i];
    EXPECT_EQ(float_to_e2m1(-ties[i]), tie_codes[i] | 0x8) << -ties[i];
    // One float either side leaves the tie towards that side.
    EXPECT_EQ(float_to_e2m1(std::nextafter(ties[i], 0.0F)),
              test::reference_e2m1(std::nextafter(ties[i], 0.0F)));
    EXPECT_EQ(float_to_e2m1(std::nextafter(ties[i], 10.0F)),
              test::reference_e2m1(std::nextafter(ties[i], 10.0F)));
  }
  EXPECT_EQ(float_to_e2m1(std::nextafter(0.25F, 1.0F)), 0x1);
  EXPECT_EQ(float_to_e2m1(std::nextafter(5.0F, 6.0F)), 0x7);
  EXPECT_EQ(float_to_e2m1(6.5F), 0x7);    // saturates
  EXPECT_EQ(float_to_e2m1(-1e30F), 0xF);  // saturates
}

TEST(E2M1, BoundariesAndRandomMatchTheReference) {
  const auto random = test::random_inputs(kRandomCount, -4, 4, 1);
  for (const auto* inputs : {&boundary_inputs(), &random}) {
    EXPECT_EQ(test::count_mismatches(*inputs, test::reference_e2m1, float_to_e2m1, "e2m1 vs ref"),
              0U);
  }
}

#if MXQ_HAVE_CUDA_HEADERS
TEST(E2M1, BoundariesAndRandomMatchCuda) {
  const auto random = test::random_inputs(kRandomCount, -4, 4, 2);
  for (const auto* inputs : {&boundary_inputs(), &random}) {
    EXPECT_EQ(test::count_mismatches(*inputs, test::cuda_e2m1, float_to_e2m1, "e2m1 vs cuda"), 0U);
  }
}
#endif

// ---- E4M3 ------------------------------------------------------------------------------------

TEST(E4M3, DecodesEveryCodeByTheFormula) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float value = e4m3_to_float(code);
    if (test::e4m3_is_nan(code)) {
      EXPECT_TRUE(std::isnan(value)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(value), test::e4m3_pattern_value(code)) << c;
    EXPECT_EQ(std::signbit(value), c >= 0x80) << c;
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0F);
  EXPECT_EQ(e4m3_to_float(0x01), 0.001953125F);
  EXPECT_EQ(e4m3_to_float(0x08), 0.015625F);
  EXPECT_EQ(to_bits(e4m3_to_float(0x80)), 0x80000000U);
}

#if MXQ_HAVE_CUDA_HEADERS
TEST(E4M3, DecodesEveryCodeLikeCuda) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float cuda = test::cuda_e4m3_to_float(code);
    if (std::isnan(cuda)) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(code))) << c;
    } else {
      EXPECT_EQ(to_bits(e4m3_to_float(code)), to_bits(cuda)) << c;
    }
  }
}
#endif

TEST(E4M3, SpecialValuesTiesAndOverflow) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  constexpr auto kSat = Fp8Saturation::kSatFinite;
  constexpr auto kNoSat = Fp8Saturation::kNoSat;
  for (auto mode : {kSat, kNoSat}) {
    EXPECT_EQ(float_to_e4m3(nan, mode), 0x7F);
    EXPECT_EQ(float_to_e4m3(-nan, mode), 0x7F);  // the sign of NaN is dropped, as in CUDA
    EXPECT_EQ(float_to_e4m3(-0.0F, mode), 0x80);
    EXPECT_EQ(float_to_e4m3(-1e-4F, mode), 0x80);
    EXPECT_EQ(float_to_e4m3(448.0F, mode), 0x7E);
    EXPECT_EQ(float_to_e4m3(449.0F, mode), 0x7E);
    EXPECT_EQ(float_to_e4m3(464.0F, mode), 0x7E);    // tie; 448's mantissa is even
    EXPECT_EQ(float_to_e4m3(248.0F, mode), 0x78);    // carry into the exponent: 256
    EXPECT_EQ(float_to_e4m3(1.0625F, mode), 0x38);   // tie -> 1.0
    EXPECT_EQ(float_to_e4m3(0x1p-10F, mode), 0x00);  // half the smallest subnormal: tie -> 0
    EXPECT_EQ(float_to_e4m3(std::nextafter(0x1p-10F, 1.0F), mode), 0x01);
    EXPECT_EQ(float_to_e4m3(1.5F * 0x1p-9F, mode), 0x02);
    EXPECT_EQ(float_to_e4m3(2.5F * 0x1p-9F, mode), 0x02);
    EXPECT_EQ(float_to_e4m3(0.0146484375F, mode), 0x08);  // 7.5 * 2^-9 -> smallest normal
  }
  const float above = std::nextafter(464.0F, 1000.0F);
  EXPECT_EQ(float_to_e4m3(above, kSat), 0x7E);
  EXPECT_EQ(float_to_e4m3(above, kNoSat), 0x7F);
  EXPECT_EQ(float_to_e4m3(-1000.0F, kSat), 0xFE);
  EXPECT_EQ(float_to_e4m3(-1000.0F, kNoSat), 0xFF);
  EXPECT_EQ(float_to_e4m3(inf, kSat), 0x7E);
  EXPECT_EQ(float_to_e4m3(-inf, kSat), 0xFE);
  EXPECT_EQ(float_to_e4m3(inf, kNoSat), 0x7F);
  EXPECT_EQ(float_to_e4m3(-inf, kNoSat), 0xFF);
  EXPECT_EQ(float_to_e4m3(1000.0F), 0x7E);  // saturating is the default
}

TEST(E4M3, BoundariesAndRandomMatchTheReference) {
  const auto random = test::random_inputs(kRandomCount, -12, 9, 3);
  for (const bool saturate : {true, false}) {
    const auto mode = saturate ? Fp8Saturation::kSatFinite : Fp8Saturation::kNoSat;
    const auto expected = [&](float x) { return test::reference_e4m3(x, saturate); };
    const auto actual = [&](float x) { return float_to_e4m3(x, mode); };
    for (const auto* inputs : {&boundary_inputs(), &random}) {
      EXPECT_EQ(test::count_mismatches(*inputs, expected, actual, "e4m3 vs ref"), 0U) << saturate;
    }
  }
}

#if MXQ_HAVE_CUDA_HEADERS
TEST(E4M3, BoundariesAndRandomMatchCuda) {
  const auto random = test::random_inputs(kRandomCount, -12, 9, 4);
  for (const bool saturate : {true, false}) {
    const auto mode = saturate ? Fp8Saturation::kSatFinite : Fp8Saturation::kNoSat;
    const auto expected = [&](float x) { return test::cuda_e4m3(x, saturate); };
    const auto actual = [&](float x) { return float_to_e4m3(x, mode); };
    for (const auto* inputs : {&boundary_inputs(), &random}) {
      EXPECT_EQ(test::count_mismatches(*inputs, expected, actual, "e4m3 vs cuda"), 0U) << saturate;
    }
  }
}
#endif

TEST(E2M1ToE4M3, IsExactForAllCodes) {
  // The table from the format definitions, -0.0 -> 0x80 included.
  const std::uint8_t expected[16] = {0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C,
                                     0x80, 0xB0, 0xB8, 0xBC, 0xC0, 0xC4, 0xC8, 0xCC};
  for (int c = 0; c < 16; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    EXPECT_EQ(e2m1_to_e4m3(code), expected[c]) << c;
    // Exact: decoding both gives the same fp32 bits (sign of zero included), and so does
    // encoding the E2M1 value.
    EXPECT_EQ(to_bits(e4m3_to_float(e2m1_to_e4m3(code))), to_bits(e2m1_to_float(code))) << c;
    EXPECT_EQ(float_to_e4m3(e2m1_to_float(code)), e2m1_to_e4m3(code)) << c;
  }
}

// ---- E8M0 ------------------------------------------------------------------------------------

TEST(E8M0, DecodesEveryCodeByTheFormula) {
  for (int c = 0; c < 255; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    EXPECT_EQ(static_cast<double>(e8m0_to_float(code)), test::e8m0_value(code)) << c;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
  EXPECT_EQ(to_bits(e8m0_to_float(0)), 0x00400000U);  // 2^-127, not 0
  EXPECT_EQ(e8m0_to_float(0xFE), 0x1p127F);           // not Inf
  EXPECT_EQ(e8m0_to_float(kE8M0One), 1.0F);
}

#if MXQ_HAVE_CUDA_HEADERS
TEST(E8M0, DecodesEveryCodeLikeCuda) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float cuda = test::cuda_e8m0_to_float(code);
    if (std::isnan(cuda)) {
      EXPECT_TRUE(std::isnan(e8m0_to_float(code))) << c;
    } else {
      EXPECT_EQ(to_bits(e8m0_to_float(code)), to_bits(cuda)) << c;
    }
  }
}
#endif

TEST(E8M0, EncoderEdgeCases) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  constexpr auto kFloor = E8m0Rounding::kFloor;
  constexpr auto kCeil = E8m0Rounding::kCeil;
  for (auto mode : {kFloor, kCeil}) {
    EXPECT_EQ(float_to_e8m0(0.0F, mode), 0x00);
    EXPECT_EQ(float_to_e8m0(-0.0F, mode), 0x00);
    EXPECT_EQ(float_to_e8m0(0x1p-127F, mode), 0x00);
    EXPECT_EQ(float_to_e8m0(std::numeric_limits<float>::denorm_min(), mode), 0x00);
    EXPECT_EQ(float_to_e8m0(1.0F, mode), 0x7F);
    EXPECT_EQ(float_to_e8m0(-1.0F, mode), 0x7F);  // the sign is ignored
    EXPECT_EQ(float_to_e8m0(0x1p127F, mode), 0xFE);
    EXPECT_EQ(float_to_e8m0(inf, mode), 0xFE);
    EXPECT_EQ(float_to_e8m0(-inf, mode), 0xFE);
    EXPECT_EQ(float_to_e8m0(nan, mode), 0xFF);
    EXPECT_EQ(float_to_e8m0(-nan, mode), 0xFF);
  }
  const float just_above_2m127 = std::nextafter(0x1p-127F, 1.0F);
  EXPECT_EQ(float_to_e8m0(just_above_2m127, kFloor), 0x00);
  EXPECT_EQ(float_to_e8m0(just_above_2m127, kCeil), 0x01);
  EXPECT_EQ(float_to_e8m0(std::nextafter(1.0F, 2.0F), kFloor), 0x7F);
  EXPECT_EQ(float_to_e8m0(std::nextafter(1.0F, 2.0F), kCeil), 0x80);
  EXPECT_EQ(float_to_e8m0(std::nextafter(1.0F, 0.0F), kFloor), 0x7E);
  EXPECT_EQ(float_to_e8m0(std::nextafter(1.0F, 0.0F), kCeil), 0x7F);
  EXPECT_EQ(float_to_e8m0(3.0F, kFloor), 0x80);
  EXPECT_EQ(float_to_e8m0(3.0F, kCeil), 0x81);
  EXPECT_EQ(float_to_e8m0(std::numeric_limits<float>::max(), kFloor), 0xFE);
  EXPECT_EQ(float_to_e8m0(std::numeric_limits<float>::max(), kCeil), 0xFE);  // saturates
}

TEST(E8M0, BoundariesAndRandomMatchTheReference) {
  const auto random = test::random_inputs(kRandomCount, -130, 127, 5);
  for (const bool ceil : {false, true}) {
    const auto mode = ceil ? E8m0Rounding::kCeil : E8m0Rounding::kFloor;
    const auto expected = [&](float x) { return test::reference_e8m0(x, ceil); };
    const auto actual = [&](float x) { return float_to_e8m0(x, mode); };
    for (const auto* inputs : {&boundary_inputs(), &random}) {
      EXPECT_EQ(test::count_mismatches(*inputs, expected, actual, "e8m0 vs ref"), 0U) << ceil;
    }
  }
}

#if MXQ_HAVE_CUDA_HEADERS
TEST(E8M0, BoundariesAndRandomMatchCuda) {
  const auto random = test::random_inputs(kRandomCount, -130, 127, 6);
  for (const bool ceil : {false, true}) {
    const auto mode = ceil ? E8m0Rounding::kCeil : E8m0Rounding::kFloor;
    const auto expected = [&](float x) { return test::cuda_e8m0(x, ceil); };
    const auto actual = [&](float x) { return float_to_e8m0(x, mode); };
    for (const auto* inputs : {&boundary_inputs(), &random}) {
      EXPECT_EQ(test::count_mismatches(*inputs, expected, actual, "e8m0 vs cuda"), 0U) << ceil;
    }
  }
}
#endif

TEST(E8M0, RoundTripsEveryFiniteCode) {
  for (int c = 0; c < 255; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    EXPECT_EQ(float_to_e8m0(e8m0_to_float(code), E8m0Rounding::kFloor), code);
    EXPECT_EQ(float_to_e8m0(e8m0_to_float(code), E8m0Rounding::kCeil), code);
  }
}

#if !MXQ_HAVE_CUDA_HEADERS
TEST(Cuda, HeadersAvailable) {
  GTEST_SKIP() << "CUDA headers not found: CUDA cross-checks skipped";
}
#endif

}  // namespace
}  // namespace mxq
