// Test 2: eight processes tuning different ops into one cache file at the same time lose
// nothing: every entry of every process is in the file at the end.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <thread>

#include "mxq/tune/autotuner.h"
#include "tune/tune_test_util.h"

namespace mxq::tune {
namespace {

using testing::TempDir;

constexpr int kProcesses = 8;
const std::vector<std::int64_t> kBuckets = {1, 2, 4, 8, 16, 32, 64, 128};

// Op i: the default costs 10 us per token, "fast" 5 us, "slow" 20 us.
const TacticRegistry& eight_op_registry() {
  static const TacticRegistry* registry = [] {
    auto* r = new TacticRegistry();
    for (int i = 0; i < kProcesses; ++i) {
      testing::add_synthetic_op(*r, "op" + std::to_string(i),
                                {{"plain", 10.0}, {"fast", 5.0}, {"slow", 20.0}}, kBuckets);
    }
    r->freeze();
    return r;
  }();
  return *registry;
}

// Child process: tune op `index` for every bucket (a save after each winner) and exit.
[[noreturn]] void tune_in_child(int index, const std::string& path, int start_fd) {
  char byte = 0;
  (void)!::read(start_fd, &byte, 1);  // returns at EOF: the parent released every child at once
  int code = 0;
  try {
    AutotunerConfig config;
    config.registry = &eight_op_registry();
    config.options.mode = AutotuneMode::kTune;
    config.options.cache_path = path;
    config.timer = std::make_shared<testing::VirtualTimer>();
    Autotuner tuner(config);
    TuningSession session(tuner, "process" + std::to_string(index));
    for (std::int64_t bucket : kBuckets) {
      const TuneRecord r =
          session.tune(testing::synthetic_problem("op" + std::to_string(index), 100), bucket);
      if (r.status != TuneStatus::kTuned) code = 2;
    }
    session.close();
  } catch (...) {
    code = 3;
  }
  std::_Exit(code);
}

TEST(ConcurrentWriters, EightProcessesTuningDifferentOpsIntoOneFileLoseNothing) {
  for (int round = 0; round < 3; ++round) {
    TempDir dir;
    const std::string path = dir.file("shared.json");
    int start[2];
    ASSERT_EQ(::pipe(start), 0);
    std::vector<pid_t> children;
    for (int i = 0; i < kProcesses; ++i) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(start[1]);
        tune_in_child(i, path, start[0]);
      }
      children.push_back(pid);
    }
    ::close(start[0]);
    ::close(start[1]);  // every child's read() returns now
    for (pid_t pid : children) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
      EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed to tune (2) or threw (3)";
    }

    const ReadResult read = read_cache_file(path);
    ASSERT_EQ(read.status, ReadStatus::kOk) << read.problem;
    EXPECT_TRUE(read.file.skipped.empty());
    std::set<std::string> keys;
    for (const CacheEntry& e : read.file.entries) {
      keys.insert(e.key());
      EXPECT_EQ(e.tactic, "fast") << e.key();
      EXPECT_EQ(e.pass, "process" + e.problem.op().substr(2)) << e.key();
    }
    EXPECT_EQ(keys.size(), static_cast<std::size_t>(kProcesses) * kBuckets.size())
        << "round " << round << ": entries were lost";
    EXPECT_TRUE(testing::files_starting_with(dir.path(), ".shared.json.tmp-").empty());
    EXPECT_TRUE(testing::files_starting_with(dir.path(), "shared.json.corrupt").empty());
  }
}

// A cache path may be a symlink (e.g. into a folder shared by several deployments, or to a
// target that does not exist yet): saves go into the link's target, the link stays a link, and
// writers through the link and through the target take one lock, next to the target.
TEST(ConcurrentWriters, WritersThroughASymlinkAndThroughItsTargetShareOneFileAndOneLock) {
  namespace fs = std::filesystem;
  TempDir dir;
  fs::create_directories(dir.path() / "shared");
  const std::string target = dir.file("shared/real.json");
  const std::string link = dir.file("link.json");
  const std::string alias = dir.file("alias.json");
  fs::create_symlink("shared/real.json", link);  // relative, and its target does not exist yet
  fs::create_symlink(link, alias);               // a chain: alias -> link -> shared/real.json
  const auto tune_op = [](const std::string& path, int op) {
    AutotunerConfig config;
    config.registry = &eight_op_registry();
    config.options.mode = AutotuneMode::kTune;
    config.options.cache_path = path;
    config.timer = std::make_shared<testing::VirtualTimer>();
    Autotuner tuner(config);
    TuningSession session(tuner, "pass");
    const Problem problem = testing::synthetic_problem("op" + std::to_string(op), 100);
    EXPECT_EQ(session.tune(problem, 1).status, TuneStatus::kTuned) << path;
    EXPECT_EQ(tuner.unsaved_count(), 0) << path;
  };
  const auto links_intact = [&] {
    EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link)));
    EXPECT_EQ(fs::read_symlink(link), "shared/real.json");
    EXPECT_TRUE(fs::is_symlink(fs::symlink_status(alias)));
  };
  const auto entries_in_target = [&] {
    const ReadResult read = read_cache_file(target);
    EXPECT_EQ(read.status, ReadStatus::kOk) << read.problem;
    return read.file.entries.size();
  };

  tune_op(link, 0);
  links_intact();
  EXPECT_EQ(entries_in_target(), 1U);
  EXPECT_TRUE(fs::exists(target + ".lock"));
  tune_op(target, 1);
  tune_op(alias, 2);
  links_intact();
  EXPECT_EQ(entries_in_target(), 3U);
  // Lock and temp files live next to the target only.
  EXPECT_EQ(testing::files_starting_with(dir.path(), "link.json"), std::vector<std::string>{link});
  EXPECT_EQ(testing::files_starting_with(dir.path(), "alias.json"),
            std::vector<std::string>{alias});

  // The target's lock holds off a writer that goes through the link.
  {
    std::optional<CacheLock> held(std::in_place, target);
    std::atomic<bool> saved{false};
    std::thread writer([&] {
      CacheStore store(link, cpu_fingerprint(eight_op_registry()));
      CacheEntry e;
      e.problem = testing::synthetic_problem("op3", 100);
      e.bucket = 1;
      e.tactic = "fast";
      saved = store.save({&e, 1}).ok;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(saved) << "the writer through the link did not wait for the target's lock";
    held.reset();
    writer.join();
    EXPECT_TRUE(saved);
  }
  links_intact();
  EXPECT_EQ(entries_in_target(), 4U);

  // A broken target is moved aside next to itself; the link still leads to the new file.
  testing::write_file(target, "not json");
  tune_op(link, 4);
  links_intact();
  EXPECT_EQ(entries_in_target(), 1U);
  EXPECT_EQ(testing::files_starting_with(dir.path() / "shared", "real.json.corrupt-").size(), 1U);
  EXPECT_EQ(testing::files_starting_with(dir.path(), "link.json"), std::vector<std::string>{link});
}

// The cache is created as any file (0666 & ~umask, its lock too), so a team that shares a cache
// folder with umask 002 can all write it; a save keeps the permissions the file has (a cache
// made private stays private).
TEST(ConcurrentWriters, ANewCacheHonoursTheUmaskAndASavedOneKeepsItsPermissions) {
  TempDir dir;
  const std::string path = dir.file("cache.json");
  const auto mode_of = [](const std::string& file) {
    struct stat st {};
    EXPECT_EQ(::stat(file.c_str(), &st), 0) << file;
    return st.st_mode & 07777;
  };
  CacheEntry e;
  e.problem = testing::synthetic_problem("op0", 100);
  e.bucket = 1;
  e.tactic = "fast";
  const mode_t umask_before = ::umask(002);
  CacheStore store(path, cpu_fingerprint(eight_op_registry()));
  ASSERT_TRUE(store.save({&e, 1}).ok);
  EXPECT_EQ(mode_of(path), 0664U);
  EXPECT_EQ(mode_of(path + ".lock"), 0664U);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  e.bucket = 2;
  ASSERT_TRUE(store.save({&e, 1}).ok);
  ::umask(umask_before);
  EXPECT_EQ(mode_of(path), 0600U);
  EXPECT_EQ(read_cache_file(path).file.entries.size(), 2U);
}

}  // namespace
}  // namespace mxq::tune
