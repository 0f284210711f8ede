// Test 4: corrupt, truncated, empty, huge and wrong-schema cache files give a warning, never a
// crash: the file is moved aside (bytes kept), tuning continues into a fresh file, and no other
// file in the folder is touched.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "mxq/tune/autotuner.h"
#include "mxq/tune/toy_gemm.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

std::string valid_cache_text() {
  CacheFile file;
  file.fingerprint = cpu_fingerprint(builtin_tactics());
  for (int i = 1; i <= 40; ++i) {
    CacheEntry e;
    e.problem = toy_gemm_problem(16 * i, 64);
    e.bucket = 4;
    e.tactic = "unrolled[lanes=16]";
    e.median_us = 1;
    e.default_us = 2;
    e.pass = "target";
    e.tuned_at = "2026-01-01T00:00:00Z";
    file.entries.push_back(e);
  }
  return serialize_cache(file);
}

struct Broken {
  std::string name;
  std::string text;      // written as is, unless huge
  bool huge = false;     // a sparse file over kMaxCacheFileBytes
  std::string expected;  // part of the warning
};

std::vector<Broken> broken_files() {
  const std::string valid = valid_cache_text();
  std::string wrong_schema = valid;
  wrong_schema.replace(wrong_schema.find("\"schema_version\": 1"), 19, "\"schema_version\": 99");
  std::string wrong_format = valid;
  wrong_format.replace(wrong_format.find("mxq-autotune-cache"), 18, "flashinfer-autotune");
  std::string no_entries = valid;
  no_entries.replace(no_entries.find("\"entries\""), 9, "\"entries_\"");
  return {
      {"garbage", "\x89PNG\r\n\x1a\n not json at all {{{", false, "not valid JSON"},
      {"truncated", valid.substr(0, valid.size() / 2), false, "not valid JSON"},
      {"empty", "", false, "empty"},
      {"huge", "", true, "more than the limit"},
      {"wrong schema version", wrong_schema, false, "schema_version is 99"},
      {"wrong format", wrong_format, false, "not an mxq autotune cache"},
      {"json array", "[1, 2, 3]", false, "not an object"},
      {"no entries", no_entries, false, "missing \"entries\""},
  };
}

void write_broken(const std::string& path, const Broken& broken) {
  if (broken.huge) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kMaxCacheFileBytes + 4096)), 0);
    ::close(fd);
  } else {
    testing::write_file(path, broken.text);
  }
}

TEST(CorruptFiles, AreMovedAsideWithAWarningAndNothingElseIsTouched) {
  const Problem problem = toy_gemm_problem(64, 64);
  for (const Broken& broken : broken_files()) {
    SCOPED_TRACE(broken.name);
    TempDir dir;
    const std::string path = dir.file("cache.json");
    write_broken(path, broken);
    const std::uintmax_t broken_size = std::filesystem::file_size(path);
    const std::string broken_bytes = broken.huge ? "" : testing::read_file(path);
    // Neighbours: another deployment's cache and an unrelated file.
    const std::string neighbour = dir.file("other-deployment.json");
    testing::write_file(neighbour, valid_cache_text());
    testing::write_file(dir.file("notes.txt"), "keep me");

    AutotunerConfig config;
    config.options.mode = AutotuneMode::kTune;
    config.options.cache_path = path;
    config.options.measure = testing::quick_measure();
    std::unique_ptr<Autotuner> tuner;
    ASSERT_NO_THROW(tuner = std::make_unique<Autotuner>(config));
    const std::vector<std::string> warnings = tuner->warnings();
    ASSERT_EQ(warnings.size(), 1U);
    EXPECT_NE(warnings[0].find("moved aside"), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find(broken.expected), std::string::npos) << warnings[0];
    EXPECT_EQ(tuner->lookup(problem, 4).source, SelectionSource::kDefault);

    // The broken bytes are kept aside, unchanged.
    const auto aside = testing::files_starting_with(dir.path(), "cache.json.corrupt-");
    ASSERT_EQ(aside.size(), 1U);
    EXPECT_EQ(std::filesystem::file_size(aside[0]), broken_size);
    if (!broken.huge) {
      EXPECT_EQ(testing::read_file(aside[0]), broken_bytes);
    }
    EXPECT_FALSE(std::filesystem::exists(path));

    // Tuning goes on into a fresh file.
    {
      TuningSession session(*tuner, "target");
      EXPECT_EQ(session.tune(problem, 4).status, TuneStatus::kTuned);
    }
    const ReadResult fresh = read_cache_file(path);
    ASSERT_EQ(fresh.status, ReadStatus::kOk);
    EXPECT_EQ(fresh.file.entries.size(), 1U);

    // Nothing else was touched.
    EXPECT_EQ(testing::read_file(neighbour), valid_cache_text());
    EXPECT_EQ(testing::read_file(dir.file("notes.txt")), "keep me");
    EXPECT_EQ(testing::files_starting_with(dir.path(), "cache.json.corrupt-").size(), 1U);

    // A file that breaks between load and save (e.g. a foreign writer) is moved aside by the
    // save, which keeps only what it can vouch for.
    write_broken(path, broken);
    {
      TuningSession session(*tuner, "target");
      EXPECT_EQ(session.tune(problem, 8).status, TuneStatus::kTuned);
    }
    EXPECT_EQ(testing::files_starting_with(dir.path(), "cache.json.corrupt-").size(), 2U);
    const ReadResult after = read_cache_file(path);
    ASSERT_EQ(after.status, ReadStatus::kOk);
    EXPECT_EQ(after.file.entries.size(), 2U);  // the 4-bucket entry was still in memory: saved

    // The CLI reports the broken file and fails on it, without moving anything.
    write_broken(path, broken);
    const testing::ProcessResult verify = testing::run_cli({"cache", "verify", path});
    EXPECT_NE(verify.exit_code, 0);
    const testing::ProcessResult show = testing::run_cli({"cache", "show", path});
    EXPECT_NE(show.exit_code, 0);
    EXPECT_NE(show.err.find("unreadable"), std::string::npos) << show.err;
    EXPECT_TRUE(std::filesystem::exists(path));
    EXPECT_EQ(std::filesystem::file_size(path), broken_size);
  }
}

TEST(CorruptFiles, AreLeftAsTheyAreByAReadOnlyLoad) {
  const Problem problem = toy_gemm_problem(64, 64);
  for (const Broken& broken : broken_files()) {
    SCOPED_TRACE(broken.name);
    TempDir dir;
    const std::string path = dir.file("cache.json");
    write_broken(path, broken);
    const std::uintmax_t broken_size = std::filesystem::file_size(path);
    const std::string broken_bytes = broken.huge ? "" : testing::read_file(path);

    AutotunerConfig config;
    config.options.mode = AutotuneMode::kLoad;  // what serving (mxq moe, linear, run) uses
    config.options.cache_path = path;
    std::unique_ptr<Autotuner> tuner;
    ASSERT_NO_THROW(tuner = std::make_unique<Autotuner>(config));
    const std::vector<std::string> warnings = tuner->warnings();
    ASSERT_EQ(warnings.size(), 1U);
    EXPECT_NE(warnings[0].find("left as it is"), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find(broken.expected), std::string::npos) << warnings[0];
    EXPECT_EQ(tuner->lookup(problem, 4).source, SelectionSource::kDefault);

    // Not moved, not changed, no lock file created next to it.
    EXPECT_TRUE(testing::files_starting_with(dir.path(), "cache.json.corrupt-").empty());
    EXPECT_FALSE(std::filesystem::exists(path + ".lock"));
    ASSERT_TRUE(std::filesystem::exists(path));
    EXPECT_EQ(std::filesystem::file_size(path), broken_size);
    if (!broken.huge) {
      EXPECT_EQ(testing::read_file(path), broken_bytes);
    }
  }
}

TEST(CorruptFiles, ADirectoryAsTheCachePathIsAnErrorAndIsNotMoved) {
  TempDir dir;
  const std::string path = dir.file("not-a-file");
  std::filesystem::create_directories(path);
  testing::write_file(path + "/notes.txt", "keep me");
  for (const AutotuneMode mode : {AutotuneMode::kLoad, AutotuneMode::kTune}) {
    AutotunerConfig config;
    config.options.mode = mode;
    config.options.cache_path = path;
    const std::string message = [&] {
      try {
        const Autotuner tuner(config);
      } catch (const Error& error) {
        return std::string(error.what());
      }
      return std::string("no error");
    }();
    EXPECT_NE(message.find("expected a file path"), std::string::npos) << message;
    EXPECT_EQ(testing::read_file(path + "/notes.txt"), "keep me");
    EXPECT_TRUE(testing::files_starting_with(dir.path(), "not-a-file.corrupt-").empty());
  }
}

TEST(CorruptFiles, AMalformedEntryIsSkippedWithAWarningAndTheRestIsServed) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  std::string text = valid_cache_text();
  const std::string first_tactic = "\"tactic\":\"unrolled[lanes=16]\"";
  text.replace(text.find(first_tactic), first_tactic.size(), "\"tactic\":42");
  testing::write_file(path, text);
  AutotunerConfig config;
  config.options.mode = AutotuneMode::kLoad;
  config.options.cache_path = path;
  const Autotuner tuner(config);
  ASSERT_EQ(tuner.warnings().size(), 1U);
  EXPECT_NE(tuner.warnings()[0].find("\"tactic\" is not a string"), std::string::npos);
  EXPECT_EQ(tuner.decisions().size(), 39U);
  EXPECT_EQ(testing::read_file(path), text) << "load mode never writes";
}

}  // namespace
}  // namespace mxq::tune
