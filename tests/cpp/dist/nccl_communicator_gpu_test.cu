// NcclCommunicator on real GPUs: a single rank passes the communicator contract shared with the
// in-process communicator (communicator_contract.h), the autotuner seals with it, bad arguments
// are clear errors and a rank that never joins is a timeout, not a hang. With two GPUs: two
// ranks as two threads, and two ranks as two processes that meet through the file rendezvous
// and the launcher variables (MXQ_RANK, ...), each passing the contract and agreeing on one
// tuning table. (NCCL does not allow two ranks of one communicator on one GPU, so one GPU allows
// only the single-rank tests.)
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include "dist/communicator_contract.h"
#include "mxq/dist/rendezvous.h"
#include "mxq/tune/autotuner.h"
#include "tune/tune_test_util.h"
#if MXQ_WITH_NCCL
#include "mxq/dist/nccl.h"
#endif

extern char** environ;  // NOLINT(readability-redundant-declaration)

namespace mxq::dist {
namespace {

#if !MXQ_WITH_NCCL

TEST(NcclCommunicator, NeedsABuildWithNccl) {
  GTEST_SKIP() << "this mxq was built without NCCL (see MXQ_NCCL and NCCL_ROOT in "
                  "docs/DEVELOPING.md)";
}

#else

namespace fs = std::filesystem;
using tune::testing::TempDir;

int device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// ---- the autotuner on a communicator --------------------------------------------------------

const tune::TacticRegistry& pair_registry() {
  static const tune::TacticRegistry* registry = [] {
    auto* r = new tune::TacticRegistry();
    tune::testing::add_synthetic_op(*r, "pair", {{"base", 100.0}, {"a", 90.0}, {"b", 89.5}},
                                    {1, 2, 4, 8});
    r->freeze();
    return r;
  }();
  return *registry;
}

const tune::Problem& pair_problem() {
  static const tune::Problem problem = tune::testing::synthetic_problem("pair", 64);
  return problem;
}

std::string key_at(std::int64_t bucket) {
  tune::CacheEntry e;
  e.problem = pair_problem();
  e.bucket = bucket;
  return e.key();
}

struct TunerOutcome {
  std::vector<std::pair<std::string, std::string> > decisions;  // key -> tactic
  std::uint64_t digest = 0;
  std::vector<std::string> warnings;
  std::string error;
};

// One rank's tuning run: its cache file starts with a decision for bucket 1 ("a" on rank 0, "b"
// elsewhere), its virtual clock has noise and a bias of its own; it tunes buckets 1..8 and seals.
TunerOutcome tune_and_seal(Communicator* comm, int rank, const std::string& cache_path) {
  TunerOutcome out;
  try {
    tune::testing::VirtualClock& clock = tune::testing::virtual_clock();
    clock = tune::testing::VirtualClock{};
    clock.rng.seed(77 + static_cast<std::uint64_t>(rank));
    clock.noise = 0.03;
    clock.bias = {{rank % 2 == 0 ? "a" : "b", 0.96}};
    tune::CacheEntry cached;
    cached.problem = pair_problem();
    cached.bucket = 1;
    cached.tactic = rank == 0 ? "a" : "b";
    cached.pass = "earlier run";
    cached.tuned_at = "2026-01-01T00:00:00Z";
    tune::CacheStore store(cache_path, tune::cpu_fingerprint(pair_registry()));
    if (!store.save(std::vector<tune::CacheEntry>{cached}).ok)
      throw std::runtime_error("cannot write " + cache_path);

    tune::AutotunerConfig config;
    config.registry = &pair_registry();
    config.options.mode = tune::AutotuneMode::kTune;
    config.options.cache_path = cache_path;
    config.communicator = comm;
    config.timer = std::make_shared<tune::testing::VirtualTimer>();
    tune::Autotuner tuner(config);
    {
      tune::TuningSession session(tuner, "target");
      for (const std::int64_t bucket : {1, 2, 4, 8}) session.tune(pair_problem(), bucket);
    }
    tuner.seal();
    for (const tune::CacheEntry& e : tuner.decisions())
      out.decisions.emplace_back(e.key(), e.tactic);
    out.digest = tuner.decisions_digest();
    out.warnings = tuner.warnings();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

// On every rank of `comm`'s group at once: all ranks end with one table (compared through the
// communicator itself), rank 0's cached decision for bucket 1 stands, the others were told.
void check_tuner_consensus(Communicator& comm, const std::string& dir) {
  const int r = comm.rank();
  const TunerOutcome mine =
      tune_and_seal(&comm, r, (fs::path(dir) / ("rank" + std::to_string(r) + ".json")).string());
  ASSERT_EQ(mine.error, "") << "rank " << r;
  std::vector<std::uint8_t> digest(sizeof mine.digest);
  std::memcpy(digest.data(), &mine.digest, sizeof mine.digest);
  const std::vector<std::vector<std::uint8_t> > digests = comm.all_gather(digest);
  for (int q = 1; q < comm.size(); ++q) {
    EXPECT_EQ(digests[static_cast<std::size_t>(q)], digests[0]) << "rank " << q << "'s table";
  }
  const std::map<std::string, std::string> decided(mine.decisions.begin(), mine.decisions.end());
  EXPECT_EQ(decided.size(), 4U) << "rank " << r;
  EXPECT_EQ(decided.count(key_at(1)) ? decided.at(key_at(1)) : "", "a") << "rank " << r;
  if (r != 0) {
    bool told = false;
    for (const std::string& w : mine.warnings)
      told = told || w.find(key_at(1) + ": b here, a on rank 0") != std::string::npos;
    EXPECT_TRUE(told) << "rank " << r << " adopted rank 0's decision without a warning";
  }
}

// ---- one GPU ---------------------------------------------------------------------------------

TEST(NcclCommunicator, OneRankMeetsTheContract) {
  NcclCommunicator comm(0, 1, nccl_unique_id(), 0);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.device(), 0);
  EXPECT_GE(nccl_runtime_version(), 20000);
  testing::check_communicator_contract(comm);
}

TEST(NcclCommunicator, FromARendezvousOnTheLocalRanksDevice) {
  TempDir dir;
  Rendezvous rendezvous(RendezvousOptions{dir.file("rdv"), "one", std::chrono::seconds(30)},
                        RankInfo{0, 1, 0, "test"});
  const std::unique_ptr<NcclCommunicator> comm = make_nccl_communicator(rendezvous);
  EXPECT_EQ(comm->device(), 0);
  testing::check_communicator_contract(*comm);
}

TEST(NcclCommunicator, RestoresTheCallersDevice) {
  if (device_count() < 2) GTEST_SKIP() << "needs a second GPU to be current";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  {
    NcclCommunicator comm(0, 1, nccl_unique_id(), 0);
    std::vector<double> v = {1.0};
    comm.all_reduce(v, ReduceOp::kSum);
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 1);
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(NcclCommunicator, BadArgumentsAreClearErrors) {
  const int count = device_count();
  auto error_of = [](const std::function<void()>& body) -> std::string {
    try {
      body();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(error_of([&] { NcclCommunicator c(0, 1, nccl_unique_id(), count); }),
            "CUDA device of NCCL rank 0: expected 0.." + std::to_string(count - 1) +
                " (GPUs visible to this process), found " + std::to_string(count));
  EXPECT_EQ(error_of([] { NcclCommunicator c(1, 1, nccl_unique_id(), 0); }),
            "NCCL communicator rank: expected 0..0, found 1");
  EXPECT_EQ(error_of([] { NcclCommunicator c(0, 0, nccl_unique_id(), 0); }),
            "NCCL communicator size: expected >= 1, found 0");
  EXPECT_EQ(
      error_of([] { NcclCommunicator c(0, 1, nccl_unique_id(), 0, std::chrono::milliseconds(0)); }),
      "NCCL timeout: expected > 0 ms, found 0");
  // The communicator stays usable after a caller error.
  NcclCommunicator comm(0, 1, nccl_unique_id(), 0);
  std::vector<std::uint8_t> bytes = {1};
  EXPECT_THROW(comm.broadcast(bytes, 1), Error);
  std::vector<double> v = {2.0};
  comm.all_reduce(v, ReduceOp::kMax);
  EXPECT_EQ(v[0], 2.0);
}

TEST(NcclCommunicator, TheAutotunerSealsWithIt) {
  TempDir dir;
  NcclCommunicator comm(0, 1, nccl_unique_id(), 0);
  const TunerOutcome with_nccl = tune_and_seal(&comm, 0, dir.file("nccl.json"));
  ASSERT_EQ(with_nccl.error, "");
  // The same run on the built-in single rank decides the same table.
  const TunerOutcome solo = tune_and_seal(nullptr, 0, dir.file("solo.json"));
  ASSERT_EQ(solo.error, "");
  EXPECT_EQ(with_nccl.decisions.size(), 4U);
  EXPECT_EQ(with_nccl.decisions, solo.decisions);
  EXPECT_EQ(with_nccl.digest, solo.digest);
  check_tuner_consensus(comm, dir.path().string());
}

// ---- children: this binary run again as one rank (see the tests that start them) ------------

struct ChildResult {
  int exit_code = -1;  // 128 + signal when killed
  bool timed_out = false;
  std::string output;
};

// Runs this test binary with a gtest filter and extra environment; kills it after `timeout`.
ChildResult run_self(const std::string& filter, const std::vector<std::string>& env,
                     std::chrono::seconds timeout) {
  TempDir capture;
  const std::string log = capture.file("output");
  std::string exe = fs::read_symlink("/proc/self/exe").string();
  std::string filter_arg = "--gtest_filter=" + filter;
  std::vector<char*> argv = {exe.data(), filter_arg.data(), nullptr};
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  ChildResult result;
  const int spawned = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    result.output = "posix_spawn failed: " + std::string(std::strerror(spawned));
    return result;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.output = tune::testing::read_file(log);
  return result;
}

// Which child role this process plays (empty in a normal run).
std::string child_role() {
  const char* role = std::getenv("MXQTEST_NCCL_CHILD");
  return role == nullptr ? "" : role;
}

TEST(NcclChild, MissingPeer) {
  if (child_role() != "missing_peer") GTEST_SKIP() << "runs as a child of MissingRankTimesOut";
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    NcclCommunicator comm(0, 2, nccl_unique_id(), 0, std::chrono::seconds(3));
  } catch (const Error& e) {
    error = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find("did not complete within 3000 ms"), std::string::npos) << error;
  EXPECT_LT(seconds, 60.0);
}

TEST(NcclCommunicator, MissingRankTimesOutInsteadOfHanging) {
  // In a child process, so that NCCL's abandoned bootstrap cannot affect the other tests.
  const ChildResult child = run_self("NcclChild.MissingPeer", {"MXQTEST_NCCL_CHILD=missing_peer"},
                                     std::chrono::seconds(120));
  EXPECT_FALSE(child.timed_out) << "the join hung:\n" << child.output;
  EXPECT_EQ(child.exit_code, 0) << child.output;
  EXPECT_NE(child.output.find("[  PASSED  ] 1 test"), std::string::npos) << child.output;
}

// ---- two GPUs ----------------------------------------------------------------------------------

// What every rank of a two-rank group checks: the contract, lengths that differ fail on both
// ranks and leave the communicator usable, one tuning table.
void check_two_rank_group(Communicator& comm, const std::string& dir) {
  testing::check_communicator_contract(comm);
  const std::string error = testing::mismatched_all_reduce_error(comm);
  EXPECT_NE(error.find("ranks passed different lengths (from 1 to 2 values"), std::string::npos)
      << error;
  std::vector<double> v = {static_cast<double>(comm.rank())};
  comm.all_reduce(v, ReduceOp::kSum);
  EXPECT_EQ(v[0], 1.0);
  check_tuner_consensus(comm, dir);
}

TEST(NcclCommunicator, TwoRanksInTwoThreads) {
  if (device_count() < 2) {
    GTEST_SKIP() << "needs two GPUs (NCCL does not allow two ranks on one GPU); " << device_count()
                 << " visible";
  }
  TempDir dir;
  const NcclUniqueId id = nccl_unique_id();
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        NcclCommunicator comm(r, 2, id, r, std::chrono::seconds(120));
        EXPECT_EQ(comm.device(), r);
        check_two_rank_group(comm, dir.path().string());
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
}

TEST(NcclChild, Rank) {
  if (child_role() != "rank") GTEST_SKIP() << "runs as a child of TwoRanksInTwoProcesses";
  Rendezvous rendezvous = Rendezvous::from_env();
  ASSERT_EQ(rendezvous.ranks().launcher, "mxq");
  const std::unique_ptr<NcclCommunicator> comm =
      make_nccl_communicator(rendezvous, -1, std::chrono::seconds(120));
  EXPECT_EQ(comm->device(), rendezvous.ranks().local_rank);
  check_two_rank_group(*comm, std::getenv("MXQTEST_NCCL_DIR"));
}

TEST(NcclCommunicator, TwoRanksInTwoProcesses) {
  if (device_count() < 2) {
    GTEST_SKIP() << "needs two GPUs (NCCL does not allow two ranks on one GPU); " << device_count()
                 << " visible";
  }
  TempDir dir;
  std::vector<ChildResult> results(2);
  std::vector<std::thread> launcher;
  for (int r = 0; r < 2; ++r) {
    launcher.emplace_back([&, r] {
      results[static_cast<std::size_t>(r)] =
          run_self("NcclChild.Rank",
                   {"MXQTEST_NCCL_CHILD=rank", "MXQTEST_NCCL_DIR=" + dir.path().string(),
                    "MXQ_RANK=" + std::to_string(r), "MXQ_WORLD_SIZE=2",
                    "MXQ_RENDEZVOUS_DIR=" + dir.file("rdv"), "MXQ_RUN_ID=two-processes",
                    "MXQ_RENDEZVOUS_TIMEOUT=120"},
                   std::chrono::seconds(300));
    });
  }
  for (auto& t : launcher) t.join();
  for (int r = 0; r < 2; ++r) {
    const ChildResult& child = results[static_cast<std::size_t>(r)];
    EXPECT_FALSE(child.timed_out) << "rank " << r << " hung:\n" << child.output;
    EXPECT_EQ(child.exit_code, 0) << "rank " << r << ":\n" << child.output;
    EXPECT_NE(child.output.find("[  PASSED  ] 1 test"), std::string::npos) << "rank " << r << ":\n"
                                                                           << child.output;
  }
  EXPECT_FALSE(fs::exists(dir.file("rdv/two-processes.id"))) << "the rendezvous left its file";
}

#endif  // MXQ_WITH_NCCL

}  // namespace
}  // namespace mxq::dist
