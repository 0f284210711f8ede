// `mxq run` interrupted while it synthesizes its checkpoint: Ctrl-C (SIGINT) and SIGTERM remove
// the temporary folder before the process ends by the signal; what `kill -9` leaves is removed by
// the next run, and never a folder whose writer still runs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_test_support.h"

extern char** environ;

namespace mxq {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

const std::string kName = "gpt-oss-E32-H2880-I2880-k4-L1-seed0-gpt-oss-v1";

// `mxq run --tokens 1` with MXQ_CACHE_DIR=cache, output to files in `dir`.
pid_t start_run(const ScratchDir& dir, const std::string& tag) {
  const std::string cache = "MXQ_CACHE_DIR=" + dir.file("cache");
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!std::string_view(*e).starts_with("MXQ_CACHE_DIR=")) env.push_back(*e);
  }
  env.push_back(const_cast<char*>(cache.c_str()));
  env.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  const std::string out = dir.file(tag + ".out");
  const std::string err = dir.file(tag + ".err");
  posix_spawn_file_actions_addopen(&files, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&files, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const char* argv[] = {MXQ_CLI_PATH, "run", "--tokens", "1", nullptr};
  pid_t pid = -1;
  const int error =
      posix_spawn(&pid, MXQ_CLI_PATH, &files, nullptr, const_cast<char**>(argv), env.data());
  posix_spawn_file_actions_destroy(&files);
  EXPECT_EQ(error, 0);
  return pid;
}

// The temporary folders of the synth cache (not their lock files).
std::vector<std::string> temporaries(const ScratchDir& dir) {
  std::vector<std::string> out;
  std::error_code error;
  for (fs::directory_iterator it(dir.file("cache/synth"), error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.find(".tmp-") != std::string::npos && !name.ends_with(".lock")) out.push_back(name);
  }
  return out;
}

// Waits (up to 2 minutes) until a temporary folder other than those in `known` appears.
std::string wait_for_new_temporary(const ScratchDir& dir, const std::vector<std::string>& known) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (std::chrono::steady_clock::now() < deadline) {
    for (const std::string& name : temporaries(dir)) {
      if (std::find(known.begin(), known.end(), name) == known.end()) return name;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return {};
}

int wait_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

TEST(InterruptCli, CtrlCAndSigtermRemoveTheTemporaryCheckpoint) {
  for (const int sig : {SIGINT, SIGTERM}) {
    const ScratchDir dir("mxq-cli-interrupt-" + std::to_string(sig));
    const pid_t pid = start_run(dir, "run");
    const std::string temporary = wait_for_new_temporary(dir, {});
    ASSERT_FALSE(temporary.empty()) << testing::slurp(dir.file("run.err"));
    ASSERT_EQ(::kill(pid, sig), 0);
    const int status = wait_status(pid);
    // Ends by the signal, as the shell expects of Ctrl-C / SIGTERM, after saying what it did.
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status;
    EXPECT_NE(testing::slurp(dir.file("run.err")).find("mxq: interrupted by SIG"),
              std::string::npos)
        << testing::slurp(dir.file("run.err"));
    EXPECT_FALSE(fs::exists(dir.file("cache/synth/" + temporary))) << temporary;
    EXPECT_FALSE(fs::exists(dir.file("cache/synth/" + temporary + ".lock")));
    EXPECT_FALSE(fs::exists(dir.file("cache/synth/" + kName)));
  }
}

TEST(InterruptCli, TheNextRunRemovesWhatDeadWritersLeftAndNothingOfLiveOnes) {
  const ScratchDir dir("mxq-cli-stale");
  // A run killed with SIGKILL (no clean-up possible) leaves its temporary folder.
  const pid_t killed = start_run(dir, "killed");
  const std::string left = wait_for_new_temporary(dir, {});
  ASSERT_FALSE(left.empty()) << testing::slurp(dir.file("killed.err"));
  ASSERT_EQ(::kill(killed, SIGKILL), 0);
  (void)wait_status(killed);
  ASSERT_TRUE(fs::exists(dir.file("cache/synth/" + left)));

  // Folders as an older mxq left them (no lock file): one of a process that is gone, one of a
  // live process (this one). And one whose lock a live writer (this test) holds.
  const pid_t gone = fork();
  if (gone == 0) std::_Exit(0);
  (void)wait_status(gone);
  const std::string synth = dir.file("cache/synth/");
  const std::string old_dead = kName + ".tmp-" + std::to_string(gone) + "-1";
  const std::string old_live = kName + ".tmp-" + std::to_string(::getpid()) + "-2";
  const std::string locked = kName + ".tmp-" + std::to_string(::getpid()) + "-3";
  for (const std::string& name : {old_dead, old_live, locked}) {
    fs::create_directories(synth + name);
    std::ofstream(synth + name + "/layer-00000.safetensors") << "partial";
  }
  const int lock = ::open((synth + locked + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_EQ(::flock(lock, LOCK_EX), 0);

  // The next run removes the dead writers' folders before it writes its own.
  const pid_t next = start_run(dir, "next");
  const std::string own = wait_for_new_temporary(dir, {left, old_dead, old_live, locked});
  ASSERT_FALSE(own.empty()) << testing::slurp(dir.file("next.err"));
  EXPECT_FALSE(fs::exists(synth + left)) << "the SIGKILLed run's folder";
  EXPECT_FALSE(fs::exists(synth + left + ".lock"));
  EXPECT_FALSE(fs::exists(synth + old_dead)) << "an old folder of a process that is gone";
  EXPECT_TRUE(fs::exists(synth + old_live + "/layer-00000.safetensors")) << "live writer";
  EXPECT_TRUE(fs::exists(synth + locked + "/layer-00000.safetensors")) << "locked by a writer";
  ASSERT_EQ(::kill(next, SIGINT), 0);
  (void)wait_status(next);
  EXPECT_FALSE(fs::exists(synth + own));
  ::close(lock);
}

}  // namespace
}  // namespace mxq
