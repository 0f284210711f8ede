// The launcher's logic without GPUs: which mode a command runs in, the environment of spawned
// ranks, and the rank processes (spawned through the same code as `mxq run --tp N` on several
// GPUs, here running /bin/sh): all succeed; one fails and the others are stopped with a report
// naming it; a rank killed by a signal; an executable that does not exist.
#include "mxq/dist/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>

#include "mxq/core/error.h"

namespace mxq::dist {
namespace {

LaunchRequest gpu_request(int ranks, int gpus) {
  LaunchRequest r;
  r.ranks = ranks;
  r.on_gpu = true;
  r.visible_gpus = gpus;
  r.have_nccl = true;
  return r;
}

std::string error_of(const LaunchRequest& request) {
  try {
    (void)plan_launch(request);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PlanLaunch, SpawnsOneProcessPerGpuOnlyWhenThereAreEnough) {
  EXPECT_EQ(plan_launch(gpu_request(2, 2)).mode, LaunchMode::kSpawn);
  EXPECT_EQ(plan_launch(gpu_request(4, 8)).mode, LaunchMode::kSpawn);
  EXPECT_EQ(plan_launch(gpu_request(2, 2)).reason, "2 ranks, one process per GPU (GPUs 0..1)");
  // One GPU: the ranks are simulated in this process, as before.
  EXPECT_EQ(plan_launch(gpu_request(2, 1)).mode, LaunchMode::kInProcess);
  EXPECT_EQ(plan_launch(gpu_request(2, 1)).reason,
            "2 ranks simulated in this process on its one GPU");
  EXPECT_EQ(plan_launch(gpu_request(4, 2)).mode, LaunchMode::kInProcess);
  EXPECT_EQ(plan_launch(gpu_request(1, 8)).mode, LaunchMode::kInProcess);
  LaunchRequest no_nccl = gpu_request(2, 2);
  no_nccl.have_nccl = false;
  EXPECT_EQ(plan_launch(no_nccl).mode, LaunchMode::kInProcess);
  EXPECT_NE(plan_launch(no_nccl).reason.find("without NCCL"), std::string::npos);
  // The CPU simulates every rank, whatever the machine has.
  LaunchRequest cpu = gpu_request(2, 8);
  cpu.on_gpu = false;
  EXPECT_EQ(plan_launch(cpu).mode, LaunchMode::kInProcess);
  EXPECT_EQ(error_of(gpu_request(0, 2)), "ranks (--tp x --ep): expected >= 1, found 0");
}

TEST(PlanLaunch, JoinsAGroupALauncherStarted) {
  LaunchRequest r = gpu_request(2, 1);  // torchrun gave this process one GPU
  r.env = RankInfo{1, 2, 0, "torchrun"};
  const LaunchPlan plan = plan_launch(r);
  EXPECT_EQ(plan.mode, LaunchMode::kJoin);
  EXPECT_EQ(plan.reason, "rank 1 of 2, started by the torchrun launcher");
  r.ranks = 4;
  EXPECT_EQ(error_of(r),
            "ranks: --tp x --ep = 4 but the torchrun launcher started a group of 2 (this is rank "
            "1); start 4 processes or change --tp/--ep");
  r.ranks = 2;
  r.have_nccl = false;
  EXPECT_NE(error_of(r).find("built without NCCL"), std::string::npos);
}

TEST(RankEnvironment, SetsTheRankVariablesAndKeepsNvlsOff) {
  const std::vector<std::string> parent = {"PATH=/bin", "MXQ_RANK=7", "MXQ_RUN_ID=old",
                                           "HOME=/root", "MXQ_RENDEZVOUS_DIR=/old"};
  const std::vector<std::string> env = rank_environment(parent, 1, 2, "job-1", "/tmp/rdv");
  const std::vector<std::string> expected = {"PATH=/bin",
                                             "HOME=/root",
                                             "MXQ_RANK=1",
                                             "MXQ_WORLD_SIZE=2",
                                             "MXQ_LOCAL_RANK=1",
                                             "MXQ_RUN_ID=job-1",
                                             "MXQ_RENDEZVOUS_DIR=/tmp/rdv",
                                             "NCCL_NVLS_ENABLE=0"};
  EXPECT_EQ(env, expected);
  // The user's own setting wins.
  const std::vector<std::string> user =
      rank_environment({"NCCL_NVLS_ENABLE=1"}, 0, 2, "job-1", "/tmp/rdv");
  EXPECT_EQ(std::count(user.begin(), user.end(), "NCCL_NVLS_ENABLE=1"), 1);
  EXPECT_EQ(std::count_if(user.begin(), user.end(),
                          [](const std::string& e) { return e.starts_with("NCCL_NVLS_ENABLE="); }),
            1);
  EXPECT_NE(new_run_id(), new_run_id());
}

std::vector<std::string> shell(const std::string& script) { return {"/bin/sh", "-c", script}; }

TEST(RunRanks, AllRanksSucceedWithTheirOwnEnvironment) {
  std::vector<std::vector<std::string>> argv;
  std::vector<std::vector<std::string>> env;
  for (int r = 0; r < 3; ++r) {
    argv.push_back(shell("test \"$MXQ_RANK\" = " + std::to_string(r) +
                         " && test \"$MXQ_WORLD_SIZE\" = 3 && test \"$NCCL_NVLS_ENABLE\" = 0"));
    env.push_back(rank_environment(current_environment(), r, 3, new_run_id(), "/tmp/x"));
  }
  const LaunchResult result = run_ranks(argv, env);
  EXPECT_TRUE(result.ok()) << result.failure();
  ASSERT_EQ(result.ranks.size(), 3U);
  for (const RankExit& r : result.ranks) EXPECT_EQ(r.exit_code, 0) << r.describe();
}

TEST(RunRanks, AFailedRankStopsTheOthersAndIsNamed) {
  // Ranks 0 and 2 would wait for a minute (like ranks blocked in a collective with a dead peer).
  const std::vector<std::vector<std::string>> argv = {shell("exec sleep 60"), shell("exit 3"),
                                                      shell("exec sleep 60")};
  const std::vector<std::vector<std::string>> env(3, current_environment());
  SpawnOptions options;
  options.grace = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult result = run_ranks(argv, env, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20.0) << "the other ranks were not stopped";
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.failed_rank, 1);
  EXPECT_EQ(result.ranks[1].exit_code, 3);
  EXPECT_FALSE(result.ranks[1].stopped_by_launcher);
  for (const int r : {0, 2}) {
    EXPECT_TRUE(result.ranks[static_cast<std::size_t>(r)].stopped_by_launcher);
    EXPECT_EQ(result.ranks[static_cast<std::size_t>(r)].signal, SIGTERM);
  }
  const std::string failure = result.failure();
  EXPECT_TRUE(failure.starts_with("rank 1 (pid " + std::to_string(result.ranks[1].pid) +
                                  ") exited with code 3; the other ranks: rank 0 (pid"))
      << failure;
  EXPECT_NE(failure.find("was stopped by the launcher (signal 15"), std::string::npos) << failure;
}

TEST(RunRanks, ARankKilledByASignalIsAFailure) {
  const LaunchResult result =
      run_ranks({shell("kill -9 $$"), shell("exit 0")}, {current_environment(), {}});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.failed_rank, 0);
  EXPECT_EQ(result.ranks[0].signal, 9);
  EXPECT_NE(result.failure().find("rank 0 (pid "), std::string::npos);
  EXPECT_NE(result.failure().find(") was killed by signal 9"), std::string::npos)
      << result.failure();
}

TEST(RunRanks, AMissingExecutableIsReported) {
  const LaunchResult result = run_ranks({{"/nonexistent/mxq", "run"}, shell("exec sleep 60")},
                                        {current_environment(), current_environment()});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.failed_rank, 0);
  EXPECT_EQ(result.failure().rfind("rank 0 could not be started: /nonexistent/mxq: ", 0), 0U)
      << result.failure();
  EXPECT_THROW((void)run_ranks({}, {}), Error);
}

}  // namespace
}  // namespace mxq::dist
