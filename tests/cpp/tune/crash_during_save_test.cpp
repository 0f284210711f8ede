// Test 3: a process killed with SIGKILL while saving, many times at random points, leaves the
// cache file as a complete old or new version: it parses, holds exactly the entries of some
// save (never fewer than an earlier version), and `mxq cache verify` passes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <set>
#include <thread>

#include "mxq/linear/tune.h"
#include "mxq/tune/cache_file.h"
#include "mxq/tune/fingerprint.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

constexpr int kEntriesPerSave = 25;

// Entry i: a distinct block_fp8_linear problem (N = 8 * (i + 1)) decided as its default tactic
// "reference" at bucket 1 (a built-in op, so that `mxq cache verify` finds every entry servable).
CacheEntry entry(int i) {
  CacheEntry e;
  e.problem = linear::block_fp8_linear_problem(8 * (i + 1), 64, {64, 64});
  e.bucket = 1;
  e.tactic = "reference";
  e.median_us = 1.0 + i;
  e.default_us = 1.0 + i;
  e.pass = "crash-test";
  e.tuned_at = "2026-01-01T00:00:00Z";
  return e;
}

// The writer: continues from whatever the file holds, saving kEntriesPerSave new entries at a
// time, forever (until killed).
[[noreturn]] void save_forever(const std::string& path) {
  try {
    CacheStore store(path, cpu_fingerprint(builtin_tactics()));
    std::vector<CacheEntry> loaded;
    (void)store.load(loaded);
    for (int next = static_cast<int>(loaded.size());; next += kEntriesPerSave) {
      std::vector<CacheEntry> batch;
      for (int i = next; i < next + kEntriesPerSave; ++i) batch.push_back(entry(i));
      (void)store.save(batch);
    }
  } catch (...) {
    std::_Exit(3);
  }
}

TEST(CrashDuringSave, KilledWritersLeaveACompleteOldOrNewVersion) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  std::mt19937 rng(20261202);
  // Kills land at random points in [0, max_delay_us); the range adapts so that most kills hit
  // a writer that has started saving (slow builds, e.g. with sanitizers, need longer).
  int max_delay_us = 20000;
  std::size_t previous = 0;
  int grew = 0;
  constexpr int kKills = 40;
  for (int kill = 0; kill < kKills; ++kill) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) save_forever(path);
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, max_delay_us)(rng)));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself with " << WEXITSTATUS(status);

    const ReadResult read = read_cache_file(path);
    if (read.status == ReadStatus::kMissing) {
      ASSERT_EQ(previous, 0U) << "the file vanished";
      max_delay_us = std::min(max_delay_us * 3 / 2, 2000000);
      continue;
    }
    ASSERT_EQ(read.status, ReadStatus::kOk) << "kill " << kill << ": " << read.problem;
    ASSERT_TRUE(read.file.skipped.empty());
    EXPECT_EQ(read.file.fingerprint, cpu_fingerprint(builtin_tactics()));
    const std::size_t n = read.file.entries.size();
    ASSERT_EQ(n % kEntriesPerSave, 0U) << "a partial save is visible";
    ASSERT_GE(n, previous) << "kill " << kill << ": entries of an earlier version were lost";
    std::set<std::string> expected;
    for (int i = 0; i < static_cast<int>(n); ++i) expected.insert(entry(i).key());
    for (const CacheEntry& e : read.file.entries) {
      ASSERT_EQ(expected.count(e.key()), 1U) << e.key();
      ASSERT_EQ(e, entry(static_cast<int>(e.problem.dim("N") / 8 - 1))) << "entry changed";
    }
    grew += n > previous ? 1 : 0;
    if (n == previous) max_delay_us = std::min(max_delay_us * 3 / 2, 2000000);
    if (n > previous + 4 * kEntriesPerSave) max_delay_us = std::max(max_delay_us * 2 / 3, 1000);
    previous = n;
    if (kill % 8 == 0 || kill == kKills - 1) {
      const testing::ProcessResult verify = testing::run_cli({"cache", "verify", path});
      ASSERT_EQ(verify.exit_code, 0) << verify.out << verify.err;
    }
  }
  EXPECT_GT(grew, kKills / 4) << "the writers were killed before saving anything";
  // Temp files of killed writers are removed by the next save.
  testing::write_file(dir.file(".cache.json.tmp-1-2-3"), "a killed writer's");
  CacheStore store(path, cpu_fingerprint(builtin_tactics()));
  std::vector<CacheEntry> loaded;
  ASSERT_TRUE(store.load(loaded).ok);
  ASSERT_TRUE(store.save({}).ok);
  EXPECT_TRUE(testing::files_starting_with(dir.path(), ".cache.json.tmp-").empty());
  const ReadResult final_read = read_cache_file(path);
  EXPECT_EQ(final_read.file.entries.size(), previous);
}

}  // namespace
}  // namespace mxq::tune
