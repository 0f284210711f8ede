// The W4A8 device layouts (src/moe/layout/w4a8_layout.h) on the host: the word's bit map is a
// permutation that round-trips, registers A and B hold every code of every position as the E4M3
// byte worth exactly e2m1 * 2^-6 (decode_mma's table) and e2m1 * 2^(6 - e) for every folded
// shift e (the wgmma GEMMs' tables), the word order puts lane c's words of a chunk together (full
// and short chunks), both activation orders are permutations of each chunk (the wgmma one in the
// instruction's K order), the scale helpers give 2^(s - 121) on the fast path and 2^(s - 127)
// exactly on the other, with the large-scale test exact on every byte at every position, and the
// chunk fold finds the largest scale, the shifts and the chunks that cannot fold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "moe/layout/w4a8_layout.h"
#include "mxq/formats/e2m1.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/e8m0.h"

namespace mxq::moe::gpu::detail {
namespace {

float bits_to_float(std::uint32_t bits) {
  float f = 0.0F;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The word `natural` with `code` at `position` and `fill`'s codes elsewhere.
std::uint32_t word_with_code(std::uint32_t fill, int position, std::uint32_t code) {
  return (fill & ~(0xFU << (4 * position))) | (code << (4 * position));
}

TEST(W4a8Layout, BitMapIsAPermutationAndRoundTrips) {
  std::set<int> bits;
  for (int e = 0; e < 8; ++e)
    for (int b = 0; b < 4; ++b) bits.insert(w4a8_bit(e, b));
  EXPECT_EQ(bits.size(), 32U);
  EXPECT_EQ(*bits.rbegin(), 31);
  std::mt19937 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const std::uint32_t w = rng();
    EXPECT_EQ(from_w4a8_word(to_w4a8_word(w)), w);
    EXPECT_EQ(to_w4a8_word(from_w4a8_word(w)), w);
  }
}

TEST(W4a8Layout, RegistersHoldEveryCodeAsE4m3TimesTwoToMinus6) {
  for (int position = 0; position < 8; ++position) {
    for (std::uint32_t code = 0; code < 16; ++code) {
      // The code at `position`, other positions filled with a different pattern each time.
      for (const std::uint32_t fill : {0x00000000U, 0xFFFFFFFFU, 0x5A3C96E1U}) {
        const std::uint32_t w = to_w4a8_word(word_with_code(fill, position, code));
        const std::uint32_t reg = position < 4 ? w4a8_register_a(w) : w4a8_register_b(w);
        const auto byte = static_cast<std::uint8_t>(reg >> (8 * (position % 4)));
        const float expected = e2m1_to_float(static_cast<std::uint8_t>(code)) / 64.0F;
        EXPECT_EQ(e4m3_to_float(byte), expected) << "position " << position << " code " << code;
        EXPECT_EQ(std::signbit(e4m3_to_float(byte)), code >= 8U);  // -0.0 stays -0.0
      }
    }
  }
}

TEST(W4a8Layout, FoldedTablesHoldEveryCodeExactly) {
  for (std::uint32_t e = 0; e <= kW4a8MaxFoldShift; ++e) {
    const W4a8Table table = w4a8_folded_table(e);
    for (int position = 0; position < 8; ++position) {
      for (std::uint32_t code = 0; code < 16; ++code) {
        for (const std::uint32_t fill : {0x00000000U, 0xFFFFFFFFU, 0x5A3C96E1U}) {
          const std::uint32_t w = to_w4a8_word(word_with_code(fill, position, code));
          const std::uint32_t reg =
              position < 4 ? w4a8_register_a(w, table) : w4a8_register_b(w, table);
          const auto byte = static_cast<std::uint8_t>(reg >> (8 * (position % 4)));
          const float expected =
              std::ldexp(e2m1_to_float(static_cast<std::uint8_t>(code)), 6 - static_cast<int>(e));
          EXPECT_EQ(e4m3_to_float(byte), expected) << "e " << e << " code " << code;
          EXPECT_EQ(std::signbit(e4m3_to_float(byte)), code >= 8U);
          // The byte the codec gives for that value (the table is not merely numerically equal).
          EXPECT_EQ(byte, float_to_e4m3(expected, Fp8Saturation::kSatFinite));
        }
      }
    }
  }
  // The decode_mma table is the t = -6 one.
  for (std::uint32_t code = 0; code < 8; ++code) {
    const std::uint32_t reg = w4a8_register_a(to_w4a8_word(code), kW4a8TableTimes2m6);
    EXPECT_EQ(e4m3_to_float(static_cast<std::uint8_t>(reg)),
              e2m1_to_float(static_cast<std::uint8_t>(code)) / 64.0F);
  }
}

// w4a8_registers (one mask for both selectors) gives register A and B of every word and table.
TEST(W4a8Layout, BothRegistersOfAWordAtOnce) {
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    const std::uint32_t w = rng();
    const W4a8Table table =
        i % 13 == 12 ? kW4a8TableTimes2m6 : w4a8_folded_table(static_cast<std::uint32_t>(i % 12));
    std::uint32_t a = 0;
    std::uint32_t b = 0;
    w4a8_registers(w, table, a, b);
    ASSERT_EQ(a, w4a8_register_a(w, table)) << std::hex << w;
    ASSERT_EQ(b, w4a8_register_b(w, table)) << std::hex << w;
  }
}

// wgmma's A fragment of m64nNk32 E4M3: lane c's register A is k = 4c .. 4c + 3 of the
// instruction, register B k = 16 + 4c .. + 3; its word c holds block elements 8c .. 8c + 7.
TEST(W4a8Layout, WgmmaActivationOffsetsFollowTheInstructionK) {
  for (const int k : {128, 2880, 544, 32}) {
    std::set<int> seen;
    for (int e = 0; e < w4a8_act_pitch(k); ++e) {
      const int at = w4a8_wgmma_act_offset(e);
      EXPECT_EQ(at / 32, e / 32);  // stays in its MX block
      seen.insert(at);
      const int c = (e % 32) / 8;
      const int i = e % 8;
      const int instruction_k = i < 4 ? 4 * c + i : 16 + 4 * c + (i - 4);
      EXPECT_EQ(at % 32, instruction_k);
    }
    EXPECT_EQ(static_cast<int>(seen.size()), w4a8_act_pitch(k));
  }
  EXPECT_EQ(w4a8_wgmma_scale_pitch(1), 4U);
  EXPECT_EQ(w4a8_wgmma_scale_pitch(8), 8U);
  EXPECT_EQ(w4a8_wgmma_scale_pitch(9), 12U);
}

TEST(W4a8Layout, ChunkFold) {
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) {
    // Scales near each other most of the time, so both outcomes are common.
    const std::uint32_t base = rng() % 256;
    std::uint32_t packed = 0;
    for (int b = 0; b < 4; ++b) {
      const std::uint32_t s =
          i % 3 == 0 ? rng() % 256 : std::min<std::uint32_t>(255U, base + rng() % 14);
      packed |= s << (8 * b);
    }
    const int nb = 1 + static_cast<int>(rng() % 4);
    std::uint32_t m = 0;
    for (int b = 0; b < nb; ++b) m = std::max(m, (packed >> (8 * b)) & 0xFFU);
    bool folds = true;
    std::uint32_t shifts = 0;
    for (int b = 0; b < nb; ++b) {
      const std::uint32_t e = m - ((packed >> (8 * b)) & 0xFFU);
      folds = folds && e <= kW4a8MaxFoldShift;
      shifts |= e << (8 * b);
    }
    const W4a8ChunkFold fold = w4a8_fold_chunk(packed, nb);
    ASSERT_EQ(fold.max_scale, m) << std::hex << packed << " nb " << nb;
    ASSERT_EQ(fold.shifts, shifts) << std::hex << packed << " nb " << nb;
    ASSERT_EQ(fold.folds, folds) << std::hex << packed << " nb " << nb;
  }
  EXPECT_TRUE(w4a8_fold_chunk(0x7F7F7F74U, 4).folds);   // shift 11
  EXPECT_FALSE(w4a8_fold_chunk(0x7F7F7F73U, 4).folds);  // shift 12
  EXPECT_TRUE(w4a8_fold_chunk(0x00007F7FU, 2).folds);   // the missing blocks do not count
  EXPECT_FALSE(w4a8_fold_chunk(0xFF7F7F7FU, 4).folds);  // a NaN scale: one factor per block
}

// The wgmma GEMMs' arithmetic on one 128-wide chunk of 16 rows, emulated on the host: lane c's
// registers A and B of each MX block (its device word, the block's folded table) times the
// activations at the instruction's K positions (the wgmma order), summed over lanes and blocks,
// times the row's factor 2^(max - 133), equal the dot product of the dequantized weights with the
// activations — for chunks that fold and, with shift 0 and one factor per block, for those that
// do not. Every product is exact; where the chunk folds, its terms span few enough binades that
// the double sums are exact too, elsewhere they agree to double rounding of the magnitudes.
TEST(W4a8Layout, FoldedChunkProductEqualsTheDotProduct) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int nb = 1 + trial % 4;  // a full chunk, or a short last one
    const int k = 32 * nb;
    std::vector<std::uint8_t> natural(kGroupRows * k / 2);
    for (auto& b : natural) b = static_cast<std::uint8_t>(rng());
    std::vector<std::uint8_t> device = natural;
    to_w4a8_layout_host(device.data(), kGroupRows, k);
    // Activations: E4M3 codes (no NaN) in natural order and at their wgmma positions.
    std::vector<std::uint8_t> x(k);
    std::vector<std::uint8_t> x_wgmma(k);
    for (int i = 0; i < k; ++i) {
      std::uint8_t code = static_cast<std::uint8_t>(rng());
      if ((code & 0x7F) == 0x7F) code = 0x7E;
      x[i] = code;
      x_wgmma[w4a8_wgmma_act_offset(i)] = code;
    }
    for (int row = 0; row < kGroupRows; ++row) {
      std::uint32_t packed = 0;
      for (int b = 0; b < nb; ++b) {
        const std::uint32_t s = trial % 5 == 0 ? rng() % 256 : 110 + rng() % 14;
        packed |= (s == 255 ? 254U : s) << (8 * b);
      }
      double want = 0.0;
      double magnitude = 0.0;
      for (int i = 0; i < k; ++i) {
        const std::uint8_t byte = natural[row * k / 2 + i / 2];
        const auto code = static_cast<std::uint8_t>(i % 2 == 0 ? byte & 0xF : byte >> 4);
        const int s = static_cast<int>((packed >> (8 * (i / 32))) & 0xFFU);
        const double term = static_cast<double>(e2m1_to_float(code)) * std::ldexp(1.0, s - 127) *
                            e4m3_to_float(x[i]);
        want += term;
        magnitude += std::fabs(term);
      }
      const W4a8ChunkFold fold = w4a8_fold_chunk(packed, nb);
      const std::uint8_t* words = device.data() + group_offset(k, 0, row);
      double got = 0.0;
      for (int b = 0; b < nb; ++b) {
        const std::uint32_t shift = fold.folds ? (fold.shifts >> (8 * b)) & 0xFFU : 0U;
        const W4a8Table table = w4a8_folded_table(shift);
        double block = 0.0;
        for (int c = 0; c < 4; ++c) {
          std::uint32_t w = 0;
          std::memcpy(&w, words + 4 * (c * nb + b), 4);
          const std::uint32_t regs[2] = {w4a8_register_a(w, table), w4a8_register_b(w, table)};
          for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 4; ++i) {
              const int instruction_k = 16 * h + 4 * c + i;
              block += static_cast<double>(
                           e4m3_to_float(static_cast<std::uint8_t>(regs[h] >> (8 * i)))) *
                       e4m3_to_float(x_wgmma[32 * b + instruction_k]);
            }
        }
        const int s = static_cast<int>(fold.folds ? fold.max_scale : (packed >> (8 * b)) & 0xFFU);
        got += block * std::ldexp(1.0, s - 133);
      }
      if (fold.folds) {
        ASSERT_EQ(got, want) << "trial " << trial << " row " << row;
      } else {
        ASSERT_LE(std::fabs(got - want), 1e-13 * magnitude) << "trial " << trial << " row " << row;
      }
    }
  }
}

// Row groups of 16 rows, chunk-major: lane c's words of row i of a chunk lie together, the rows
// of a chunk one after the other (a tile chunk is one contiguous piece), the group in its rows'
// bytes.
TEST(W4a8Layout, LaneWordsOfAChunkAreContiguous) {
  for (const int k : {128, 256, 32, 64, 96, 2880, 544}) {
    const std::size_t rows = 2 * kGroupRows;
    const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
    std::vector<std::uint8_t> natural(rows * row_bytes);
    std::mt19937 rng(static_cast<unsigned>(k));
    for (auto& b : natural) b = static_cast<std::uint8_t>(rng());
    std::vector<std::uint8_t> device = natural;
    to_w4a8_layout_host(device.data(), rows, k);
    for (std::size_t r = 0; r < rows; ++r) {
      for (int q = 0; q * kW4a8Chunk < k; ++q) {
        const int nb = chunk_blocks(k, q);
        ASSERT_GE(nb, 1);
        for (int c = 0; c < 4; ++c) {
          for (int b = 0; b < nb; ++b) {
            // Lane c's b-th word of the chunk is word c of MX block b.
            std::uint32_t got = 0;
            std::uint32_t want = 0;
            const std::size_t group = r / kGroupRows;
            const int i = static_cast<int>(r % kGroupRows);
            const std::size_t at = group * kGroupRows * row_bytes + group_offset(k, q, i);
            EXPECT_EQ(at % 16, 0U);
            EXPECT_EQ(group_offset(k, q, i), q * 1024U + i * nb * 16U);
            std::memcpy(&got, device.data() + at + 4 * (c * nb + b), 4);
            std::memcpy(
                &want,
                natural.data() + r * row_bytes + static_cast<std::size_t>(q) * 64 + 16 * b + 4 * c,
                4);
            EXPECT_EQ(from_w4a8_word(got), want) << "k " << k << " chunk " << q;
          }
        }
      }
    }
  }
}

TEST(W4a8Layout, ActivationOffsetsPermuteEachChunk) {
  for (const int k : {128, 2880, 544, 32}) {
    const int pitch = w4a8_act_pitch(k);
    EXPECT_EQ(pitch % 128, 0);
    EXPECT_GE(pitch, k);
    EXPECT_EQ(w4a8_act_groups(k), pitch / 128);
    std::set<int> seen;
    for (int e = 0; e < pitch; ++e) {
      const int at = w4a8_act_offset(e);
      EXPECT_EQ(at / 128, e / 128);  // stays in its chunk (= its scale group)
      seen.insert(at);
      // Lane c's 8 values of block b: bytes 32c + 8b .. + 7 of the chunk.
      const int r = e % 128;
      EXPECT_EQ(at % 128, 32 * ((r % 32) / 8) + 8 * (r / 32) + r % 8);
    }
    EXPECT_EQ(static_cast<int>(seen.size()), pitch);
  }
}

TEST(W4a8Layout, ScaleFactors) {
  for (std::uint32_t s = 0; s < 256; ++s) {
    // Exact path: 2^(s - 127) as the E8M0 codec says (NaN for 255).
    const float exact = bits_to_float(w4a8_exact_scale_bits(s));
    const float codec = e8m0_to_float(static_cast<std::uint8_t>(s));
    if (s == 255U) {
      EXPECT_TRUE(std::isnan(exact));
    } else {
      EXPECT_EQ(exact, codec) << s;
    }
    for (int position = 0; position < 4; ++position) {
      // The large-scale test flags exactly the bytes above 248, wherever they sit.
      const std::uint32_t others = 0x7F7F7F7FU & ~(0xFFU << (8 * position));
      const std::uint32_t packed = others | (s << (8 * position));
      EXPECT_EQ(w4a8_any_large_scale(packed), s > 248U) << s << " at " << position;
      EXPECT_FALSE(w4a8_any_large_scale(0xF8F8F8F8U & ~(0xFFU << (8 * position))));
      if (s > 248U) continue;
      // Fast path: 2^(s - 121) = 2^(s - 127) * 64, s = 0 included.
      const std::uint32_t biased = packed + kW4a8ScaleBias;
      std::uint32_t bits = 0;
      switch (position) {
        case 0:
          bits = w4a8_fast_factor_bits<0>(biased);
          break;
        case 1:
          bits = w4a8_fast_factor_bits<1>(biased);
          break;
        case 2:
          bits = w4a8_fast_factor_bits<2>(biased);
          break;
        default:
          bits = w4a8_fast_factor_bits<3>(biased);
          break;
      }
      EXPECT_EQ(bits_to_float(bits), std::ldexp(1.0F, static_cast<int>(s) - 121)) << s;
    }
  }
}

}  // namespace
}  // namespace mxq::moe::gpu::detail
