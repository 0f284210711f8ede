// The out-of-band setup of a process group: rank, size and local rank from the environment of
// torchrun, Open MPI or mxq's own variables (precedence, defaults, clear errors), and the
// file rendezvous by which rank 0 hands its NCCL id to the other ranks (threads and forked
// processes, repeated shares, timeouts on either side, a stale file from a killed launch, a
// group size mismatch, no files left behind).
#include "mxq/dist/rendezvous.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>  // setenv, unsetenv
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "mxq/core/error.h"

namespace mxq::dist {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;
using std::chrono::milliseconds;

// Every variable these tests read or set; saved before each test, restored after.
const char* const kVariables[] = {"MXQ_RANK",
                                  "MXQ_WORLD_SIZE",
                                  "MXQ_LOCAL_RANK",
                                  "RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_RANK",
                                  "OMPI_COMM_WORLD_RANK",
                                  "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "MXQ_RENDEZVOUS_DIR",
                                  "MXQ_RUN_ID",
                                  "MXQ_RENDEZVOUS_TIMEOUT",
                                  "TORCHELASTIC_RUN_ID",
                                  "TORCHELASTIC_RESTART_COUNT",
                                  "PMIX_NAMESPACE"};

class RendezvousTest : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kVariables) {
      if (const char* value = std::getenv(name)) saved_[name] = value;
      unsetenv(name);
    }
    std::string pattern = (fs::temp_directory_path() / "mxq-rendezvous-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (const char* name : kVariables) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  static void set(const std::map<std::string, std::string>& variables) {
    for (const auto& [name, value] : variables) setenv(name.c_str(), value.c_str(), 1);
  }

  [[nodiscard]] RendezvousOptions options(const std::string& run_id,
                                          milliseconds timeout = std::chrono::seconds(30)) const {
    return RendezvousOptions{(dir_ / "rdv").string(), run_id, timeout};
  }

  [[nodiscard]] std::vector<std::string> files() const {
    std::vector<std::string> names;
    if (!fs::exists(dir_ / "rdv")) return names;
    for (const auto& entry : fs::directory_iterator(dir_ / "rdv"))
      names.push_back(entry.path().filename().string());
    return names;
  }

  static std::string error_of(const std::function<void()>& body) {
    try {
      body();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  fs::path dir_;
  std::map<std::string, std::string> saved_;
};

Bytes random_blob(std::uint64_t seed, std::size_t length = 128) {
  std::mt19937_64 rng(seed);
  Bytes out(length);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

RankInfo rank_of(int rank, int size) { return RankInfo{rank, size, rank, "test"}; }

// ---- rank, size and local rank from the environment ---------------------------------------

TEST_F(RendezvousTest, NoLauncherMeansOneRank) {
  const RankInfo info = rank_info_from_env();
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.launcher, "none");
}

TEST_F(RendezvousTest, ReadsEachLauncherAndMxqOverridesTorchrunOverridesOpenMpi) {
  set({{"OMPI_COMM_WORLD_RANK", "5"},
       {"OMPI_COMM_WORLD_SIZE", "8"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  RankInfo info = rank_info_from_env();
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.size, 8);
  EXPECT_EQ(info.local_rank, 1);

  set({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}});
  info = rank_info_from_env();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.size, 4);
  EXPECT_EQ(info.local_rank, 2);

  set({{"MXQ_RANK", "1"}, {"MXQ_WORLD_SIZE", "3"}, {"MXQ_LOCAL_RANK", "0"}});
  info = rank_info_from_env();
  EXPECT_EQ(info.launcher, "mxq");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.size, 3);
  EXPECT_EQ(info.local_rank, 0);
}

TEST_F(RendezvousTest, LocalRankDefaultsToTheRank) {
  set({{"MXQ_RANK", "3"}, {"MXQ_WORLD_SIZE", "4"}});
  EXPECT_EQ(rank_info_from_env().local_rank, 3);
  unsetenv("MXQ_RANK");
  unsetenv("MXQ_WORLD_SIZE");
  set({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(rank_info_from_env().local_rank, 1);
}

TEST_F(RendezvousTest, BadLauncherVariablesAreErrorsNamingTheVariable) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}},
       "environment variable RANK: expected an integer, found 'x'"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2x"}},
       "environment variable WORLD_SIZE: expected an integer, found '2x'"},
      {{{"RANK", "99999999999"}, {"WORLD_SIZE", "2"}},
       "environment variable RANK: expected an integer, found '99999999999'"},
      {{{"MXQ_RANK", " "}, {"MXQ_WORLD_SIZE", "2"}},
       "environment variable MXQ_RANK: expected an integer, found ' '"},
      {{{"MXQ_WORLD_SIZE", "2"}},
       "environment variable MXQ_RANK: expected an integer (MXQ_WORLD_SIZE is set, mxq launch), "
       "found it unset"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}},
       "environment variable OMPI_COMM_WORLD_SIZE: expected an integer (OMPI_COMM_WORLD_RANK is "
       "set, openmpi launch), found it unset"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}},
       "environment variable WORLD_SIZE: expected >= 1, found 0"},
      {{{"MXQ_RANK", "2"}, {"MXQ_WORLD_SIZE", "2"}},
       "environment variable MXQ_RANK: expected 0..1 (MXQ_WORLD_SIZE=2), found 2"},
      {{{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
       "environment variable OMPI_COMM_WORLD_RANK: expected 0..1 (OMPI_COMM_WORLD_SIZE=2), found "
       "-1"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "5"}},
       "environment variable LOCAL_RANK: expected 0..1 (WORLD_SIZE=2), found 5"},
      // mxq's variables win even when they are the broken ones: no silent fallback.
      {{{"MXQ_RANK", "one"}, {"MXQ_WORLD_SIZE", "2"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}},
       "environment variable MXQ_RANK: expected an integer, found 'one'"},
  };
  for (const auto& [variables, expected] : cases) {
    for (const char* name : kVariables) unsetenv(name);
    set(variables);
    EXPECT_EQ(error_of([] { (void)rank_info_from_env(); }), expected);
  }
}

TEST_F(RendezvousTest, OptionsFromTheEnvironment) {
  RendezvousOptions defaults = RendezvousOptions::from_env();
  EXPECT_EQ(
      defaults.dir,
      (fs::temp_directory_path() / ("mxq-rendezvous-" + std::to_string(::getuid()))).string());
  EXPECT_EQ(defaults.run_id, default_run_id());
  EXPECT_EQ(defaults.timeout, std::chrono::seconds(300));

  set({{"MXQ_RENDEZVOUS_DIR", "/shared/rdv"},
       {"MXQ_RUN_ID", "job-17"},
       {"MXQ_RENDEZVOUS_TIMEOUT", "7"}});
  const RendezvousOptions given = RendezvousOptions::from_env();
  EXPECT_EQ(given.dir, "/shared/rdv");
  EXPECT_EQ(given.run_id, "job-17");
  EXPECT_EQ(given.timeout, std::chrono::seconds(7));

  set({{"MXQ_RENDEZVOUS_TIMEOUT", "0"}});
  EXPECT_EQ(error_of([] { (void)RendezvousOptions::from_env(); }),
            "environment variable MXQ_RENDEZVOUS_TIMEOUT: expected seconds > 0, found 0");
  set({{"MXQ_RENDEZVOUS_TIMEOUT", "soon"}});
  EXPECT_EQ(error_of([] { (void)RendezvousOptions::from_env(); }),
            "environment variable MXQ_RENDEZVOUS_TIMEOUT: expected an integer, found 'soon'");

  set({{"MXQ_RENDEZVOUS_TIMEOUT", "7"},
       {"MXQ_RUN_ID", "job.17"},
       {"MXQ_RANK", "0"},
       {"MXQ_WORLD_SIZE", "2"}});
  EXPECT_EQ(error_of([] { (void)Rendezvous::from_env(); }),
            "rendezvous run id (MXQ_RUN_ID): expected letters, digits, '_' or '-', found "
            "'job.17'");
  set({{"MXQ_RUN_ID", "job-17"}});
  const Rendezvous rendezvous = Rendezvous::from_env();
  EXPECT_EQ(rendezvous.ranks().size, 2);
  EXPECT_EQ(rendezvous.id_path(), "/shared/rdv/job-17.id");
}

TEST_F(RendezvousTest, DefaultRunIdFollowsTheLauncher) {
  set({{"TORCHELASTIC_RUN_ID", "abc:1"}, {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_EQ(default_run_id(), "torchrun-abc_1-r2");
  set({{"TORCHELASTIC_RUN_ID", "none"}, {"PMIX_NAMESPACE", "prterun-node-123@1"}});
  EXPECT_EQ(default_run_id(), "pmix-prterun-node-123_1");
  unsetenv("PMIX_NAMESPACE");
  const std::string mine = default_run_id();
  EXPECT_TRUE(mine.starts_with("parent-" + std::to_string(::getppid()) + "-")) << mine;

  // Two children of this process (as two ranks of one launcher) derive the same id, which names
  // this process, not its parent.
  std::vector<std::string> ids;
  for (int child = 0; child < 2; ++child) {
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const std::string id = default_run_id();
      const ssize_t written = ::write(pipe_fds[1], id.data(), id.size());
      ::_exit(written == static_cast<ssize_t>(id.size()) ? 0 : 1);
    }
    ::close(pipe_fds[1]);
    std::string id;
    char buffer[256];
    for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
      id.append(buffer, static_cast<std::size_t>(n));
    ::close(pipe_fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ids.push_back(id);
  }
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_TRUE(ids[0].starts_with("parent-" + std::to_string(::getpid()) + "-")) << ids[0];
  EXPECT_NE(ids[0], mine);
}

// ---- the rendezvous ------------------------------------------------------------------------

TEST_F(RendezvousTest, BadOptionsAreErrors) {
  EXPECT_EQ(error_of([&] { (void)Rendezvous(options(""), rank_of(0, 2)); }),
            "rendezvous run id (MXQ_RUN_ID): expected letters, digits, '_' or '-', found ''");
  EXPECT_EQ(error_of([&] { (void)Rendezvous(options("a/b"), rank_of(0, 2)); }),
            "rendezvous run id (MXQ_RUN_ID): expected letters, digits, '_' or '-', found 'a/b'");
  EXPECT_EQ(error_of([&] {
              (void)Rendezvous(RendezvousOptions{"", "x", std::chrono::seconds(1)}, rank_of(0, 2));
            }),
            "rendezvous dir: expected a folder, found ''");
  EXPECT_EQ(error_of([&] { (void)Rendezvous(options("x", milliseconds(0)), rank_of(0, 2)); }),
            "rendezvous timeout: expected > 0 ms, found 0");
  EXPECT_EQ(error_of([&] { (void)Rendezvous(options("x"), rank_of(2, 2)); }),
            "rank: expected 0..1 (size=2), found 2");
  EXPECT_EQ(error_of([&] {
              (void)Rendezvous(options("x"), RankInfo{0, 0, 0, "test"});
            }),
            "size: expected >= 1, found 0");
}

TEST_F(RendezvousTest, OneRankNeedsNoFiles) {
  Rendezvous rendezvous(options("solo"), rank_of(0, 1));
  EXPECT_EQ(rendezvous.share_from_rank0(random_blob(1)), random_blob(1));
  EXPECT_FALSE(fs::exists(dir_ / "rdv"));
}

// Ranks as threads, rank 0 arriving after the others (`rank0_delay`) or before them.
std::vector<Bytes> share_in_threads(const RendezvousOptions& options, int size,
                                    const std::vector<Bytes>& blobs, milliseconds rank0_delay,
                                    milliseconds others_delay, std::vector<std::string>* errors) {
  std::vector<Bytes> got(static_cast<std::size_t>(size));
  errors->assign(static_cast<std::size_t>(size), "");
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::this_thread::sleep_for(r == 0 ? rank0_delay : others_delay);
      try {
        Rendezvous rendezvous(options, rank_of(r, size));
        for (const Bytes& blob : blobs) {
          // Non-zero ranks pass garbage: only rank 0's blob counts.
          got[static_cast<std::size_t>(r)] =
              rendezvous.share_from_rank0(r == 0 ? blob : random_blob(100 + r));
          if (got[static_cast<std::size_t>(r)] != blob) break;
        }
      } catch (const Error& e) {
        (*errors)[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

TEST_F(RendezvousTest, ThreadsGetRank0sBlobWhoeverComesFirstAndNoFileIsLeft) {
  for (const auto& [rank0_delay, others_delay] : {std::pair{milliseconds(150), milliseconds(0)},
                                                  std::pair{milliseconds(0), milliseconds(150)}}) {
    const Bytes blob = random_blob(static_cast<std::uint64_t>(rank0_delay.count()));
    std::vector<std::string> errors;
    const std::vector<Bytes> got =
        share_in_threads(options("threads-" + std::to_string(rank0_delay.count())), 4, {blob},
                         rank0_delay, others_delay, &errors);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
      EXPECT_EQ(got[static_cast<std::size_t>(r)], blob) << "rank " << r;
    }
    EXPECT_TRUE(files().empty()) << files().front();
  }
}

TEST_F(RendezvousTest, RepeatedSharesOfOneGroupStayInStep) {
  // Blobs of several lengths, the empty one included; every share must return its own round's.
  std::vector<Bytes> blobs;
  for (std::size_t round = 0; round < 6; ++round) blobs.push_back(random_blob(round, round * 50));
  std::vector<std::string> errors;
  const std::vector<Bytes> got =
      share_in_threads(options("repeated"), 3, blobs, milliseconds(0), milliseconds(0), &errors);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(got[static_cast<std::size_t>(r)], blobs.back()) << "rank " << r;
  }
  EXPECT_TRUE(files().empty());
}

TEST_F(RendezvousTest, ForkedProcessesGetRank0sBlob) {
  const Bytes blob = random_blob(42);
  constexpr int kSize = 3;
  std::vector<pid_t> children;
  for (int r = 1; r < kSize; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 1;
      try {
        Rendezvous rendezvous(options("forked"), rank_of(r, kSize));
        code = rendezvous.share_from_rank0({}) == blob ? 0 : 2;
      } catch (...) {
        code = 3;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  Rendezvous rendezvous(options("forked"), rank_of(0, kSize));
  EXPECT_EQ(rendezvous.share_from_rank0(blob), blob);
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: error, 2: wrong blob, 3: exception";
  }
  EXPECT_TRUE(files().empty());
}

TEST_F(RendezvousTest, AReaderWithoutRank0TimesOutWithAClearError) {
  Rendezvous reader(options("lonely", milliseconds(200)), rank_of(1, 2));
  const std::string error = error_of([&] { (void)reader.share_from_rank0({}); });
  EXPECT_EQ(error, "rendezvous " + (dir_ / "rdv" / "lonely.id").string() +
                       ": rank 1 of 2 waited 0.2 s for rank 0 to publish its id (is rank 0 "
                       "running, with the same rendezvous dir and run id 'lonely'?)");
  EXPECT_TRUE(files().empty());
}

TEST_F(RendezvousTest, Rank0TimesOutNamingTheMissingRanksAndTheReadersFailToo) {
  std::vector<std::string> errors(3, "(no error)");
  std::thread reader([&] {
    Rendezvous rendezvous(options("partial", std::chrono::seconds(20)), rank_of(1, 3));
    errors[1] = error_of([&] { (void)rendezvous.share_from_rank0({}); });
  });
  Rendezvous rank0(options("partial", milliseconds(300)), rank_of(0, 3));
  errors[0] = error_of([&] { (void)rank0.share_from_rank0(random_blob(3)); });
  reader.join();
  const std::string path = (dir_ / "rdv" / "partial.id").string();
  EXPECT_EQ(errors[0], "rendezvous " + path +
                           ": rank 2 of 3 did not read rank 0's id within 0.3 s (are they "
                           "running, with the same rendezvous dir and run id 'partial' and group "
                           "size 3?)");
  EXPECT_EQ(errors[1], "rendezvous " + path +
                           ": rank 0 gave up waiting for the other ranks after rank 1 of 3 read "
                           "its id (rank 0's error names the missing ranks)");
  // Only the abandoned marker remains (for whoever comes late); a new launch replaces it.
  EXPECT_EQ(files(), std::vector<std::string>{"partial.id"});
  std::vector<std::string> retry_errors;
  const std::vector<Bytes> got = share_in_threads(
      options("partial"), 3, {random_blob(4)}, milliseconds(100), milliseconds(0), &retry_errors);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(retry_errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(got[static_cast<std::size_t>(r)], random_blob(4)) << "rank " << r;
  }
  EXPECT_TRUE(files().empty());
}

TEST_F(RendezvousTest, AFileLeftByAKilledLaunchIsNeverReturned) {
  // An earlier launch's rank 0 published and was killed while waiting for its readers.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      Rendezvous rendezvous(options("reused"), rank_of(0, 2));
      (void)rendezvous.share_from_rank0(random_blob(666));
    } catch (...) {
    }
    ::_exit(0);
  }
  const fs::path stale = dir_ / "rdv" / "reused.id";
  for (int i = 0; i < 2000 && !fs::exists(stale); ++i) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(fs::exists(stale));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(fs::exists(stale));

  // This launch reuses the run id: its reader comes first and finds the stale file.
  Bytes got;
  std::string error;
  std::thread reader([&] {
    Rendezvous rendezvous(options("reused"), rank_of(1, 2));
    try {
      got = rendezvous.share_from_rank0({});
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(300));  // the reader has read and acknowledged it
  EXPECT_TRUE(fs::exists(dir_ / "rdv" / "reused.ack.1"));
  Rendezvous rank0(options("reused"), rank_of(0, 2));
  EXPECT_EQ(rank0.share_from_rank0(random_blob(7)), random_blob(7));
  reader.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(got, random_blob(7));
  EXPECT_TRUE(files().empty());
}

TEST_F(RendezvousTest, GroupSizeMismatchIsReportedOnBothSides) {
  std::string reader_error;
  std::thread reader([&] {
    Rendezvous rendezvous(options("sizes", milliseconds(300)), rank_of(1, 3));
    reader_error = error_of([&] { (void)rendezvous.share_from_rank0({}); });
  });
  Rendezvous rank0(options("sizes", milliseconds(600)), rank_of(0, 2));
  const std::string rank0_error = error_of([&] { (void)rank0.share_from_rank0(random_blob(5)); });
  reader.join();
  EXPECT_NE(rank0_error.find("rank 1 of 2 did not read rank 0's id"), std::string::npos)
      << rank0_error;
  EXPECT_NE(reader_error.find("rank 1 of 3 waited 0.3 s for rank 0 to publish its id (the file "
                              "there is for a group of 2 ranks, this rank's group has 3)"),
            std::string::npos)
      << reader_error;
}

}  // namespace
}  // namespace mxq::dist
