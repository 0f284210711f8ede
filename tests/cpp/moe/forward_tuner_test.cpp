// MoeLayer::forward consulting a CPU autotuner: each rank runs the moe_expert_gemm tiling the
// cache holds for its problem (MoeLayer::tune_problem) and token bucket, reports it, and gives
// output bit-identical to the layer's own tiling; ranks and buckets the cache lacks keep the
// layer's tiling; a tuner of another backend is refused. The cache is written by hand with this
// machine's fingerprint so that the decisions are known (tuning picks whichever is fastest).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "moe_test_util.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/cache_file.h"
#include "mxq/tune/fingerprint.h"
#include "mxq/tune/registry.h"
#include "tune/tune_test_util.h"

namespace mxq::moe {
namespace {

using tune::testing::hand_written_entry;

std::unique_ptr<tune::Autotuner> tuner_with(const std::string& path,
                                            const std::vector<tune::CacheEntry>& entries) {
  tune::testing::write_cpu_cache(path, tune::builtin_tactics(), entries);
  return tune::testing::load_cpu_tuner(path);
}

class MoeForwardTuner : public ::testing::Test {
 protected:
  void SetUp() override {
    write_synthetic_checkpoint(dir_.path(), testing::small_spec());
    checkpoint_ = MoeCheckpoint::open(dir_.path());
    config_ = checkpoint_.resolve_config(1);
  }
  MoeLayer load(int tp) const {
    ShardOptions shards;
    shards.tp_size = tp;
    MoeLayer layer = MoeLayer::load(checkpoint_, 1, config_, shards);
    layer.prepare();
    return layer;
  }

  testing::TempDir dir_{"ckpt"};
  MoeCheckpoint checkpoint_;
  MoeConfig config_;
};

TEST_F(MoeForwardTuner, RanksRunTheCachedTilingWithIdenticalOutput) {
  const MoeLayer layer = load(2);
  // TP = 2 of I = 96: both ranks store 64 channels (one holds 32 valid), so one key serves both.
  ASSERT_EQ(layer.tune_problem(0), layer.tune_problem(1));
  const std::string tiled = "tiled[pairs=4,rows=8,threads=1]";
  ASSERT_NE(tune::builtin_tactics().find_tactic("moe_expert_gemm", tune::Backend::kCpu, tiled),
            nullptr);
  // Bucket 8 serves 5..8 tokens.
  const auto tuner =
      tuner_with(dir_.file("cache.json"), {hand_written_entry(layer.tune_problem(0), 8, tiled)});
  ASSERT_EQ(tuner->decisions().size(), 1U);

  const Tensor x = synthetic_tokens(7, config_.hidden_size, 3);
  const MoeForwardResult plain = layer.forward(x.view());
  const MoeForwardResult tuned = layer.forward(x.view(), nullptr, tuner.get());
  EXPECT_EQ(plain.rank_tactics, (std::vector<std::string>{"reference", "reference"}));
  EXPECT_EQ(plain.rank_tactics_from_cache, (std::vector<bool>{false, false}));
  EXPECT_EQ(tuned.rank_tactics, (std::vector<std::string>{tiled, tiled}));
  EXPECT_EQ(tuned.rank_tactics_from_cache, (std::vector<bool>{true, true}));
  EXPECT_TRUE(testing::same_bits(plain.output, tuned.output));
  EXPECT_TRUE(testing::same_bits(plain.accumulator, tuned.accumulator));

  // 9 tokens fall in bucket 16, which the cache lacks: the layer's own tiling.
  const Tensor x9 = synthetic_tokens(9, config_.hidden_size, 4);
  const MoeForwardResult other = layer.forward(x9.view(), nullptr, tuner.get());
  EXPECT_EQ(other.rank_tactics, (std::vector<std::string>{"reference", "reference"}));
  EXPECT_EQ(other.rank_tactics_from_cache, (std::vector<bool>{false, false}));

  // A layer of another shape has another key: the entry does not serve it.
  const MoeLayer whole = load(1);
  ASSERT_NE(whole.tune_problem(0), layer.tune_problem(0));
  EXPECT_EQ(whole.forward(x.view(), nullptr, tuner.get()).rank_tactics,
            (std::vector<std::string>{"reference"}));
}

TEST_F(MoeForwardTuner, KeysMatchThePresetsAndOtherBackendsAreRefused) {
  const MoeLayer layer = load(1);
  // The key names the rank's shape: experts, hidden, the TP shard width, top-k, biases.
  const tune::Problem problem = layer.tune_problem(0);
  EXPECT_EQ(problem.dim("E"), config_.num_experts);
  EXPECT_EQ(problem.dim("H"), config_.hidden_size);
  EXPECT_EQ(problem.dim("I"), config_.intermediate_size);
  EXPECT_EQ(problem.dim("top_k"), config_.top_k);
  EXPECT_NE(testing::error_of([&] { (void)layer.tune_problem(1); }).find("rank"),
            std::string::npos);

  tune::AutotunerConfig config;
  config.options.mode = tune::AutotuneMode::kOff;
  config.backend = tune::Backend::kCuda;
  tune::Fingerprint fingerprint;  // no GPU needed: the tuner is never asked
  fingerprint.backend = "cuda";
  fingerprint.device = "test GPU";
  fingerprint.registry_hash = tune::builtin_tactics().hash();
  config.fingerprint = fingerprint;
  const tune::Autotuner cuda_tuner(config);
  const Tensor x = synthetic_tokens(2, config_.hidden_size, 5);
  const std::string message =
      testing::error_of([&] { (void)layer.forward(x.view(), nullptr, &cuda_tuner); });
  EXPECT_NE(message.find("tuner: expected an autotuner of the cpu backend"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace mxq::moe
