// Test 9: the skip list (MXQ_AUTOTUNE_SKIP_OPS) makes an op run its default tactic: never
// tuned, never served from a cache that has it. Fresh-run mode (MXQ_AUTOTUNE=fresh) reads
// nothing and tunes into a new timestamped file under runs/, leaving the main cache untouched.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "mxq/core/error.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/presets.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

class SkipAndFresh : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name : {"MXQ_AUTOTUNE", "MXQ_AUTOTUNE_CACHE", "MXQ_AUTOTUNE_SKIP_OPS",
                             "MXQ_AUTOTUNE_BUDGET", "MXQ_CACHE_DIR"}) {
      unsetenv(name);
    }
  }

  // tiny-moe's CPU problem (moe_expert_gemm): the key `mxq tune --preset tiny-moe` tunes.
  static Problem tiny_moe_problem() {
    for (const PresetProblem& p : find_preset("tiny-moe").problems({})) {
      if (p.problem.op() == moe::kMoeExpertGemmOp) return p.problem;
    }
    throw std::runtime_error("tiny-moe has no moe_expert_gemm problem");
  }

  // A cache whose decisions differ from the defaults, as a tuned one would.
  static void write_cache(const std::string& path, const Problem& problem) {
    std::vector<CacheEntry> entries;
    for (std::int64_t bucket : {1, 8, 64}) {
      CacheEntry e;
      e.problem = problem;
      e.bucket = bucket;
      e.tactic = "tiled[pairs=8,rows=64,threads=1]";
      e.pass = "target";
      e.tuned_at = "2026-01-01T00:00:00Z";
      entries.push_back(e);
    }
    CacheStore store(path, cpu_fingerprint(builtin_tactics()));
    ASSERT_TRUE(store.save(entries).ok);
  }
};

TEST_F(SkipAndFresh, SkippedOpsRunTheirDefaultAndAreNeverTuned) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  const Problem problem = tiny_moe_problem();
  write_cache(path, problem);
  const std::string bytes = testing::read_file(path);

  setenv("MXQ_AUTOTUNE", "tune", 1);
  setenv("MXQ_AUTOTUNE_CACHE", path.c_str(), 1);
  {  // Without the skip list the cache serves its decisions...
    AutotunerConfig config;
    config.options = AutotuneOptions::from_env();
    const Autotuner tuner(config);
    EXPECT_EQ(tuner.lookup(problem, 8).tactic->id(), "tiled[pairs=8,rows=64,threads=1]");
  }
  setenv("MXQ_AUTOTUNE_SKIP_OPS", "some_other_op, moe_expert_gemm", 1);
  AutotunerConfig config;
  config.options = AutotuneOptions::from_env();
  config.options.measure = testing::quick_measure();
  ASSERT_EQ(config.options.skip_ops,
            (std::vector<std::string>{"some_other_op", "moe_expert_gemm"}));
  Autotuner tuner(config);
  for (std::int64_t tokens : {1, 5, 8, 64, 100}) {
    const Selection s = tuner.lookup(problem, tokens);
    EXPECT_EQ(s.source, SelectionSource::kSkipped);
    EXPECT_EQ(s.tactic->id(), "reference");
  }
  {
    TuningSession session(tuner, "target");
    for (std::int64_t b : {1, 2, 8, 64}) {
      const TuneRecord r = session.tune(problem, b);
      EXPECT_EQ(r.status, TuneStatus::kSkipped);
      EXPECT_NE(r.reason.find("skip list"), std::string::npos);
    }
  }
  EXPECT_EQ(tuner.measured_count(), 0);
  EXPECT_TRUE(tuner.decisions().empty());
  EXPECT_EQ(testing::read_file(path), bytes) << "skipping must not drop the op's cached entries";
  bool warned_unknown = false;
  for (const std::string& w : tuner.warnings())
    warned_unknown |= w.find("some_other_op") != std::string::npos;
  EXPECT_TRUE(warned_unknown) << "a skip-list name that is no op is reported";

  // The CLI: everything skipped, nothing written, and the file is the one a run without the skip
  // list uses (skipping an op must not hide every other op's decisions behind another file).
  unsetenv("MXQ_AUTOTUNE_CACHE");
  unsetenv("MXQ_AUTOTUNE_SKIP_OPS");
  const testing::ProcessResult cli = testing::run_cli(
      {"tune", "--preset", "tiny-moe", "--json"},
      {"MXQ_AUTOTUNE_SKIP_OPS=moe_expert_gemm", "MXQ_CACHE_DIR=" + dir.file("cache-dir")});
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  const nlohmann::json report = nlohmann::json::parse(cli.out);
  EXPECT_EQ(report["summary"]["tuned"], 0);
  EXPECT_FALSE(report["records"].empty());
  EXPECT_EQ(report["summary"]["skipped"], report["records"].size());
  EXPECT_FALSE(std::filesystem::exists(report["cache"].get<std::string>()));
  const testing::ProcessResult plain =
      testing::run_cli({"tune", "--preset", "tiny-moe", "--tokens", "1", "--json"},
                       {"MXQ_CACHE_DIR=" + dir.file("cache-dir")});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(nlohmann::json::parse(plain.out)["cache"], report["cache"]);
}

TEST_F(SkipAndFresh, FreshRunReadsNothingAndWritesANewRunsFile) {
  TempDir dir;
  const std::string path = dir.file("main.json");
  const Problem problem = tiny_moe_problem();
  write_cache(path, problem);
  const std::string bytes = testing::read_file(path);

  setenv("MXQ_AUTOTUNE", "fresh", 1);
  setenv("MXQ_AUTOTUNE_CACHE", path.c_str(), 1);
  AutotunerConfig config;
  config.options = AutotuneOptions::from_env();
  config.options.measure = testing::quick_measure();
  ASSERT_EQ(config.options.mode, AutotuneMode::kFresh);
  std::string first_run;
  {
    Autotuner tuner(config);
    first_run = tuner.cache_path();
    EXPECT_TRUE(std::regex_match(
        first_run,
        std::regex(dir.file("runs") + "/main-[0-9]{8}T[0-9]{6}Z-[0-9]+(-[0-9]+)?\\.json")))
        << first_run;
    EXPECT_FALSE(std::filesystem::exists(first_run));
    EXPECT_EQ(tuner.lookup(problem, 8).source, SelectionSource::kDefault)
        << "the main cache was read";
    TuningSession session(tuner, "target");
    // Token counts as a braced list (the documented call).
    const std::vector<TuneRecord> records = session.tune_tokens(problem, {1, 8, 64});
    ASSERT_EQ(records.size(), 3U);
    for (const TuneRecord& r : records) EXPECT_EQ(r.status, TuneStatus::kTuned);
  }
  const ReadResult run = read_cache_file(first_run);
  ASSERT_EQ(run.status, ReadStatus::kOk);
  EXPECT_EQ(run.file.entries.size(), 3U);
  EXPECT_EQ(testing::read_file(path), bytes) << "fresh mode wrote into the main cache";

  // A second fresh run gets its own file; the first stays as it was.
  const std::string first_bytes = testing::read_file(first_run);
  {
    Autotuner tuner(config);
    EXPECT_NE(tuner.cache_path(), first_run);
    TuningSession session(tuner, "target");
    EXPECT_EQ(session.tune(problem, 8).status, TuneStatus::kTuned);
  }
  EXPECT_EQ(testing::read_file(first_run), first_bytes);
  std::size_t run_files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.file("runs"))) {
    run_files += f.path().extension() == ".json";
  }
  EXPECT_EQ(run_files, 2U);

  // Load mode still serves the main cache; a bad mode is an error naming the variable.
  setenv("MXQ_AUTOTUNE", "load", 1);
  AutotunerConfig load;
  load.options = AutotuneOptions::from_env();
  EXPECT_EQ(Autotuner(load).lookup(problem, 8).tactic->id(), "tiled[pairs=8,rows=64,threads=1]");
  setenv("MXQ_AUTOTUNE", "sometimes", 1);
  try {
    (void)AutotuneOptions::from_env();
    FAIL() << "a bad mode must not parse";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MXQ_AUTOTUNE"), std::string::npos) << e.what();
  }

  // The CLI's --fresh does the same (tiny-moe's CPU problem at buckets 1 and 2: the main cache
  // holds the first, and is not read).
  unsetenv("MXQ_AUTOTUNE");
  const testing::ProcessResult cli = testing::run_cli(
      {"tune", "--preset", "tiny-moe", "--tokens", "1,2", "--cache", path, "--fresh", "--json"});
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  const nlohmann::json report = nlohmann::json::parse(cli.out);
  EXPECT_EQ(report["mode"], "fresh");
  EXPECT_EQ(report["summary"]["tuned"], 2);
  EXPECT_EQ(report["summary"]["hit"], 0);
  EXPECT_NE(report["cache"].get<std::string>().find(dir.file("runs") + "/main-"),
            std::string::npos);
  EXPECT_EQ(read_cache_file(report["cache"]).file.entries.size(), 2U);
  EXPECT_EQ(testing::read_file(path), bytes);
}

}  // namespace
}  // namespace mxq::tune
