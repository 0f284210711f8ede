#include "mxq/moe/sharding.h"

#include <gtest/gtest.h>

#include "mxq/core/error.h"
#include "mxq/moe/config.h"

namespace mxq::moe {
namespace {

TEST(TpShard, EvenSplitGivesEqualSlices) {
  // gpt-oss-20b: I = 2880, TP = 2 -> 1440 each (45 blocks of 32).
  const TpShard r0 = tp_shard(2880, 2, 0);
  const TpShard r1 = tp_shard(2880, 2, 1);
  EXPECT_EQ(r0.begin, 0);
  EXPECT_EQ(r0.valid, 1440);
  EXPECT_EQ(r0.width, 1440);
  EXPECT_EQ(r1.begin, 1440);
  EXPECT_EQ(r1.valid, 1440);
}

TEST(TpShard, UnevenSplitRoundsUpToBlocksAndZeroFillsTheLastRank) {
  // I = 2880 = 90 blocks over 4 ranks: width ceil(90/4) = 23 blocks = 736; the last rank
  // holds 2880 - 3*736 = 672 real channels and 64 zero-filled ones.
  std::int64_t covered = 0;
  for (int r = 0; r < 4; ++r) {
    const TpShard shard = tp_shard(2880, 4, r);
    EXPECT_EQ(shard.width, 736);
    EXPECT_EQ(shard.width % 32, 0);
    EXPECT_EQ(shard.begin, covered);
    covered += shard.valid;
  }
  EXPECT_EQ(covered, 2880);
  EXPECT_EQ(tp_shard(2880, 4, 3).valid, 672);
}

TEST(TpShard, MoreRanksThanBlocksLeavesEmptyZeroFilledRanks) {
  // I = 64 (2 blocks) over 3 ranks: widths 32, ranks 0 and 1 hold data, rank 2 none.
  EXPECT_EQ(tp_shard(64, 3, 0).valid, 32);
  EXPECT_EQ(tp_shard(64, 3, 1).valid, 32);
  EXPECT_EQ(tp_shard(64, 3, 2).valid, 0);
  EXPECT_EQ(tp_shard(64, 3, 2).width, 32);
}

TEST(TpShard, ForcedWidthMustBeAMultipleOf32AndCoverI) {
  EXPECT_EQ(tp_shard(2880, 2, 1, 1536).valid, 2880 - 1536);
  try {
    (void)tp_shard(2880, 2, 0, 1440 + 16);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("intermediate_per_rank"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("multiple of 32"), std::string::npos);
  }
  EXPECT_THROW((void)tp_shard(2880, 2, 0, 1408), Error);  // 2 * 1408 < 2880
  EXPECT_THROW((void)tp_shard(2880, 2, 2), Error);
  EXPECT_THROW((void)tp_shard(2880, 0, 0), Error);
  EXPECT_THROW((void)tp_shard(2870, 1, 0), Error);
}

TEST(EpShard, UnevenSplitGivesTheFirstRanksOneMore) {
  // 10 experts over 4 ranks: 3, 3, 2, 2.
  const std::int64_t expected_begin[] = {0, 3, 6, 8};
  const std::int64_t expected_count[] = {3, 3, 2, 2};
  for (int r = 0; r < 4; ++r) {
    const EpShard shard = ep_shard(10, 4, r);
    EXPECT_EQ(shard.begin, expected_begin[r]);
    EXPECT_EQ(shard.count, expected_count[r]);
  }
  EXPECT_THROW((void)ep_shard(3, 4, 0), Error);
  EXPECT_THROW((void)ep_shard(8, 2, 2), Error);
}

TEST(MoeConfig, ParsesGptOssConfigJson) {
  const MoeConfig config = parse_moe_config_json(R"({
    "hidden_size": 2880, "intermediate_size": 2880, "num_local_experts": 32,
    "num_experts_per_tok": 4, "swiglu_limit": 7.0, "num_hidden_layers": 24,
    "model_type": "gpt_oss"})");
  EXPECT_EQ(config.hidden_size, 2880);
  EXPECT_EQ(config.intermediate_size, 2880);
  EXPECT_EQ(config.num_experts, 32);
  EXPECT_EQ(config.top_k, 4);
  EXPECT_EQ(config.swiglu_limit, 7.0);
  EXPECT_EQ(config.num_layers, 24);
  EXPECT_EQ(config.activation, Activation::kSwigluOai);
  EXPECT_EQ(parse_moe_config_json(moe_config_to_json(config)), config);
}

TEST(MoeConfig, RejectsMissingKeysAndBadValues) {
  EXPECT_THROW((void)parse_moe_config_json(R"({"hidden_size": 64})"), Error);
  EXPECT_THROW((void)parse_moe_config_json("not json"), Error);
  const auto bad_top_k = R"({"hidden_size": 64, "intermediate_size": 64,
      "num_local_experts": 2, "num_experts_per_tok": 3})";
  try {
    (void)parse_moe_config_json(bad_top_k);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("top_k"), std::string::npos);
  }
  EXPECT_THROW((void)parse_moe_config_json(R"({"hidden_size": 48, "intermediate_size": 64,
      "num_local_experts": 2, "num_experts_per_tok": 1})"),
               Error);
}

}  // namespace
}  // namespace mxq::moe
