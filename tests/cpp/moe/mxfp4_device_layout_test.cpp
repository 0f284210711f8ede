// The device layout of packed MXFP4 words (src/cuda/moe/mxfp4_device_layout.h), on the host: the
// bit map is a permutation, conversion round-trips, and the kernels' register extraction gives
// every code of every natural pair (e_{2i}, e_{2i+1}) at the bf16 bits the scale factors expect
// (magnitude at bits 6..8, sign at bit 15 of each half). The GPU test of the decode
// (mxfp4_word_decode_gpu_test) then checks the scaled values against the host codec.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "../../../src/cuda/moe/mxfp4_device_layout.h"

namespace mxq::moe::cuda::detail {
namespace {

std::uint32_t device_register(std::uint32_t device_word, int i) {
  switch (i) {
    case 0:
      return device_word_register<0>(device_word);
    case 1:
      return device_word_register<1>(device_word);
    case 2:
      return device_word_register<2>(device_word);
    default:
      return device_word_register<3>(device_word);
  }
}

// A code's bf16 half before scaling: magnitude bits at 6..8, sign at 15.
std::uint32_t unscaled_half(std::uint32_t code) { return ((code & 7U) << 6) | ((code & 8U) << 12); }

TEST(Mxfp4DeviceLayout, BitMapIsAPermutation) {
  std::set<int> bits;
  for (int e = 0; e < 8; ++e)
    for (int b = 0; b < 4; ++b) bits.insert(device_bit(e, b));
  EXPECT_EQ(bits.size(), 32U);
  EXPECT_EQ(*bits.begin(), 0);
  EXPECT_EQ(*bits.rbegin(), 31);
}

TEST(Mxfp4DeviceLayout, EverySingleBitRoundTrips) {
  for (int bit = 0; bit < 32; ++bit) {
    const std::uint32_t w = 1U << bit;
    const std::uint32_t d = to_device_word(w);
    EXPECT_EQ(__builtin_popcount(d), 1) << bit;
    EXPECT_EQ(from_device_word(d), w) << bit;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const std::uint32_t w = rng();
    EXPECT_EQ(from_device_word(to_device_word(w)), w);
  }
}

TEST(Mxfp4DeviceLayout, RegistersHoldNaturalPairsOfEveryCode) {
  std::mt19937 rng(11);
  for (int i = 0; i < 4; ++i) {
    for (std::uint32_t a = 0; a < 16; ++a) {
      for (std::uint32_t b = 0; b < 16; ++b) {
        std::uint32_t natural = rng();  // the other codes random
        natural &= ~(0xFFU << (8 * i));
        natural |= (a << (8 * i)) | (b << (8 * i + 4));  // e_{2i} = a, e_{2i+1} = b
        const std::uint32_t reg = device_register(to_device_word(natural), i);
        EXPECT_EQ(reg, unscaled_half(a) | (unscaled_half(b) << 16))
            << "register " << i << " codes " << a << ", " << b;
      }
    }
  }
}

// bf16 bits of 2^e (normal range).
std::uint32_t bf16_power_of_two(int e) { return static_cast<std::uint32_t>(e + 127) << 7; }

TEST(Mxfp4DeviceScales, NarrowFactorIsTwoToTheScaleMinusOneInBothHalves) {
  for (std::uint32_t scale = 0; scale <= 128; ++scale) {
    const std::uint32_t half = bf16_power_of_two(static_cast<int>(scale) - 1);
    EXPECT_EQ(narrow_scale_factor(scale), half | (half << 16)) << scale;
  }
}

// Every scale byte at every position, the other bytes random.
TEST(Mxfp4DeviceScales, WideByteTestFlagsExactlyTheScalesAbove128) {
  std::mt19937 rng(5);
  for (int position = 0; position < 4; ++position) {
    for (std::uint32_t scale = 0; scale < 256; ++scale) {
      for (int trial = 0; trial < 8; ++trial) {
        std::uint32_t packed = 0;
        bool want = false;
        for (int b = 0; b < 4; ++b) {
          // Other bytes mostly at or below 128, sometimes any value.
          const std::uint32_t byte =
              b == position ? scale : (trial < 6 ? rng() % 129 : rng() % 256);
          packed |= byte << (8 * b);
          want = want || byte > 128;
        }
        EXPECT_EQ(any_wide_scale_byte(packed), want) << std::hex << packed;
      }
    }
  }
}

TEST(Mxfp4DeviceScales, PackedNarrowFactorsMatchTheOneScaleFactor) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 20000; ++trial) {
    std::uint32_t s[4];
    for (auto& v : s) v = trial < 129 ? static_cast<std::uint32_t>(trial) : rng() % 129;
    const std::uint32_t packed = s[0] | (s[1] << 8) | (s[2] << 16) | (s[3] << 24);
    const std::uint32_t biased = packed + kPackedScaleBias;
    EXPECT_EQ(packed_narrow_scale_factor<0>(biased), narrow_scale_factor(s[0]));
    EXPECT_EQ(packed_narrow_scale_factor<1>(biased), narrow_scale_factor(s[1]));
    EXPECT_EQ(packed_narrow_scale_factor<2>(biased), narrow_scale_factor(s[2]));
    EXPECT_EQ(packed_narrow_scale_factor<3>(biased), narrow_scale_factor(s[3]));
  }
}

TEST(Mxfp4DeviceLayout, HostConversionConvertsEveryWord) {
  std::vector<std::uint8_t> bytes(64);
  std::mt19937 rng(3);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  std::vector<std::uint8_t> converted = bytes;
  to_device_layout_host(converted.data(), converted.size());
  for (std::size_t i = 0; i < bytes.size(); i += 4) {
    const std::uint32_t w = bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) |
                            (static_cast<std::uint32_t>(bytes[i + 3]) << 24);
    const std::uint32_t d = converted[i] | (converted[i + 1] << 8) | (converted[i + 2] << 16) |
                            (static_cast<std::uint32_t>(converted[i + 3]) << 24);
    EXPECT_EQ(d, to_device_word(w)) << i;
  }
}

}  // namespace
}  // namespace mxq::moe::cuda::detail
