// Test 8: four in-process ranks with different cache files and noisy timings end with
// identical decisions: timings are pooled (so every rank picks the same winner), a key any rank
// lacks is measured by all, and seal() makes ranks adopt rank 0's decisions where their caches
// disagreed, with a warning naming the entries.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "mxq/dist/in_process.h"
#include "mxq/tune/autotuner.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

constexpr int kRanks = 4;
const std::vector<std::int64_t> kBuckets = {1, 2, 4, 8, 16, 32};

// Three tactics about 10% faster than the default and within 2% of each other: the noise and
// the per-rank bias below decide among them when each rank measures alone.
const TacticRegistry& noisy_registry() {
  static const TacticRegistry* registry = [] {
    auto* r = new TacticRegistry();
    testing::add_synthetic_op(*r, "noisy", {{"base", 100.0}, {"a", 90.0}, {"b", 89.5}, {"c", 90.5}},
                              kBuckets);
    r->freeze();
    return r;
  }();
  return *registry;
}

std::vector<Problem> plan_problems() {
  return {testing::synthetic_problem("noisy", 1), testing::synthetic_problem("noisy", 2),
          testing::synthetic_problem("noisy", 3), testing::synthetic_problem("noisy", 4)};
}

// Rank r's noise: samples vary by +-6%, and the rank's "GPU" favours another tactic by 4%.
void set_rank_noise(int rank) {
  testing::VirtualClock& clock = testing::virtual_clock();
  clock = testing::VirtualClock{};
  clock.rng.seed(1000 + static_cast<std::uint64_t>(rank));
  clock.noise = 0.06;
  const char* favourite[] = {"a", "b", "c", "a"};
  clock.bias = {{"a", 1.0}, {"b", 1.0}, {"c", 1.0}};
  clock.bias[favourite[rank]] = 0.96;
}

CacheEntry decided(const Problem& p, std::int64_t bucket, const std::string& tactic) {
  CacheEntry e;
  e.problem = p;
  e.bucket = bucket;
  e.tactic = tactic;
  e.pass = "earlier run";
  e.tuned_at = "2026-01-01T00:00:00Z";
  return e;
}

struct RankResult {
  std::vector<std::pair<std::string, std::string>> decisions;  // key -> tactic
  std::vector<std::string> served;                             // lookup at many token counts
  std::uint64_t digest = 0;
  std::vector<std::string> warnings;
  std::string error;
};

RankResult run_rank(int rank, const std::string& cache_path, AutotuneMode mode,
                    dist::Communicator* comm) {
  RankResult result;
  try {
    set_rank_noise(rank);
    AutotunerConfig config;
    config.registry = &noisy_registry();
    config.options.mode = mode;
    config.options.cache_path = cache_path;
    config.communicator = comm;
    config.timer = std::make_shared<testing::VirtualTimer>();
    Autotuner tuner(config);
    {
      TuningSession session(tuner, "target");
      for (const Problem& p : plan_problems()) {
        for (std::int64_t b : kBuckets) session.tune(p, b);
      }
    }
    tuner.seal();
    for (const CacheEntry& e : tuner.decisions()) result.decisions.emplace_back(e.key(), e.tactic);
    for (const Problem& p : plan_problems()) {
      for (std::int64_t tokens = 1; tokens <= 40; ++tokens)
        result.served.push_back(tuner.lookup(p, tokens).tactic->id());
    }
    result.digest = tuner.decisions_digest();
    result.warnings = tuner.warnings();
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  return result;
}

std::vector<RankResult> run_ranks(const std::vector<std::string>& paths, AutotuneMode mode,
                                  dist::InProcessGroup* group) {
  std::vector<RankResult> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      results[static_cast<std::size_t>(r)] =
          run_rank(r, paths[static_cast<std::size_t>(r)], mode, group ? &group->rank(r) : nullptr);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(RankConsensus, FourRanksWithDifferentCachesAndNoisyTimingsEndIdentical) {
  TempDir dir;
  std::vector<std::string> paths;
  for (int r = 0; r < kRanks; ++r) paths.push_back(dir.file("rank" + std::to_string(r) + ".json"));

  // Control: measured alone (no pooling), the ranks disagree, so the noise is real.
  {
    std::vector<std::string> fresh;
    for (int r = 0; r < kRanks; ++r)
      fresh.push_back(dir.file("alone" + std::to_string(r) + ".json"));
    const std::vector<RankResult> alone = run_ranks(fresh, AutotuneMode::kTune, nullptr);
    for (const RankResult& r : alone) ASSERT_EQ(r.error, "");
    int differing = 0;
    for (int r = 1; r < kRanks; ++r)
      differing += alone[static_cast<std::size_t>(r)].decisions != alone[0].decisions;
    ASSERT_GT(differing, 0) << "the noise does not make independent ranks disagree";
  }

  // Different caches per rank:
  // - P1@1: every rank has it, with different tactics (no rank misses it: nobody measures),
  // - P2@1: ranks 0, 1, 3 have it, rank 2 misses it (all ranks measure it together),
  // - P9@1: only rank 3 has it (not in the plan; rank 3 must drop it).
  const Problem p1 = plan_problems()[0];
  const Problem p2 = plan_problems()[1];
  const Problem p9 = testing::synthetic_problem("noisy", 9);
  const std::vector<std::vector<CacheEntry>> caches = {
      {decided(p1, 1, "a"), decided(p2, 1, "b")},
      {decided(p1, 1, "c"), decided(p2, 1, "a")},
      {decided(p1, 1, "a")},
      {decided(p1, 1, "b"), decided(p2, 1, "c"), decided(p9, 1, "c")},
  };
  const Fingerprint fp = cpu_fingerprint(noisy_registry());
  for (int r = 0; r < kRanks; ++r) {
    CacheStore store(paths[static_cast<std::size_t>(r)], fp);
    ASSERT_TRUE(store.save(caches[static_cast<std::size_t>(r)]).ok);
  }

  dist::InProcessGroup group(kRanks, std::chrono::seconds(30));
  const std::vector<RankResult> results = run_ranks(paths, AutotuneMode::kTune, &group);
  for (int r = 0; r < kRanks; ++r)
    ASSERT_EQ(results[static_cast<std::size_t>(r)].error, "") << "rank " << r;
  for (int r = 1; r < kRanks; ++r) {
    const RankResult& mine = results[static_cast<std::size_t>(r)];
    EXPECT_EQ(mine.decisions, results[0].decisions) << "rank " << r;
    EXPECT_EQ(mine.served, results[0].served) << "rank " << r;
    EXPECT_EQ(mine.digest, results[0].digest) << "rank " << r;
  }
  // Rank 0's cached P1@1 stands; P2@1 was measured by all and overrides every cache.
  std::map<std::string, std::string> decisions(results[0].decisions.begin(),
                                               results[0].decisions.end());
  EXPECT_EQ(decisions[decided(p1, 1, "").key()], "a");
  EXPECT_EQ(decisions.count(decided(p9, 1, "").key()), 0U);
  EXPECT_EQ(decisions.size(), plan_problems().size() * kBuckets.size());
  // Ranks 1 and 3 disagreed on P1@1 (and rank 3 had P9@1): they were told which entries.
  auto warned = [&](int rank, const std::string& text) {
    for (const std::string& w : results[static_cast<std::size_t>(rank)].warnings) {
      if (w.find(text) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(warned(1, decided(p1, 1, "").key() + ": c here, a on rank 0"));
  EXPECT_TRUE(warned(3, decided(p1, 1, "").key() + ": b here, a on rank 0"));
  EXPECT_TRUE(warned(3, decided(p9, 1, "").key() + ": c here, nothing on rank 0"));
  EXPECT_FALSE(warned(2, "adopting rank 0's")) << "rank 2 agreed with rank 0";
  EXPECT_TRUE(warned(0, "ranks 1,3 disagreed"));
  // In tune mode the adopted decisions are saved: rank 1's file now holds rank 0's P1@1.
  const ReadResult rank1 = read_cache_file(paths[1]);
  ASSERT_EQ(rank1.status, ReadStatus::kOk);
  bool found = false;
  for (const CacheEntry& e : rank1.file.entries) {
    if (e.key() != decided(p1, 1, "").key()) continue;
    found = true;
    EXPECT_EQ(e.tactic, "a");
  }
  EXPECT_TRUE(found);

  // A second start from those files: every rank already agrees, nothing is measured or adopted.
  dist::InProcessGroup again(kRanks, std::chrono::seconds(30));
  const std::vector<RankResult> second = run_ranks(paths, AutotuneMode::kLoad, &again);
  for (int r = 0; r < kRanks; ++r) {
    const RankResult& mine = second[static_cast<std::size_t>(r)];
    ASSERT_EQ(mine.error, "");
    EXPECT_EQ(mine.digest, second[0].digest) << "rank " << r;
    EXPECT_EQ(mine.decisions, results[0].decisions) << "rank " << r;
  }
}

// Ranks must measure alike, or their pooled samples mean nothing (and a different number of
// rounds would make the all-gathers disagree): a session whose ranks differ in any measurement
// setting fails on every rank, naming both configurations.
TEST(RankConsensus, RanksWithDifferentMeasurementSettingsFailAlike) {
  constexpr int kPair = 2;
  struct Case {
    std::string name;
    std::function<void(MeasureSettings&)> change;
  };
  const std::vector<Case> cases = {
      {"warmup_runs", [](MeasureSettings& m) { m.warmup_runs += 1; }},
      {"rounds", [](MeasureSettings& m) { m.rounds += 2; }},
      {"min_sample_seconds", [](MeasureSettings& m) { m.min_sample_seconds = 3e-7; }},
      {"max_calls_per_sample", [](MeasureSettings& m) { m.max_calls_per_sample += 1; }},
      {"tie_band", [](MeasureSettings& m) { m.tie_band = 0.0201; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    dist::InProcessGroup group(kPair, std::chrono::seconds(30));
    std::vector<std::string> errors(kPair);
    std::vector<std::thread> threads;
    for (int r = 0; r < kPair; ++r) {
      threads.emplace_back([&, r] {
        AutotunerConfig config;
        config.registry = &noisy_registry();
        config.options.mode = AutotuneMode::kOff;
        config.options.measure.min_sample_seconds = 2e-7;
        if (r == 1) c.change(config.options.measure);
        config.communicator = &group.rank(r);
        config.timer = std::make_shared<testing::VirtualTimer>();
        try {
          Autotuner tuner(config);
          const TuningSession session(tuner, "target");
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kPair; ++r) {
      const std::string& error = errors[static_cast<std::size_t>(r)];
      EXPECT_NE(error.find("runs another configuration"), std::string::npos)
          << "rank " << r << ": '" << error << "'";
      EXPECT_NE(error.find(c.name), std::string::npos) << error;
    }
  }
}

}  // namespace
}  // namespace mxq::tune
