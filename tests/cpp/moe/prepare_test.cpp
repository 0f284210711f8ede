// Padding a rank's weights: layout, fill values, the one owner of I_rank, idempotence,
// reversibility and address stability.
#include "mxq/moe/prepare.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/moe/rank_weights.h"

namespace mxq::moe {
namespace {

std::uint8_t pattern(MoeParam param, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131 + static_cast<std::size_t>(param) * 17 + 1) % 251);
}

// Fills every parameter (checkpoint layout) with a distinct pattern and returns the bytes.
std::vector<std::vector<std::uint8_t>> fill_patterns(const MoeRankWeights& w) {
  std::vector<std::vector<std::uint8_t>> bytes;
  for (MoeParam param : kAllMoeParams) {
    if (!w.has(param)) {
      bytes.emplace_back();
      continue;
    }
    const TensorView view = w.view(param);
    std::vector<std::uint8_t> data(view.nbytes());
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = pattern(param, i);
    std::memcpy(view.data(), data.data(), data.size());
    bytes.push_back(std::move(data));
  }
  return bytes;
}

std::vector<std::uint8_t> bytes_of(const TensorView& view) {
  const auto* p = static_cast<const std::uint8_t*>(view.data());
  return {p, p + view.nbytes()};
}

TEST(Prepare, PadsGateAndUpHalvesSeparatelyWithZeroWeightsAndUnitScales) {
  const std::int64_t hidden = 64;
  const TpShard tp = tp_shard(192, 2, 0);  // width 96
  const EpShard ep = ep_shard(3, 1, 0);
  MoeRankWeights w(hidden, true, tp, ep);
  const auto original = fill_patterns(w);
  const auto report = w.pad_intermediate_to_alignment(128);
  EXPECT_EQ(report.before, 96);
  EXPECT_EQ(report.after, 128);
  EXPECT_TRUE(report.reallocated);
  EXPECT_EQ(w.shape().intermediate_size_per_partition_after_pad, 128);
  EXPECT_EQ(w.w13().shape(), (Shape{3, 256, 32}));
  EXPECT_EQ(w.w13_scale().shape(), (Shape{3, 256, 2}));
  EXPECT_EQ(w.w2().shape(), (Shape{3, 64, 64}));
  EXPECT_EQ(w.w2_scale().shape(), (Shape{3, 64, 4}));
  EXPECT_EQ(w.w13_bias().shape(), (Shape{3, 256}));
  EXPECT_EQ(w.w2_bias().shape(), (Shape{3, 64}));
  EXPECT_EQ(w.w13_scale().dtype(), DType::kE8M0);

  // w13: row r of expert e, half h (0 gate, 1 up), channel c.
  const auto* w13 = static_cast<const std::uint8_t*>(w.w13().data());
  const auto* s13 = static_cast<const std::uint8_t*>(w.w13_scale().data());
  const auto& w13_in = original[0];
  const auto& s13_in = original[1];
  for (int e = 0; e < 3; ++e) {
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 128; ++c) {
        const std::size_t row = static_cast<std::size_t>(e * 256 + h * 128 + c);
        for (int b = 0; b < 32; ++b) {
          const std::uint8_t expected =
              c < 96 ? w13_in[static_cast<std::size_t>((e * 192 + h * 96 + c) * 32 + b)] : 0;
          ASSERT_EQ(w13[row * 32 + static_cast<std::size_t>(b)], expected)
              << "e " << e << " half " << h << " channel " << c;
        }
        for (int b = 0; b < 2; ++b) {
          const std::uint8_t expected =
              c < 96 ? s13_in[static_cast<std::size_t>((e * 192 + h * 96 + c) * 2 + b)] : 127;
          ASSERT_EQ(s13[row * 2 + static_cast<std::size_t>(b)], expected);
        }
      }
    }
  }
  // w2: row (e, h) has 48 real bytes then 16 zero bytes; scales 3 real then one 127.
  const auto* w2 = static_cast<const std::uint8_t*>(w.w2().data());
  const auto* s2 = static_cast<const std::uint8_t*>(w.w2_scale().data());
  for (std::size_t row = 0; row < 3 * 64; ++row) {
    for (std::size_t b = 0; b < 64; ++b) {
      ASSERT_EQ(w2[row * 64 + b], b < 48 ? original[2][row * 48 + b] : 0);
    }
    for (std::size_t b = 0; b < 4; ++b) {
      ASSERT_EQ(s2[row * 4 + b], b < 3 ? original[3][row * 3 + b] : 127);
    }
  }
  // Biases: gate/up halves padded with bf16 zeros, w2 bias untouched.
  const auto* b13 = static_cast<const std::uint16_t*>(w.w13_bias().data());
  const auto* b13_in = reinterpret_cast<const std::uint16_t*>(original[4].data());
  for (int e = 0; e < 3; ++e) {
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 128; ++c) {
        ASSERT_EQ(b13[e * 256 + h * 128 + c], c < 96 ? b13_in[e * 192 + h * 96 + c] : 0);
      }
    }
  }
  EXPECT_EQ(bytes_of(w.w2_bias()), original[5]);
}

TEST(Prepare, IsIdempotentReversibleAndKeepsAddressesAfterTheFirstBuild) {
  MoeRankWeights w(64, true, tp_shard(96, 1, 0), ep_shard(2, 1, 0));
  const auto original = fill_patterns(w);
  (void)w.pad_intermediate_to_alignment(128);
  std::vector<std::vector<std::uint8_t>> padded;
  std::vector<void*> addresses;
  for (MoeParam param : kAllMoeParams) {
    padded.push_back(bytes_of(w.view(param)));
    addresses.push_back(w.view(param).data());
  }
  // Idempotent: padding again changes nothing, not even the addresses.
  const auto again = w.pad_intermediate_to_alignment(128);
  EXPECT_FALSE(again.reallocated);
  for (std::size_t i = 0; i < kAllMoeParams.size(); ++i) {
    EXPECT_EQ(bytes_of(w.view(kAllMoeParams[i])), padded[i]);
    EXPECT_EQ(w.view(kAllMoeParams[i]).data(), addresses[i]);
  }
  // Reversible: restore gives the checkpoint bytes back, in the same storage.
  w.restore_checkpoint_layout();
  EXPECT_FALSE(w.shape().prepared());
  EXPECT_EQ(w.shape().intermediate_size_per_partition_after_pad, 96);
  for (std::size_t i = 0; i < kAllMoeParams.size(); ++i) {
    EXPECT_EQ(bytes_of(w.view(kAllMoeParams[i])), original[i]) << to_string(kAllMoeParams[i]);
    EXPECT_EQ(w.view(kAllMoeParams[i]).data(), addresses[i]);
  }
  w.restore_checkpoint_layout();  // restoring twice is a no-op
  EXPECT_EQ(bytes_of(w.w13()), original[0]);
  // Padding again in place re-establishes the same padded bytes at the same addresses.
  const auto third = w.pad_intermediate_to_alignment(128);
  EXPECT_FALSE(third.reallocated);
  for (std::size_t i = 0; i < kAllMoeParams.size(); ++i) {
    EXPECT_EQ(bytes_of(w.view(kAllMoeParams[i])), padded[i]);
    EXPECT_EQ(w.view(kAllMoeParams[i]).data(), addresses[i]);
  }
}

TEST(Prepare, PaddingAgainRewritesPaddingBytesThatWereOverwritten) {
  MoeRankWeights w(32, false, tp_shard(32, 1, 0), ep_shard(1, 1, 0));
  (void)fill_patterns(w);
  (void)w.pad_intermediate_to_alignment(64);
  const auto padded = bytes_of(w.w2_scale());
  auto* scales = static_cast<std::uint8_t*>(w.w2_scale().data());
  scales[1] = 0;  // a pad slot clobbered (e.g. by a row permutation)
  (void)w.pad_intermediate_to_alignment(64);
  EXPECT_EQ(bytes_of(w.w2_scale()), padded);
  EXPECT_FALSE(w.has(MoeParam::kW13Bias));
  EXPECT_THROW((void)w.w13_bias(), Error);
}

TEST(Prepare, ChangingTheAlignmentRestoresFirst) {
  MoeRankWeights w(32, false, tp_shard(96, 1, 0), ep_shard(1, 1, 0));
  const auto original = fill_patterns(w);
  (void)w.pad_intermediate_to_alignment(256);
  const auto report = w.pad_intermediate_to_alignment(64);
  EXPECT_EQ(report.after, 128);
  EXPECT_EQ(w.shape().intermediate_size_per_partition_after_pad, 128);
  EXPECT_EQ(w.shape().alignment, 64);
  w.restore_checkpoint_layout();
  EXPECT_EQ(bytes_of(w.w13()), original[0]);
  EXPECT_EQ(bytes_of(w.w2()), original[2]);
}

TEST(Prepare, AlignedWidthNeedsNoPadding) {
  MoeRankWeights w(32, false, tp_shard(256, 2, 1), ep_shard(1, 1, 0));
  const auto original = fill_patterns(w);
  const auto report = w.pad_intermediate_to_alignment(128);
  EXPECT_EQ(report.after, 128);
  EXPECT_FALSE(report.reallocated);
  EXPECT_EQ(bytes_of(w.w13()), original[0]);
}

TEST(Prepare, RejectsBadAlignment) {
  MoeRankWeights w(32, false, tp_shard(64, 1, 0), ep_shard(1, 1, 0));
  EXPECT_THROW((void)w.pad_intermediate_to_alignment(0), Error);
  EXPECT_THROW((void)w.pad_intermediate_to_alignment(48), Error);
  EXPECT_FALSE(w.shape().prepared());
}

TEST(PaddingSummary, StatesTheWastedFraction) {
  const PaddingSummary summary{2880, 2, 1440, 1536};
  EXPECT_NEAR(summary.wasted_fraction(), 1.0 - 2880.0 / 3072.0, 1e-12);
  EXPECT_NE(summary.message().find("1440 -> 1536"), std::string::npos);
  EXPECT_NE(summary.message().find("6.25%"), std::string::npos);
}

}  // namespace
}  // namespace mxq::moe
