// The device layout of packed MXFP4 words (src/moe/layout/mxfp4_device_layout.h), on the host: the
// bit map is a permutation, conversion round-trips, and the kernels' register extraction gives
// every code of every natural pair (e_{2i}, e_{2i+1}) at the bf16 bits the scale factors expect
// (magnitude at bits 6..8, sign at bit 15 of each half), and rows land in their row groups
// (row_groups.h) with every word converted. The GPU test of the decode
// (mxfp4_word_decode_gpu_test) then checks the scaled values against the host codec.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "moe/layout/mxfp4_device_layout.h"

namespace mxq::moe::gpu::detail {
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

// Every 16-byte MX block of every row lands at grouped_block_offset with its words converted; the
// blocks fill the rows' bytes exactly once; a full chunk of a group is one 1 KB piece, rows 64
// bytes apart; the short chunk (K not a multiple of 128) packs its rows nb * 16 bytes apart.
TEST(Mxfp4DeviceLayout, HostConversionGroupsRowsAndConvertsEveryWord) {
  for (const int k : {128, 256, 32, 64, 96, 2880, 544}) {
    const std::size_t rows = 3 * kGroupRows;
    const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
    std::vector<std::uint8_t> natural(rows * row_bytes);
    std::mt19937 rng(static_cast<unsigned>(k));
    for (auto& b : natural) b = static_cast<std::uint8_t>(rng());
    std::vector<std::uint8_t> device = natural;
    to_device_layout_host(device.data(), rows, k);
    std::vector<int> covered(natural.size(), 0);
    for (std::size_t row = 0; row < rows; ++row) {
      for (int k_at = 0; k_at < k; k_at += 32) {
        const std::size_t at = grouped_block_offset(row, k, k_at);
        ASSERT_LE(at + 16, device.size());
        EXPECT_EQ(at / (kGroupRows * row_bytes), row / kGroupRows);  // stays in its group
        const int q = k_at / kLayoutChunk;
        const int i = static_cast<int>(row % kGroupRows);
        EXPECT_EQ(at % (kGroupRows * row_bytes),
                  q * 1024U + i * chunk_blocks(k, q) * 16U + (k_at % kLayoutChunk) / 2);
        for (int j = 0; j < 16; ++j) ++covered[at + j];
        for (int word = 0; word < 4; ++word) {
          std::uint32_t got = 0;
          std::uint32_t want = 0;
          std::memcpy(&got, device.data() + at + 4 * word, 4);
          std::memcpy(&want, natural.data() + row * row_bytes + k_at / 2 + 4 * word, 4);
          EXPECT_EQ(got, to_device_word(want)) << "k " << k << " row " << row << " at " << k_at;
        }
      }
    }
    for (std::size_t b = 0; b < covered.size(); ++b) ASSERT_EQ(covered[b], 1) << "k " << k;
  }
  EXPECT_EQ(chunk_blocks(2880, 22), 2);
  EXPECT_EQ(chunk_blocks(2880, 21), 4);
}

TEST(Mxfp4DeviceLayout, WordConversionConvertsEveryWord) {
  std::vector<std::uint8_t> bytes(64);
  std::mt19937 rng(3);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  std::vector<std::uint8_t> converted = bytes;
  to_device_words_host(converted.data(), converted.size());
  for (std::size_t i = 0; i < bytes.size(); i += 4) {
    const std::uint32_t w = bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) |
                            (static_cast<std::uint32_t>(bytes[i + 3]) << 24);
    const std::uint32_t d = converted[i] | (converted[i + 1] << 8) | (converted[i + 2] << 16) |
                            (static_cast<std::uint32_t>(converted[i + 3]) << 24);
    EXPECT_EQ(d, to_device_word(w)) << i;
  }
}

}  // namespace
}  // namespace mxq::moe::gpu::detail
