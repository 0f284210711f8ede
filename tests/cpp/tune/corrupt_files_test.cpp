// Test 4: corrupt, truncated, empty, huge and wrong-schema cache files give a warning, never a
// crash: the file is moved aside (bytes kept), tuning continues into a fresh file, and no other
// file in the folder is touched. (A newer schema is another build's file, not a broken one:
// fingerprint_mismatch_test.) Malformed entries are skipped but kept in the file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "mxq/linear/tune.h"
#include "mxq/tune/autotuner.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

// A small block_fp8_linear problem (a built-in op: the CLI verifies, shows and merges its files).
Problem linear_problem(std::int64_t n, std::int64_t k) {
  return linear::block_fp8_linear_problem(n, k, {64, 64});
}

std::string valid_cache_text() {
  CacheFile file;
  file.fingerprint = cpu_fingerprint(builtin_tactics());
  for (int i = 1; i <= 40; ++i) {
    CacheEntry e;
    e.problem = linear_problem(16 * i, 64);
    e.bucket = 4;
    e.tactic = "blocked_f32[tile_n=16]";
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
  // No mxq wrote schema 0 (the first one is 1): not a newer build's file but a broken one.
  std::string wrong_schema = valid;
  wrong_schema.replace(wrong_schema.find("\"schema_version\": 1"), 19, "\"schema_version\": 0");
  // A version of the wrong type is reported as found (it used to read as "-1").
  std::string string_schema = valid;
  string_schema.replace(string_schema.find("\"schema_version\": 1"), 19,
                        "\"schema_version\": \"1\"");
  std::string fraction_schema = valid;
  fraction_schema.replace(fraction_schema.find("\"schema_version\": 1"), 19,
                          "\"schema_version\": 1.5");
  // A malformed entry nested deeper than the reader follows (it would be written back).
  std::string deep = valid;
  deep.replace(deep.find("\"entries\": [") + 12, 0,
               std::string(100, '[') + std::string(100, ']') + ",");
  std::string no_schema = valid;
  no_schema.replace(no_schema.find("\"schema_version\""), 16, "\"schema_versio\"");
  std::string wrong_format = valid;
  wrong_format.replace(wrong_format.find("mxq-autotune-cache"), 18, "flashinfer-autotune");
  std::string no_entries = valid;
  no_entries.replace(no_entries.find("\"entries\""), 9, "\"entries_\"");
  return {
      {"garbage", "\x89PNG\r\n\x1a\n not json at all {{{", false, "not valid JSON"},
      {"truncated", valid.substr(0, valid.size() / 2), false,
       "not valid JSON: parse error at line"},
      {"a NUL byte", valid + std::string(1, '\0') + "{}", false, "not valid JSON: a NUL byte"},
      {"too deep", deep, false, "nesting deeper than 64"},
      {"empty", "", false, "empty"},
      {"huge", "", true, "more than the limit"},
      {"wrong schema version", wrong_schema, false, "schema_version is 0"},
      {"no schema version", no_schema, false, "schema_version is missing"},
      {"schema version as a string", string_schema, false,
       "schema_version is \"1\" (a string), this mxq reads 1"},
      {"fractional schema version", fraction_schema, false,
       "schema_version is 1.5 (not an integer)"},
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
  const Problem problem = linear_problem(64, 64);
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
  const Problem problem = linear_problem(64, 64);
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
  const std::string first_tactic = "\"tactic\":\"blocked_f32[tile_n=16]\"";
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

// "Skipped" is for serving only: a malformed entry is written back as read by every save and
// merge (it may be another build's, or a hand edit to fix), and an entry's members this build
// does not know (a later minor version's) stay with the entry, until a new winner replaces it.
TEST(CorruptFiles, MalformedEntriesAndUnknownFieldsSurviveSavesAndMerges) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  std::string text = valid_cache_text();
  const std::string bucket = "\"bucket\":4";
  text.replace(text.find(bucket), bucket.size(), "\"bucket\":\"1\"");
  const std::string ranks = "\"ranks\":1";
  const std::size_t second = text.find(ranks, text.find(ranks) + 1);
  text.replace(second, ranks.size(), "\"ranks\":1,\"future_field\":{\"why\":[1, \"two\"]}");
  testing::write_file(path, text);
  const nlohmann::json original = nlohmann::json::parse(text)["entries"];
  const nlohmann::json malformed = original[0];
  const nlohmann::json with_future = original[1];
  ASSERT_EQ(malformed["bucket"], "1");
  ASSERT_TRUE(with_future.contains("future_field"));
  // How many entries of the file at `file` equal `wanted`.
  const auto count = [](const std::string& file, const nlohmann::json& wanted) {
    const nlohmann::json parsed = nlohmann::json::parse(testing::read_file(file));
    int seen = 0;
    for (const nlohmann::json& e : parsed["entries"]) seen += e == wanted;
    return seen;
  };
  const auto holds_both = [&](const std::string& file) {
    return count(file, malformed) == 1 && count(file, with_future) == 1;
  };
  const Problem new_problem = linear_problem(64, 128);

  // A tuning save.
  {
    AutotunerConfig config;
    config.options.mode = AutotuneMode::kTune;
    config.options.cache_path = path;
    config.options.measure = testing::quick_measure();
    Autotuner tuner(config);
    ASSERT_EQ(tuner.warnings().size(), 1U);
    EXPECT_NE(tuner.warnings()[0].find("\"bucket\" is not an integer"), std::string::npos);
    EXPECT_EQ(tuner.decisions().size(), 39U);
    TuningSession session(tuner, "target");
    ASSERT_EQ(session.tune(new_problem, 1).status, TuneStatus::kTuned);
    EXPECT_EQ(tuner.unsaved_count(), 0);
  }
  EXPECT_TRUE(holds_both(path)) << testing::read_file(path);
  ReadResult read = read_cache_file(path);
  ASSERT_EQ(read.status, ReadStatus::kOk);
  EXPECT_EQ(read.file.entries.size(), 40U);
  ASSERT_EQ(read.file.skipped.size(), 1U);

  // A merge into the file, and a merge of the file into another one.
  const std::string other = dir.file("other.json");
  testing::write_cpu_cache(other, builtin_tactics(),
                           {testing::hand_written_entry(new_problem, 2, "reference")});
  const testing::ProcessResult merge_in = testing::run_cli({"cache", "merge", other, "-o", path});
  ASSERT_EQ(merge_in.exit_code, 0) << merge_in.err;
  EXPECT_TRUE(holds_both(path)) << testing::read_file(path);
  const std::string out = dir.file("out.json");
  const testing::ProcessResult merge_out = testing::run_cli({"cache", "merge", path, "-o", out});
  ASSERT_EQ(merge_out.exit_code, 0) << merge_out.err;
  EXPECT_TRUE(holds_both(out)) << testing::read_file(out);
  EXPECT_NE(merge_out.out.find("carried 1 unreadable entry"), std::string::npos) << merge_out.out;
  // Merging it again adds no second copy.
  ASSERT_EQ(testing::run_cli({"cache", "merge", path, "-o", out}).exit_code, 0);
  EXPECT_TRUE(holds_both(out)) << testing::read_file(out);

  // Still reported, and still not served.
  const testing::ProcessResult verify = testing::run_cli({"cache", "verify", path});
  EXPECT_NE(verify.exit_code, 0);
  EXPECT_NE(verify.out.find("FAIL unreadable entry"), std::string::npos) << verify.out;
  EXPECT_NE(verify.out.find("\"bucket\" is not an integer"), std::string::npos) << verify.out;
  read = read_cache_file(path);
  EXPECT_EQ(read.file.entries.size(), 41U);
  EXPECT_EQ(read.file.skipped.size(), 1U);

  // A new winner for the key of the entry with the unknown member replaces the whole entry.
  const nlohmann::json& future_shape = with_future["shape"];
  const Problem future_problem = linear::block_fp8_linear_problem(
      future_shape["N"].get<std::int64_t>(), future_shape["K"].get<std::int64_t>(),
      {future_shape["block_n"].get<std::int64_t>(), future_shape["block_k"].get<std::int64_t>()});
  const CacheEntry replacement = testing::hand_written_entry(future_problem, 4, "reference");
  CacheStore store(path, cpu_fingerprint(builtin_tactics()));
  ASSERT_TRUE(store.save({&replacement, 1}).ok);
  EXPECT_EQ(testing::read_file(path).find("future_field"), std::string::npos);
  EXPECT_EQ(count(path, malformed), 1);
}

// JSON text is UTF-8: a name that is not (a pass name from a Latin-1 terminal) is saved with
// U+FFFD in place of the bad bytes, so that the file reads back rather than being moved aside.
TEST(CorruptFiles, ASaveOfTextThatIsNotUtf8WritesAFileThatReadsBack) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  CacheEntry e = testing::hand_written_entry(linear::block_fp8_linear_problem(64, 64, {64, 64}), 4,
                                             "reference");
  e.pass = "caf\xe9 \xc3\xa9t\xc3\xa9";
  testing::write_cpu_cache(path, builtin_tactics(), {e});
  const ReadResult read = read_cache_file(path);
  ASSERT_EQ(read.status, ReadStatus::kOk) << read.problem;
  ASSERT_EQ(read.file.entries.size(), 1U);
  EXPECT_EQ(read.file.entries[0].pass, "caf\xef\xbf\xbd \xc3\xa9t\xc3\xa9");
}

}  // namespace
}  // namespace mxq::tune
