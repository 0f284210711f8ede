// bf16.h: round-to-nearest-even fp32 -> bf16 (ties, NaN, Inf, overflow, subnormals) and the
// exact decode, against hand-worked values and the definition (test::reference_bf16).
#include "mxq/formats/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "formats/codec_oracles.h"

namespace mxq {
namespace {

using test::from_bits;
using test::to_bits;

TEST(Bf16, TiesRoundToEven) {
  // 1 + 2^-8 is halfway between bf16 1.0 (0x3F80) and 1 + 2^-7 (0x3F81): even -> 0x3F80.
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808000U)), 0x3F80);
  // Halfway between 0x3F81 and 0x3F82: even -> 0x3F82.
  EXPECT_EQ(float_to_bf16(from_bits(0x3F818000U)), 0x3F82);
  EXPECT_EQ(float_to_bf16(from_bits(0xBF808000U)), 0xBF80);
  EXPECT_EQ(float_to_bf16(from_bits(0xBF818000U)), 0xBF82);
  // Just off the tie goes to the nearer value.
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808001U)), 0x3F81);
  EXPECT_EQ(float_to_bf16(from_bits(0x3F807FFFU)), 0x3F80);
  // A carry into the exponent: the largest mantissa rounds up to the next power of two.
  EXPECT_EQ(float_to_bf16(from_bits(0x3FFFC000U)), 0x4000);
  // Subnormals round on the same grid.
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000U)), 0x0000);
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000U)), 0x0002);
  EXPECT_EQ(float_to_bf16(-0.0F), 0x8000);
}

TEST(Bf16, InfNanAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16(inf), 0x7F80);
  EXPECT_EQ(float_to_bf16(-inf), 0xFF80);
  // FLT_MAX is past the halfway point between the largest bf16 and 2^128: Inf.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFFU)), 0x7F7F);
  // NaN stays NaN, including payloads that live only in the low 16 bits (truncation would give
  // Inf), and keeps its sign.
  for (std::uint32_t nan_bits : {0x7FC00000U, 0x7F800001U, 0xFF800001U, 0x7FFFFFFFU}) {
    const std::uint16_t bf = float_to_bf16(from_bits(nan_bits));
    EXPECT_TRUE(std::isnan(bf16_to_float(bf))) << std::hex << nan_bits;
    EXPECT_EQ(bf >> 15, nan_bits >> 31) << std::hex << nan_bits;
  }
}

TEST(Bf16, DecodeIsExact) {
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0F);
  EXPECT_EQ(bf16_to_float(0xC0C0), -6.0F);
  EXPECT_EQ(to_bits(bf16_to_float(0x0001)), 0x00010000U);
  for (std::uint32_t pattern = 0; pattern < 0x10000U; ++pattern) {
    const auto bf = static_cast<std::uint16_t>(pattern);
    const float value = bf16_to_float(bf);
    EXPECT_EQ(to_bits(value), pattern << 16);
    if (!std::isnan(value)) {
      EXPECT_EQ(float_to_bf16(value), bf);  // decode then encode is exact
    }
  }
  EXPECT_EQ(round_to_bf16(from_bits(0x3F808001U)), from_bits(0x3F810000U));
}

TEST(Bf16, RandomInputsMatchTheDefinition) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10'000'000; ++i) {
    const auto bits = static_cast<std::uint32_t>(rng());
    const float x = from_bits(bits);
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_bf16(x), test::reference_bf16(x)) << std::hex << bits;
  }
}

}  // namespace
}  // namespace mxq
