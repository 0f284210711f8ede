// Test 5: a cache file with another fingerprint (another device, driver, mxq version or tactic
// registry) is not served and stays byte-for-byte unchanged, whatever the tuner does.
#include <gtest/gtest.h>

#include "mxq/tune/autotuner.h"
#include "mxq/tune/toy_gemm.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

struct Variant {
  std::string name;
  std::function<void(Fingerprint&)> change;
  std::string field;  // named in the warning
};

TEST(FingerprintMismatch, EntriesAreNotServedAndTheFileIsUnchanged) {
  const Problem problem = toy_gemm_problem(128, 128);
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
        e.tactic = b == 1 ? "unrolled[lanes=16]" : "column_tiled[bn=8,threads=1]";
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
        EXPECT_EQ(s.tactic->id(), "rowwise");
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

}  // namespace
}  // namespace mxq::tune
