// Packed UE8M0: the golden word, the MN-major layout with MN padded to 4 and K-groups padded
// with zero bytes, round trips, and the errors for scales that are not powers of two.
#include "mxq/formats/ue8m0_pack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "formats/codec_oracles.h"

namespace mxq {
namespace {

using test::to_bits;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Tensor scales(std::int64_t mn, std::int64_t groups, const std::vector<float>& values) {
  Tensor t = Tensor::empty(DType::kF32, {mn, groups});
  std::copy(values.begin(), values.end(), t.data_as<float>());
  return t;
}

TEST(Ue8m0Pack, GoldenWord) {
  // Bytes 0x7F (1), 0x80 (2), 0x7E (0.5), 0x00 (2^-127), first group in the lowest byte.
  const Tensor packed = pack_ue8m0(scales(1, 4, {1.0F, 2.0F, 0.5F, 0x1p-127F}));
  EXPECT_EQ(packed.dtype(), DType::kI32);
  EXPECT_EQ(packed.shape(), (Shape{1, 4}));  // MN = 1 padded to 4
  EXPECT_EQ(static_cast<std::uint32_t>(packed.data_as<std::int32_t>()[0]), 0x007E807FU);
  for (int m = 1; m < 4; ++m) EXPECT_EQ(packed.data_as<std::int32_t>()[m], 0);  // padding rows
}

TEST(Ue8m0Pack, LayoutIsMnMajorWithPaddedStrideAndZeroMissingGroups) {
  // MN = 5 (stride 8), G = 6 (2 words: groups 0-3, then 4-5 and two zero bytes).
  // scales[m][g] = 2^(m - g), byte 127 + m - g.
  const std::int64_t mn = 5;
  const std::int64_t groups = 6;
  std::vector<float> values;
  for (std::int64_t m = 0; m < mn; ++m) {
    for (std::int64_t g = 0; g < groups; ++g)
      values.push_back(std::ldexp(1.0F, static_cast<int>(m - g)));
  }
  const Tensor packed = pack_ue8m0(scales(mn, groups, values));
  ASSERT_EQ(packed.shape(), (Shape{2, 8}));
  const auto* words = packed.data_as<std::int32_t>();
  for (std::int64_t p = 0; p < 2; ++p) {
    for (std::int64_t m = 0; m < 8; ++m) {
      std::uint32_t expected = 0;
      for (std::int64_t i = 0; i < 4; ++i) {
        const std::int64_t g = 4 * p + i;
        if (m < mn && g < groups) expected |= static_cast<std::uint32_t>(127 + m - g) << (8 * i);
      }
      EXPECT_EQ(static_cast<std::uint32_t>(words[p * 8 + m]), expected) << p << "," << m;
    }
  }
  // The second word of row 0: groups 4 (2^-4 -> 0x7B) and 5 (2^-5 -> 0x7A), then zeros.
  EXPECT_EQ(static_cast<std::uint32_t>(words[8]), 0x00007A7BU);
}

TEST(Ue8m0Pack, RoundTripsEveryPowerOfTwo) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> exponent(-127, 127);
  for (const auto& [mn, groups] : {std::pair<std::int64_t, std::int64_t>{1, 1},
                                   {3, 5},
                                   {4, 4},
                                   {129, 7},
                                   {64, 56},
                                   {1, 255}}) {
    std::vector<float> values;
    for (std::int64_t i = 0; i < mn * groups; ++i) {
      values.push_back(std::ldexp(1.0F, i < 255 ? static_cast<int>(i) - 127 : exponent(rng)));
    }
    const Tensor packed = pack_ue8m0(scales(mn, groups, values));
    EXPECT_EQ(packed.shape(), (Shape{(groups + 3) / 4, (mn + 3) / 4 * 4}));
    const Tensor back = unpack_ue8m0(packed, mn, groups);
    ASSERT_EQ(back.shape(), (Shape{mn, groups}));
    for (std::int64_t i = 0; i < mn * groups; ++i) {
      ASSERT_EQ(to_bits(back.data_as<float>()[i]), to_bits(values[static_cast<std::size_t>(i)]))
          << i;
    }
  }
}

TEST(Ue8m0Pack, UnpackDecodesZeroAndNanBytes) {
  Tensor packed = Tensor::zeros(DType::kI32, {1, 4});
  packed.data_as<std::int32_t>()[0] = static_cast<std::int32_t>(0xFF7F0100U);
  const Tensor back = unpack_ue8m0(packed, 1, 4);
  EXPECT_EQ(to_bits(back.data_as<float>()[0]), 0x00400000U);  // byte 0 -> 2^-127, not 0
  EXPECT_EQ(back.data_as<float>()[1], 0x1p-126F);
  EXPECT_EQ(back.data_as<float>()[2], 1.0F);
  EXPECT_TRUE(std::isnan(back.data_as<float>()[3]));  // 0xFF -> NaN, not Inf
}

TEST(Ue8m0Pack, UnpacksIntoTheCallersMemory) {
  std::vector<float> values;
  for (int i = 0; i < 5 * 6; ++i) values.push_back(std::ldexp(1.0F, i - 15));
  const Tensor packed = pack_ue8m0(scales(5, 6, values));
  Tensor out = Tensor::empty(DType::kF32, {5, 6});
  unpack_ue8m0_into(packed, 5, 6, out);
  const Tensor want = unpack_ue8m0(packed, 5, 6);
  for (int i = 0; i < 5 * 6; ++i) {
    EXPECT_EQ(to_bits(out.data_as<float>()[i]), to_bits(want.data_as<float>()[i])) << i;
  }
  const Tensor wrong = Tensor::empty(DType::kF32, {6, 5});
  const std::string m = message_of([&] { unpack_ue8m0_into(packed, 5, 6, wrong); });
  EXPECT_NE(m.find("unpack_ue8m0: out: expected [5, 6], found [6, 5]"), std::string::npos) << m;
}

TEST(Ue8m0Pack, RejectsScalesThatAreNotPowersOfTwo) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {3.0F, 0.0F, -0.0F, -1.0F, 0x1p-128F, 0x1.8p-127F, inf, -inf,
                    std::numeric_limits<float>::quiet_NaN(), std::nextafter(1.0F, 2.0F)}) {
    std::vector<float> values(8, 1.0F);
    values[6] = bad;  // row 1, group 2
    const std::string m = message_of([&] { (void)pack_ue8m0(scales(2, 4, values)); });
    EXPECT_NE(m.find("pack_ue8m0: scales[1, 2]: expected a power of two in [2^-127, 2^127]"),
              std::string::npos)
        << bad << ": " << m;
  }
  std::vector<float> values = {3.0F, 5.0F};
  EXPECT_NE(message_of([&] { (void)pack_ue8m0(scales(1, 2, values)); }).find("scales[0, 0]"),
            std::string::npos);  // the first offending index
}

TEST(Ue8m0Pack, ClearErrorsAtTheBoundary) {
  std::string m = message_of([] { (void)pack_ue8m0(Tensor::zeros(DType::kF32, {4})); });
  EXPECT_NE(m.find("pack_ue8m0: scales: expected a 2-D tensor"), std::string::npos) << m;
  m = message_of([] { (void)pack_ue8m0(Tensor::zeros(DType::kI32, {4, 4})); });
  EXPECT_NE(m.find("expected f32, found i32"), std::string::npos) << m;
  m = message_of([] { (void)unpack_ue8m0(Tensor::zeros(DType::kI32, {2, 4}), 5, 6); });
  EXPECT_NE(m.find("unpack_ue8m0: packed: expected [2, 8], found [2, 4]"), std::string::npos) << m;
  m = message_of([] { (void)unpack_ue8m0(Tensor::zeros(DType::kF32, {2, 8}), 5, 6); });
  EXPECT_NE(m.find("expected i32, found f32"), std::string::npos) << m;
  m = message_of([] { (void)unpack_ue8m0(Tensor::zeros(DType::kI32, {2, 8}), -1, 6); });
  EXPECT_NE(m.find("non-negative"), std::string::npos) << m;
}

}  // namespace
}  // namespace mxq
