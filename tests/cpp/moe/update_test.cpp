// Weight-update sessions: an update equals a fresh load bit for bit, reuses the parameter
// storage, re-establishes the padding, and rejects bad tensors without changing anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "moe_test_util.h"
#include "mxq/core/prng.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe {
namespace {

using testing::error_of;

struct Snapshot {
  std::vector<std::vector<std::uint8_t>> bytes;
  std::vector<void*> addresses;
  std::vector<std::int64_t> widths;
};

Snapshot snapshot(const MoeLayer& layer) {
  Snapshot s;
  for (int r = 0; r < layer.num_ranks(); ++r) {
    s.widths.push_back(layer.rank(r).shape().intermediate_size_per_partition_after_pad);
    for (MoeParam param : kAllMoeParams) {
      if (!layer.rank(r).has(param)) continue;
      s.bytes.push_back(testing::bytes_of(layer.rank(r).view(param)));
      s.addresses.push_back(layer.rank(r).view(param).data());
    }
  }
  s.bytes.push_back(testing::bytes_of(layer.router_weight()));
  s.addresses.push_back(layer.router_weight().data());
  s.bytes.push_back(testing::bytes_of(layer.router_bias()));
  return s;
}

class UpdateSession : public ::testing::Test {
 protected:
  void SetUp() override {
    old_dir_ = std::make_unique<testing::TempDir>("old");
    new_dir_ = std::make_unique<testing::TempDir>("new");
    native_dir_ = std::make_unique<testing::TempDir>("native");
    write_synthetic_checkpoint(old_dir_->path(), testing::small_spec(1));
    write_synthetic_checkpoint(new_dir_->path(), testing::small_spec(2));
    SyntheticSpec native = testing::small_spec(2);
    native.layout = CheckpointLayout::kNative;
    write_synthetic_checkpoint(native_dir_->path(), native);
    old_ = MoeCheckpoint::open(old_dir_->path());
    new_ = MoeCheckpoint::open(new_dir_->path());
    new_native_ = MoeCheckpoint::open(native_dir_->path());
    config_ = old_.resolve_config(0);
    shards_.tp_size = 2;
    shards_.ep_size = 2;
  }
  MoeLayer fresh(const MoeCheckpoint& checkpoint) const {
    MoeLayer layer = MoeLayer::load(checkpoint, 0, config_, shards_);
    (void)layer.prepare(128);
    return layer;
  }
  // Every tensor of layer 0, shuffled deterministically.
  static std::vector<std::string> shuffled_names(const MoeCheckpoint& checkpoint,
                                                 const MoeConfig& config, std::uint64_t seed) {
    std::vector<std::string> names;
    for (const MoeTensorName& name : required_tensor_names(config, 0, checkpoint.layout(0))) {
      names.push_back(format_tensor_name(name));
    }
    Xoshiro256 rng(seed);
    for (std::size_t i = names.size(); i > 1; --i) {
      std::swap(names[i - 1], names[rng.next() % i]);
    }
    return names;
  }
  std::unique_ptr<testing::TempDir> old_dir_, new_dir_, native_dir_;
  MoeCheckpoint old_, new_, new_native_;
  MoeConfig config_;
  ShardOptions shards_;
};

TEST_F(UpdateSession, EqualsAFreshLoadBitForBitAndReusesTheStorage) {
  for (const MoeCheckpoint* source : {&new_, &new_native_}) {
    MoeLayer layer = fresh(old_);
    const Snapshot before = snapshot(layer);
    const Tensor x = synthetic_tokens(9, config_.hidden_size, 8);
    const MoeForwardResult old_output = layer.forward(x);

    layer.begin_update();
    EXPECT_TRUE(layer.updating());
    EXPECT_FALSE(layer.prepared());
    EXPECT_EQ(layer.intermediate_size_per_partition_after_pad(), 64);  // restored to the TP width
    const std::vector<std::string> names = shuffled_names(*source, config_, 42);
    // Three buckets of different sizes.
    const std::size_t cut1 = names.size() / 5;
    const std::size_t cut2 = names.size() / 2;
    for (std::size_t i = 0; i < names.size(); ++i) {
      layer.load(names[i], source->view(names[i]));
      if (i == cut1 || i == cut2) {
        EXPECT_TRUE(layer.updating());
      }
    }
    layer.end_update();
    EXPECT_TRUE(layer.prepared());
    EXPECT_EQ(layer.intermediate_size_per_partition_after_pad(), 128);

    const MoeLayer expected = fresh(*source);
    testing::expect_same_weights(layer, expected);
    const Snapshot after = snapshot(layer);
    EXPECT_EQ(after.addresses, before.addresses);  // storage reused
    EXPECT_NE(after.bytes, before.bytes);          // and the weights did change
    const MoeForwardResult new_output = layer.forward(x);
    EXPECT_TRUE(testing::same_bits(new_output.output, expected.forward(x).output));
    EXPECT_FALSE(testing::same_bits(new_output.output, old_output.output));
  }
}

TEST_F(UpdateSession, AnEmptyLayerFilledByUpdatesEqualsAFreshLoad) {
  MoeLayer layer = MoeLayer::create(config_, 0, shards_);
  layer.begin_update();
  for (const std::string& name : shuffled_names(new_native_, config_, 7)) {
    layer.load(name, new_native_.view(name));
  }
  layer.end_update();
  EXPECT_FALSE(layer.prepared());  // it was never prepared
  (void)layer.prepare(128);
  testing::expect_same_weights(layer, fresh(new_));
}

TEST_F(UpdateSession, PaddingIsReestablishedAfterAnUpdate) {
  MoeLayer layer = fresh(old_);
  const Snapshot prepared = snapshot(layer);
  layer.begin_update();
  layer.end_update();  // an empty update
  const Snapshot again = snapshot(layer);
  EXPECT_EQ(again.bytes, prepared.bytes);
  EXPECT_EQ(again.addresses, prepared.addresses);
}

TEST_F(UpdateSession, PartialUpdatesTouchOnlyTheirTensors) {
  MoeLayer layer = fresh(old_);
  const MoeLayer expected_experts = fresh(old_);
  layer.begin_update();
  const std::string router = format_tensor_name({0, MoeTensorKind::kRouterWeight, -1});
  layer.load(router, new_.view(router));
  layer.end_update();
  EXPECT_TRUE(testing::same_bits(layer.router_weight(), fresh(new_).router_weight()));
  for (int r = 0; r < layer.num_ranks(); ++r) {
    EXPECT_EQ(testing::bytes_of(layer.rank(r).w13()),
              testing::bytes_of(expected_experts.rank(r).w13()));
  }
}

TEST_F(UpdateSession, BadTensorsAreErrorsThatChangeNothing) {
  MoeLayer layer = fresh(old_);
  layer.begin_update();
  const std::string half = format_tensor_name({0, MoeTensorKind::kGateUpBlocks, -1});
  layer.load(half, new_.view(half));  // a real partial update first
  const Snapshot before = snapshot(layer);

  const std::string down_bias = format_tensor_name({0, MoeTensorKind::kDownBias, -1});
  const Tensor wrong_shape = Tensor::zeros(DType::kBF16, {6, 32});
  const Tensor wrong_dtype = Tensor::zeros(DType::kF32, {6, 64});
  const Tensor right_bias = Tensor::zeros(DType::kBF16, {6, 64});
  const struct {
    std::string name;
    const Tensor* tensor;
    std::string expected;
  } cases[] = {
      {"model.layers.0.mlp.experts.gate_proj", &right_bias, "unknown tensor"},
      {format_tensor_name({1, MoeTensorKind::kDownBias, -1}), &right_bias, "belongs to layer 1"},
      {format_tensor_name({0, MoeTensorKind::kExpertDownBias, 6}), &right_bias, "expert 6 of 6"},
      {down_bias, &wrong_shape, "expected shape [6, 64], found shape [6, 32]"},
      {down_bias, &wrong_dtype, "expected dtype bf16, found dtype f32"},
  };
  for (const auto& c : cases) {
    const std::string message = error_of([&] { layer.load(c.name, *c.tensor); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.name << ": " << message;
    const Snapshot after = snapshot(layer);
    EXPECT_EQ(after.bytes, before.bytes) << c.name;
    EXPECT_EQ(after.addresses, before.addresses) << c.name;
  }
  // Session misuse.
  EXPECT_NE(error_of([&] { layer.begin_update(); }).find("already in progress"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)layer.forward(synthetic_tokens(1, 64, 0)); }).find("end_update"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)layer.prepare(128); }).find("end_update"), std::string::npos);
  layer.end_update();
  EXPECT_NE(error_of([&] { layer.load(down_bias, right_bias); }).find("begin_update"),
            std::string::npos);
  EXPECT_NE(error_of([&] { layer.end_update(); }).find("without begin_update"), std::string::npos);
}

TEST_F(UpdateSession, BiasTensorsAreUnknownToALayerWithoutBiases) {
  MoeConfig config = config_;
  config.has_bias = false;
  MoeLayer layer = MoeLayer::create(config, 0, shards_);
  EXPECT_FALSE(layer.rank(0).has(MoeParam::kW13Bias));
  layer.begin_update();
  const std::string bias = format_tensor_name({0, MoeTensorKind::kGateUpBias, -1});
  EXPECT_NE(error_of([&] { layer.load(bias, new_.view(bias)); }).find("no biases"),
            std::string::npos);
  layer.end_update();
}

// What the GPU uploads rely on: a reader's lock keeps every writer out until it is released, and
// no reader gets the lock while an update has the weights half-loaded.
TEST_F(UpdateSession, AReadersLockHoldsWritersOffAndIsRefusedDuringAnUpdate) {
  MoeLayer layer = fresh(old_);
  std::atomic<bool> updated{false};
  std::thread writer;
  {
    const auto reading = layer.lock_for_reading("a test reader");
    writer = std::thread([&] {
      layer.begin_update();
      updated = true;
    });
    // Long enough for an unblocked begin_update() to have finished many times over.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(updated.load()) << "an update began while a reader held the weights";
  }
  writer.join();
  ASSERT_TRUE(updated.load());
  EXPECT_NE(error_of([&] {
              (void)layer.lock_for_reading("a test reader");
            }).find("a test reader during a weight update"),
            std::string::npos);
  layer.end_update();
  EXPECT_NO_THROW((void)layer.lock_for_reading("a test reader"));
}

}  // namespace
}  // namespace mxq::moe
