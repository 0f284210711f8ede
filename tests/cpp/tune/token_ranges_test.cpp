// Test 7: a token count between buckets never gets a tactic outside its valid token range:
// not from tuning (a bucket's winner must be valid for every count the bucket serves), not from
// a hand-edited file, not beyond the last bucket. With the real toy_gemm op (the tuner's test op,
// in toy_registry()), every served tactic also runs correctly at that count.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "mxq/tune/autotuner.h"
#include "tune/toy_gemm/toy_gemm.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

TEST(TokenRanges, RealToyGemmServesOnlyValidTacticsAtEveryTokenCount) {
  TempDir dir;
  Autotuner tuner(testing::tune_cpu_config(dir.file("cache.json"), &toy_registry()));
  const Problem problem = toy_gemm_problem(32, 64);
  const std::vector<std::int64_t> buckets = {1, 2, 4, 8, 16, 32};
  {
    TuningSession session(tuner, "target");
    for (std::int64_t b : buckets) ASSERT_EQ(session.tune(problem, b).status, TuneStatus::kTuned);
  }
  std::set<std::string> served;
  for (std::int64_t tokens = 1; tokens <= 80; ++tokens) {
    const Selection s = tuner.lookup(problem, tokens);
    ASSERT_NE(s.tactic, nullptr);
    ASSERT_TRUE(s.tactic->tokens.contains(tokens)) << s.tactic->id() << " at " << tokens;
    served.insert(s.tactic->id());
    // It really runs there: the output matches the double-precision reference.
    const std::unique_ptr<Workload> workload =
        toy_registry().find_op(kToyGemmOp, Backend::kCpu)->make_workload(problem, tokens);
    const CheckResult check = workload->check(*s.tactic);
    ASSERT_TRUE(check.ok) << s.tactic->id() << " at " << tokens << ": " << check.detail;
  }
  EXPECT_GE(served.size(), 1U);
}

// Tactics with narrow ranges that are much faster than the default, on a virtual clock.
const TacticRegistry& ranged_registry() {
  static const TacticRegistry* registry = [] {
    auto* r = new TacticRegistry();
    testing::add_synthetic_op(*r, "ranged",
                              {{"wide", 10.0},
                               {"tiny", 1.0, {1, 3}},
                               {"mid", 2.0, {5, 20}},
                               {"big", 3.0, {33, TokenRange::kUnbounded}},
                               {"odd", 0.5, {6, 8}}},
                              {1, 2, 4, 8, 16, 32, 64});
    r->freeze();
    return r;
  }();
  return *registry;
}

TEST(TokenRanges, WinnersCoverTheirWholeBucketAndLookupRechecksEveryCount) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  const Problem problem = testing::synthetic_problem("ranged", 1);
  const OpSpec& op = *ranged_registry().find_op("ranged", Backend::kCpu);
  AutotunerConfig config;
  config.registry = &ranged_registry();
  config.options.mode = AutotuneMode::kTune;
  config.options.cache_path = path;
  config.timer = std::make_shared<testing::VirtualTimer>();
  {
    Autotuner tuner(config);
    {
      TuningSession session(tuner, "target");
      for (std::int64_t b : op.buckets)
        ASSERT_EQ(session.tune(problem, b).status, TuneStatus::kTuned);
    }
    // The winner of each bucket is the fastest tactic valid for all of (previous bucket, bucket].
    for (std::size_t i = 0; i < op.buckets.size(); ++i) {
      const std::int64_t lo = i == 0 ? 1 : op.buckets[i - 1] + 1;
      const std::int64_t hi = op.buckets[i];
      const Tactic* expected = &ranged_registry().default_tactic(op);
      double best = 10.0;
      for (const auto& [name, cost, range] :
           std::vector<std::tuple<std::string, double, TokenRange>>{
               {"tiny", 1.0, {1, 3}},
               {"mid", 2.0, {5, 20}},
               {"big", 3.0, {33, TokenRange::kUnbounded}},
               {"odd", 0.5, {6, 8}}}) {
        if (range.covers(lo, hi) && cost < best) {
          best = cost;
          expected = ranged_registry().find_tactic("ranged", Backend::kCpu, name);
        }
      }
      const Selection s = tuner.lookup(problem, hi);
      EXPECT_EQ(s.tactic, expected) << "bucket " << hi << " got " << s.tactic->id();
    }
    for (std::int64_t tokens = -2; tokens <= 300; ++tokens) {
      const Selection s = tuner.lookup(problem, tokens);
      ASSERT_NE(s.tactic, nullptr);
      EXPECT_TRUE(tokens < 1 || s.tactic->tokens.contains(tokens))
          << s.tactic->id() << " at " << tokens;
      if (tokens < 1) {
        EXPECT_EQ(s.tactic->id(), "wide");
      }
    }
  }

  // Hand-edited winners: "odd" (6..8) at bucket 8 is valid at 8 but not for all of 5..8;
  // "tiny" (1..3) at bucket 4 and "mid" (5..20) at bucket 32 are not even valid at their bucket.
  nlohmann::json file = nlohmann::json::parse(testing::read_file(path));
  for (auto& e : file["entries"]) {
    const std::int64_t b = e["bucket"];
    if (b == 4) e["tactic"] = "tiny";
    if (b == 8) e["tactic"] = "odd";
    if (b == 32) e["tactic"] = "mid";
  }
  testing::write_file(path, file.dump());
  config.options.mode = AutotuneMode::kLoad;
  const Autotuner edited(config);
  const std::map<std::int64_t, std::pair<std::string, SelectionSource>> expected_at = {
      {2, {"tiny", SelectionSource::kTuned}},    {3, {"wide", SelectionSource::kDefault}},
      {4, {"wide", SelectionSource::kDefault}},  {5, {"wide", SelectionSource::kOutOfRange}},
      {6, {"odd", SelectionSource::kTuned}},     {8, {"odd", SelectionSource::kTuned}},
      {12, {"mid", SelectionSource::kTuned}},    {20, {"wide", SelectionSource::kDefault}},
      {32, {"wide", SelectionSource::kDefault}}, {33, {"big", SelectionSource::kTuned}},
      {1000, {"big", SelectionSource::kTuned}}};
  for (const auto& [tokens, expected] : expected_at) {
    const Selection s = edited.lookup(problem, tokens);
    EXPECT_EQ(s.tactic->id(), expected.first) << "at " << tokens;
    EXPECT_EQ(s.source, expected.second) << "at " << tokens;
  }
  for (std::int64_t tokens = 1; tokens <= 300; ++tokens) {
    const Selection s = edited.lookup(problem, tokens);
    ASSERT_TRUE(s.tactic->tokens.contains(tokens)) << s.tactic->id() << " at " << tokens;
  }
}

}  // namespace
}  // namespace mxq::tune
