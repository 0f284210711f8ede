// Whole-layer properties on small synthetic checkpoints: padding changes no bit of the output;
// every TP x EP split agrees within the fp32 summation bound (uneven splits of I included).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#include "moe_test_util.h"
#include "mxq/moe/compare.h"
#include "mxq/moe/footprint.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe {
namespace {

using testing::same_bits;

class SmallCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<testing::TempDir>("ckpt");
    write_synthetic_checkpoint(dir_->path(), testing::small_spec());
    checkpoint_ = MoeCheckpoint::open(dir_->path());
    config_ = checkpoint_.resolve_config(1);
    x_ = synthetic_tokens(13, config_.hidden_size, 3);
  }
  MoeLayer load(int tp, int ep) const {
    ShardOptions shards;
    shards.tp_size = tp;
    shards.ep_size = ep;
    return MoeLayer::load(checkpoint_, 1, config_, shards);
  }
  std::unique_ptr<testing::TempDir> dir_;
  MoeCheckpoint checkpoint_;
  MoeConfig config_;
  Tensor x_;
};

TEST_F(SmallCheckpoint, PaddedEqualsUnpaddedBitForBit) {
  for (int tp : {1, 2, 3}) {  // at most I / 32 = 3 ranks
    for (int ep : {1, 2}) {
      const MoeLayer unpadded = load(tp, ep);
      MoeLayer padded = load(tp, ep);
      const PaddingSummary summary = padded.prepare(128);
      EXPECT_EQ(padded.intermediate_size_per_partition_after_pad(), 128);
      EXPECT_GT(summary.after, summary.before);
      const MoeForwardResult a = unpadded.forward(x_);
      const MoeForwardResult b = padded.forward(x_);
      EXPECT_TRUE(same_bits(a.output, b.output)) << "tp " << tp << " ep " << ep;
      EXPECT_TRUE(same_bits(a.accumulator, b.accumulator)) << "tp " << tp << " ep " << ep;
      EXPECT_TRUE(same_bits(a.routing.ids, b.routing.ids));
      // Another alignment, then back to the checkpoint layout: still the same bits.
      (void)padded.prepare(64);
      EXPECT_TRUE(same_bits(a.output, padded.forward(x_).output));
      padded.restore_checkpoint_layout();
      EXPECT_TRUE(same_bits(a.output, padded.forward(x_).output));
    }
  }
}

TEST_F(SmallCheckpoint, EveryTpEpSplitAgreesWithinFp32SummationError) {
  const MoeLayer reference_layer = load(1, 1);
  const MoeForwardResult reference = reference_layer.forward(x_);
  // Non-trivial output: the comparison below must have something to compare.
  double norm = 0.0;
  for (std::int64_t i = 0; i < reference.output.numel(); ++i) {
    norm += std::fabs(reference.output.data_as<float>()[i]);
  }
  EXPECT_GT(norm / static_cast<double>(reference.output.numel()), 0.1);
  for (int tp : {1, 2, 3}) {  // at most I / 32 = 3 ranks
    for (int ep : {1, 2}) {
      MoeLayer layer = load(tp, ep);
      (void)layer.prepare(128);
      const MoeForwardResult result = layer.forward(x_);
      EXPECT_TRUE(same_bits(result.routing.ids, reference.routing.ids));
      const ForwardComparison comparison =
          compare_forward(result, layer.num_ranks(), reference, 1, config_.top_k);
      EXPECT_TRUE(comparison.within_fp32_summation_error())
          << "tp " << tp << " ep " << ep << ": " << comparison.beyond_bound
          << " beyond bound, ratio " << comparison.max_bound_ratio;
      // Independently of compare_forward: the accumulators are within 2^-19 of each other
      // relative to the magnitude (the bound is (2K + R + 5) 2^-24 <= 17 * 2^-24 here).
      for (std::int64_t i = 0; i < result.accumulator.numel(); ++i) {
        const double difference =
            std::fabs(static_cast<double>(result.accumulator.data_as<float>()[i]) -
                      reference.accumulator.data_as<float>()[i]);
        ASSERT_LE(difference, 0x1.0p-19 * reference.magnitude.data_as<float>()[i] * 1.01 + 1e-30)
            << "tp " << tp << " ep " << ep << " element " << i;
      }
      if (tp == 1 && ep == 1) {
        EXPECT_TRUE(comparison.bitwise_equal());
      }
    }
  }
}

TEST_F(SmallCheckpoint, TheComparisonDetectsARealDifference) {
  const MoeLayer layer = load(2, 1);
  const MoeForwardResult a = layer.forward(x_);
  const MoeForwardResult b = layer.forward(synthetic_tokens(13, config_.hidden_size, 4));
  const ForwardComparison comparison = compare_forward(a, 2, b, 2, config_.top_k);
  EXPECT_FALSE(comparison.within_fp32_summation_error());
  EXPECT_GT(comparison.beyond_bound, 0);
}

TEST_F(SmallCheckpoint, UnevenSplitsShardIAsDocumented) {
  // I = 96 = 3 blocks. TP = 2: widths 64, rank 1 holds 32 real channels + 32 zero-filled.
  const MoeLayer two = load(2, 1);
  EXPECT_EQ(two.rank(1).shape().tp.begin, 64);
  EXPECT_EQ(two.rank(1).shape().tp.valid, 32);
  EXPECT_EQ(two.rank(1).w13().shape(), (Shape{6, 128, 32}));
  // The zero fill: weights 0, scales 127, biases 0, in both halves.
  const auto* w13 = static_cast<const std::uint8_t*>(two.rank(1).w13().data());
  const auto* s13 = static_cast<const std::uint8_t*>(two.rank(1).w13_scale().data());
  for (std::int64_t e = 0; e < 6; ++e) {
    for (std::int64_t half = 0; half < 2; ++half) {
      for (std::int64_t c = 32; c < 64; ++c) {
        const std::int64_t row = e * 128 + half * 64 + c;
        for (int b = 0; b < 32; ++b) ASSERT_EQ(w13[row * 32 + b], 0);
        for (int b = 0; b < 2; ++b) ASSERT_EQ(s13[row * 2 + b], 127);
      }
    }
  }
  // TP = 4 exceeds the 3 blocks of 32 channels: every rank past the third would hold only zero
  // fill, so the layer refuses it by name before allocating anything.
  const std::string message = testing::error_of([&] { (void)load(4, 2); });
  EXPECT_NE(message.find("tp_size: expected at most 3"), std::string::npos) << message;
  // I = 128 (4 blocks) over TP = 3: width 64; rank 2 holds nothing (zero-filled only) and w2 bias
  // lives on rank 0.
  SyntheticSpec spec = testing::small_spec();
  spec.intermediate = 128;
  testing::TempDir dir("i128");
  write_synthetic_checkpoint(dir.path(), spec);
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(dir.path());
  ShardOptions shards;
  shards.tp_size = 3;
  shards.ep_size = 2;
  const MoeLayer three = MoeLayer::load(checkpoint, 1, checkpoint.resolve_config(1), shards);
  EXPECT_EQ(three.num_ranks(), 6);
  EXPECT_EQ(three.rank(2).shape().tp.width, 64);
  EXPECT_EQ(three.rank(2).shape().tp.valid, 0);
  EXPECT_EQ(three.rank(3).shape().ep.begin, 3);
  const auto bias_bytes = testing::bytes_of(three.rank(1).w2_bias());
  EXPECT_TRUE(std::all_of(bias_bytes.begin(), bias_bytes.end(), [](auto b) { return b == 0; }));
  const auto bias0 = testing::bytes_of(three.rank(0).w2_bias());
  EXPECT_FALSE(std::all_of(bias0.begin(), bias0.end(), [](auto b) { return b == 0; }));
  // The empty rank adds exactly nothing: the split equals TP = 1 within fp32 summation error.
  const Tensor x = synthetic_tokens(5, spec.hidden, 3);
  const MoeLayer one = MoeLayer::load(checkpoint, 1, checkpoint.resolve_config(1), {});
  EXPECT_TRUE(compare_forward(three.forward(x), 6, one.forward(x), 1, spec.top_k)
                  .within_fp32_summation_error());
}

TEST_F(SmallCheckpoint, AForcedSplitMustBeAMultipleOf32) {
  ShardOptions shards;
  shards.tp_size = 2;
  shards.intermediate_per_rank = 48;
  const std::string message =
      testing::error_of([&] { (void)MoeLayer::load(checkpoint_, 1, config_, shards); });
  EXPECT_NE(message.find("intermediate_per_rank"), std::string::npos) << message;
  EXPECT_NE(message.find("multiple of 32"), std::string::npos) << message;
  // A valid forced split (wider than needed) still gives the TP = 1 answer.
  shards.intermediate_per_rank = 64;
  const MoeLayer forced = MoeLayer::load(checkpoint_, 1, config_, shards);
  const ForwardComparison comparison =
      compare_forward(forced.forward(x_), 2, load(1, 1).forward(x_), 1, config_.top_k);
  EXPECT_TRUE(comparison.within_fp32_summation_error());
}

TEST_F(SmallCheckpoint, SplitSizesBelowOneAreRefusedByName) {
  for (const auto& [tp, ep, name] : {std::tuple{0, 1, "tp_size"}, std::tuple{-1, 1, "tp_size"},
                                     std::tuple{1, 0, "ep_size"}, std::tuple{1, -2, "ep_size"}}) {
    ShardOptions shards;
    shards.tp_size = tp;
    shards.ep_size = ep;
    const std::string message =
        testing::error_of([&] { (void)MoeLayer::load(checkpoint_, 1, config_, shards); });
    EXPECT_NE(message.find(std::string(name) + ": expected >= 1"), std::string::npos) << message;
  }
}

TEST_F(SmallCheckpoint, RankShapesWithoutLoadingAreTheLoadedLayers) {
  // What a process that loads only its own rank reports for every rank (mxq moe under a launcher).
  for (const auto& [tp, ep, forced] :
       {std::tuple{1, 1, 0}, std::tuple{2, 1, 0}, std::tuple{3, 2, 0}, std::tuple{2, 3, 64}}) {
    const ShardOptions shards{tp, ep, forced};
    MoeLayer layer = MoeLayer::load(checkpoint_, 1, config_, shards);
    for (const std::int64_t alignment : {std::int64_t{0}, std::int64_t{128}}) {
      if (alignment != 0) (void)layer.prepare(alignment);
      const std::vector<MoeRankShape> shapes = layer_rank_shapes(config_, shards, alignment);
      ASSERT_EQ(static_cast<int>(shapes.size()), layer.num_ranks());
      for (int r = 0; r < layer.num_ranks(); ++r) {
        const MoeRankShape& got = shapes[static_cast<std::size_t>(r)];
        const MoeRankShape& want = layer.rank(r).shape();
        const std::string what = "tp " + std::to_string(tp) + " ep " + std::to_string(ep) +
                                 " align " + std::to_string(alignment) + " rank " +
                                 std::to_string(r);
        EXPECT_EQ(got.tp, want.tp) << what;
        EXPECT_EQ(got.ep, want.ep) << what;
        EXPECT_EQ(got.hidden, want.hidden) << what;
        EXPECT_EQ(got.has_bias, want.has_bias) << what;
        EXPECT_EQ(got.intermediate_size_per_partition_after_pad,
                  want.intermediate_size_per_partition_after_pad)
            << what;
        EXPECT_EQ(got.alignment, want.alignment) << what;
        for (const MoeParam param : kAllMoeParams) {
          EXPECT_EQ(got.shape_of(param), want.shape_of(param)) << what;
        }
      }
    }
  }
}

TEST_F(SmallCheckpoint, ForwardIsIndependentOfTheThreadCount) {
  MoeLayer layer = load(2, 2);
  (void)layer.prepare(128);
  const MoeForwardResult a = layer.forward(x_);
  ::setenv("MXQ_NUM_THREADS", "1", 1);
  const MoeForwardResult b = layer.forward(x_);
  ::setenv("MXQ_NUM_THREADS", "3", 1);
  const MoeForwardResult c = layer.forward(x_);
  ::unsetenv("MXQ_NUM_THREADS");
  EXPECT_TRUE(same_bits(a.output, b.output));
  EXPECT_TRUE(same_bits(a.accumulator, c.accumulator));
}

}  // namespace
// An engine keeps its layers in a std::vector: that needs noexcept moves (a vector grows by
// copying otherwise, and a layer cannot be copied).
static_assert(std::is_nothrow_move_constructible_v<MoeLayer>);
static_assert(!std::is_copy_constructible_v<MoeLayer>);

TEST(MoeLayer, LayersLiveInAVector) {
  MoeConfig config;
  config.num_experts = 4;
  config.hidden_size = 64;
  config.intermediate_size = 64;
  config.top_k = 2;
  std::vector<MoeLayer> layers;
  for (std::int64_t l = 0; l < 3; ++l) layers.push_back(MoeLayer::create(config, l));
  ASSERT_EQ(layers.size(), 3U);
  EXPECT_EQ(layers[2].layer_index(), 2);
  EXPECT_EQ(layers[0].forward(Tensor::zeros(DType::kF32, {1, 64})).output.shape(), Shape({1, 64}));
}

}  // namespace mxq::moe
