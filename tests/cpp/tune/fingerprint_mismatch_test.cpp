// Test 5: a cache file with another fingerprint (another device, driver, mxq version or tactic
// registry) is not served and stays byte-for-byte unchanged, whatever the tuner does.
#include <gtest/gtest.h>

#include "mxq/linear/tune.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/presets.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

// The problems are the built-in ops' (the CLI verifies and merges these files, and `mxq tune`
// tunes the same keys): a small block_fp8_linear, and tiny-moe's CPU problem.
Problem linear_problem(std::int64_t n, std::int64_t k) {
  return linear::block_fp8_linear_problem(n, k, {64, 64});
}

Problem tiny_moe_problem() {
  for (const PresetProblem& p : find_preset("tiny-moe").problems({})) {
    if (p.problem.op() == moe::kMoeExpertGemmOp) return p.problem;
  }
  throw std::runtime_error("tiny-moe has no moe_expert_gemm problem");
}

struct Variant {
  std::string name;
  std::function<void(Fingerprint&)> change;
  std::string field;  // named in the warning
};

TEST(FingerprintMismatch, EntriesAreNotServedAndTheFileIsUnchanged) {
  const Problem problem = linear_problem(128, 128);
  const std::vector<std::int64_t> buckets = {1, 8, 64};
  const std::vector<Variant> variants = {
      {"other device", [](Fingerprint& f) { f.device = "Some Other CPU @ 5 GHz"; }, "device"},
      {"other thread count", [](Fingerprint& f) { f.cpu_threads += 62; }, "cpu_threads"},
      {"other mxq", [](Fingerprint& f) { f.mxq_version = "0.0.9"; }, "mxq_version"},
      {"other registry", [](Fingerprint& f) { f.registry_hash = "0123456789abcdef"; },
       "registry_hash"},
      {"other driver", [](Fingerprint& f) { f.driver_version = 13000; }, "driver_version"},
  };
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    TempDir dir;
    const std::string path = dir.file("cache.json");
    Fingerprint foreign = cpu_fingerprint(builtin_tactics());
    variant.change(foreign);
    // A file tuned under the foreign fingerprint, with non-default decisions.
    {
      std::vector<CacheEntry> entries;
      for (std::int64_t b : buckets) {
        CacheEntry e;
        e.problem = problem;
        e.bucket = b;
        e.tactic = b == 1 ? "blocked_f32[tile_n=16]" : "blocked_f32[tile_n=64]";
        e.pass = "elsewhere";
        e.tuned_at = "2026-01-01T00:00:00Z";
        entries.push_back(e);
      }
      CacheStore store(path, foreign);
      ASSERT_TRUE(store.save(entries).ok);
    }
    const std::string bytes = testing::read_file(path);
    const ReadResult original = read_cache_file(path);
    ASSERT_EQ(original.status, ReadStatus::kOk);
    ASSERT_EQ(original.file.entries.size(), buckets.size());
    // Under a matching fingerprint these entries would be served:
    {
      AutotunerConfig config;
      config.options.mode = AutotuneMode::kLoad;
      config.options.cache_path = path;
      config.fingerprint = foreign;
      const Autotuner at_home(config);
      for (std::int64_t b : buckets)
        EXPECT_EQ(at_home.lookup(problem, b).source, SelectionSource::kTuned);
    }

    for (AutotuneMode mode : {AutotuneMode::kLoad, AutotuneMode::kTune}) {
      AutotunerConfig config;
      config.options.mode = mode;
      config.options.cache_path = path;
      config.options.measure = testing::quick_measure();
      Autotuner tuner(config);  // this machine's fingerprint
      ASSERT_FALSE(tuner.warnings().empty());
      EXPECT_NE(tuner.warnings()[0].find("another fingerprint"), std::string::npos);
      EXPECT_NE(tuner.warnings()[0].find(variant.field), std::string::npos) << tuner.warnings()[0];
      EXPECT_TRUE(tuner.decisions().empty());
      for (std::int64_t b : buckets) {
        const Selection s = tuner.lookup(problem, b);
        EXPECT_EQ(s.source, SelectionSource::kDefault) << "bucket " << b;
        EXPECT_EQ(s.tactic->id(), "reference");
      }
      {
        TuningSession session(tuner, "here");
        for (std::int64_t b : buckets) {
          EXPECT_EQ(session.tune(problem, b).status,
                    mode == AutotuneMode::kTune ? TuneStatus::kTuned : TuneStatus::kNotTuned);
        }
      }
      tuner.seal();
      if (mode == AutotuneMode::kTune) {
        // Tuned here, served here from memory, never written over the foreign file.
        EXPECT_EQ(tuner.decisions().size(), buckets.size());
        bool warned_not_saving = false;
        for (const std::string& w : tuner.warnings()) {
          warned_not_saving |= w.find("not saving") != std::string::npos;
        }
        EXPECT_TRUE(warned_not_saving);
      }
      EXPECT_EQ(testing::read_file(path), bytes) << "mode " << to_string(mode);
      EXPECT_TRUE(testing::files_starting_with(dir.path(), "cache.json.corrupt").empty());
    }
    if (variant.field != "device" && variant.field != "cpu_threads" &&
        variant.field != "driver_version") {
      const testing::ProcessResult verify =
          testing::run_cli({"cache", "verify", path, "--no-device-check"});
      EXPECT_NE(verify.exit_code, 0) << verify.out;
      EXPECT_NE(verify.out.find(variant.field), std::string::npos) << verify.out;
    }
    const testing::ProcessResult verify = testing::run_cli({"cache", "verify", path});
    EXPECT_NE(verify.exit_code, 0) << verify.out;
    EXPECT_NE(verify.out.find("FAIL fingerprint " + variant.field), std::string::npos)
        << verify.out;
    // `cache merge` refuses to write this machine's entries into the foreign file.
    const std::string local = dir.file("local.json");
    {
      CacheStore store(local, cpu_fingerprint(builtin_tactics()));
      CacheEntry e = original.file.entries.front();
      ASSERT_TRUE(store.save({&e, 1}).ok);
    }
    const testing::ProcessResult merge = testing::run_cli({"cache", "merge", local, "-o", path});
    EXPECT_NE(merge.exit_code, 0) << merge.out;
    EXPECT_EQ(testing::read_file(path), bytes);
  }
}

// Another mxq build's file (a newer schema, or a fingerprint with fields this build does not
// know or lacks) is an mxq cache all the same: like a file of another fingerprint it is not
// served, never moved aside and never overwritten, and `mxq tune` refuses it before tuning
// anything. Two builds sharing a cache folder must not destroy each other's.
TEST(FingerprintMismatch, AnotherBuildsFileIsNeitherServedNorMovedNorOverwritten) {
  // The key `mxq tune --preset tiny-moe --tokens 1` below would be served, were the file ours.
  const Problem problem = tiny_moe_problem();
  std::string ours;  // a file this build would serve
  {
    CacheFile file;
    file.fingerprint = cpu_fingerprint(builtin_tactics());
    CacheEntry e;
    e.problem = problem;
    e.bucket = 1;
    e.tactic = "tiled[pairs=8,rows=64,threads=1]";
    file.entries.push_back(e);
    ours = serialize_cache(file);
  }
  {  // It is: this build serves its entry.
    TempDir dir;
    testing::write_file(dir.file("ours.json"), ours);
    const auto tuner = testing::load_cpu_tuner(dir.file("ours.json"));
    EXPECT_EQ(tuner->lookup(problem, 1).source, SelectionSource::kTuned);
  }
  const auto edit = [](std::string text, const std::string& from, const std::string& to) {
    const std::size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? text : text.replace(at, from.size(), to);
  };
  std::string no_threads = ours;
  const std::size_t threads_at = no_threads.find("\"cpu_threads\": ");
  no_threads.erase(threads_at, no_threads.find(", ", threads_at) + 2 - threads_at);
  struct Case {
    std::string name;
    std::string text;
    std::string reason;  // in the warning
  };
  const std::vector<Case> cases = {
      {"newer schema", edit(ours, "\"schema_version\": 1", "\"schema_version\": 2"),
       "schema_version is 2"},
      {"newer schema, other layout",
       edit(edit(ours, "\"schema_version\": 1", "\"schema_version\": 3, \"layout\": [1]"),
            "\"entries\": [", "\"entries\": {\"by_key\": 0}, \"e\": ["),
       "schema_version is 3"},
      {"unknown fingerprint field",
       edit(ours, "\"registry_hash\"", "\"nvlink_domain\": \"nvl72\", \"registry_hash\""),
       "nvlink_domain"},
      {"missing fingerprint field", no_threads, "cpu_threads"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    const std::string path = dir.file("cache.json");
    testing::write_file(path, c.text);
    for (AutotuneMode mode : {AutotuneMode::kLoad, AutotuneMode::kTune}) {
      AutotunerConfig config;
      config.options.mode = mode;
      config.options.cache_path = path;
      config.options.measure = testing::quick_measure();
      Autotuner tuner(config);
      ASSERT_EQ(tuner.warnings().size(), 1U);
      EXPECT_NE(tuner.warnings()[0].find("another mxq build"), std::string::npos)
          << tuner.warnings()[0];
      EXPECT_NE(tuner.warnings()[0].find(c.reason), std::string::npos) << tuner.warnings()[0];
      EXPECT_EQ(tuner.lookup(problem, 1).source, SelectionSource::kDefault);
      if (mode == AutotuneMode::kTune) {
        TuningSession session(tuner, "here");
        EXPECT_EQ(session.tune(problem, 2).status, TuneStatus::kTuned);
        EXPECT_EQ(tuner.unsaved_count(), 1);
        bool warned_not_saving = false;
        for (const std::string& w : tuner.warnings()) {
          warned_not_saving |= w.find("not saving") != std::string::npos;
        }
        EXPECT_TRUE(warned_not_saving);
      }
      EXPECT_EQ(testing::read_file(path), c.text) << "mode " << to_string(mode);
      EXPECT_TRUE(testing::files_starting_with(dir.path(), "cache.json.corrupt").empty());
    }
    const testing::ProcessResult tune =
        testing::run_cli({"tune", "--preset", "tiny-moe", "--tokens", "1", "--cache", path});
    EXPECT_NE(tune.exit_code, 0) << tune.err;
    EXPECT_NE(tune.err.find("another mxq build"), std::string::npos) << tune.err;
    EXPECT_NE(tune.err.find("nothing was tuned"), std::string::npos) << tune.err;
    EXPECT_EQ(testing::read_file(path), c.text);
    EXPECT_TRUE(testing::files_starting_with(dir.path(), "cache.json.corrupt").empty());
  }
}

// A foreign file does not stop saving for the rest of the run: every later save tries again
// (warning once per foreign file), so once the file is gone or compatible, every decision of
// the run is saved and nothing is reported unsaved.
TEST(FingerprintMismatch, SavingResumesWhenTheForeignFileIsRemovedOrReplaced) {
  const Problem problem = linear_problem(128, 128);
  TempDir dir;
  const std::string path = dir.file("cache.json");
  Fingerprint foreign = cpu_fingerprint(builtin_tactics());
  foreign.device = "Some Other CPU @ 5 GHz";
  // Replaces the file with a new one of `fingerprint` holding one entry.
  const auto write_file_of = [&](const Fingerprint& fingerprint, std::int64_t bucket) {
    std::filesystem::remove(path);
    CacheStore store(path, fingerprint);
    CacheEntry e;
    e.problem = linear_problem(256, 256);
    e.bucket = bucket;
    e.tactic = "reference";
    ASSERT_TRUE(store.save({&e, 1}).ok);
  };
  const auto not_saving_warnings = [](const Autotuner& tuner) {
    int count = 0;
    for (const std::string& w : tuner.warnings())
      count += w.find("not saving") != std::string::npos;
    return count;
  };
  write_file_of(foreign, 64);
  const std::string foreign_bytes = testing::read_file(path);
  AutotunerConfig config;
  config.options.mode = AutotuneMode::kTune;
  config.options.cache_path = path;
  config.options.measure = testing::quick_measure();
  Autotuner tuner(config);
  TuningSession session(tuner, "target");
  ASSERT_EQ(session.tune(problem, 1).status, TuneStatus::kTuned);
  ASSERT_EQ(session.tune(problem, 2).status, TuneStatus::kTuned);
  EXPECT_EQ(tuner.unsaved_count(), 2);
  EXPECT_EQ(testing::read_file(path), foreign_bytes);
  EXPECT_EQ(not_saving_warnings(tuner), 1) << "one warning per foreign file, not one per save";

  std::filesystem::remove(path);  // e.g. the user moved it away mid-run
  ASSERT_EQ(session.tune(problem, 4).status, TuneStatus::kTuned);
  EXPECT_EQ(tuner.unsaved_count(), 0);
  ReadResult read = read_cache_file(path);
  ASSERT_EQ(read.status, ReadStatus::kOk);
  EXPECT_EQ(read.file.fingerprint, cpu_fingerprint(builtin_tactics()));
  EXPECT_EQ(read.file.entries.size(), 3U);

  // Foreign again, then replaced by a compatible file: its entry and ours are all kept.
  write_file_of(foreign, 64);
  ASSERT_EQ(session.tune(problem, 8).status, TuneStatus::kTuned);
  EXPECT_EQ(tuner.unsaved_count(), 1);
  EXPECT_EQ(not_saving_warnings(tuner), 2);
  write_file_of(cpu_fingerprint(builtin_tactics()), 32);
  ASSERT_EQ(session.tune(problem, 16).status, TuneStatus::kTuned);
  EXPECT_EQ(tuner.unsaved_count(), 0);
  read = read_cache_file(path);
  ASSERT_EQ(read.status, ReadStatus::kOk);
  EXPECT_EQ(read.file.entries.size(), 3U);  // the compatible file's entry, buckets 8 and 16
}

}  // namespace
}  // namespace mxq::tune
