// Starting the ranks of a multi-GPU command: whether to simulate the ranks in this process, spawn
// one process per rank, or join a group an outside launcher (torchrun, mpirun, mxq's own) already
// started; the environment each spawned rank gets; and running the rank processes to the end,
// stopping them all when one fails. CPU-only; always built (the NCCL group itself: nccl.h).
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/dist/rendezvous.h"

namespace mxq::dist {

enum class LaunchMode {
  kInProcess,  // every rank simulated in this process (CPU, one GPU, one rank, no NCCL)
  kSpawn,      // this process starts one process per rank and waits for them
  kJoin,       // this process is one rank of a group started by a launcher
};
std::string_view to_string(LaunchMode mode);

struct LaunchRequest {
  int ranks = 1;           // TP x EP ranks the command runs
  bool on_gpu = false;     // --device cuda
  int visible_gpus = 0;    // GPUs this process sees
  bool have_nccl = false;  // this mxq was built with NCCL
  RankInfo env;            // rank_info_from_env(): launcher "none" when no launcher started us
};

struct LaunchPlan {
  LaunchMode mode = LaunchMode::kInProcess;
  std::string reason;  // one line: why this mode
};

// kJoin when a launcher's variables are set (their world size must equal `ranks`, else an
// mxq::Error naming both; on the CPU the variables are ignored: the ranks are simulated), kSpawn
// for 1 < ranks <= visible_gpus on the GPU with NCCL, else kInProcess. Throws for ranks < 1.
LaunchPlan plan_launch(const LaunchRequest& request);

// The environment of spawned rank `rank` of `world`: `parent` ("NAME=value" strings) without
// any MXQ_RANK, MXQ_WORLD_SIZE, MXQ_LOCAL_RANK, MXQ_RUN_ID, MXQ_RENDEZVOUS_DIR, plus those set for
// this rank (local rank = rank: one node), and NCCL_NVLS_ENABLE=0 unless the parent sets it (NVLink
// multicast stays off).
std::vector<std::string> rank_environment(const std::vector<std::string>& parent, int rank,
                                          int world, const std::string& run_id,
                                          const std::string& rendezvous_dir);

// This process's environment as "NAME=value" strings.
std::vector<std::string> current_environment();

// A run id no other launch shares (it names the rendezvous files): "mxq-<pid>-<clock>".
std::string new_run_id();

struct RankExit {
  int rank = 0;
  int pid = -1;
  int exit_code = -1;                // when it exited; -1 when killed by a signal or never started
  int signal = 0;                    // the signal that ended it, 0 when it exited
  bool stopped_by_launcher = false;  // the launcher signalled it after another rank failed
  std::string spawn_error;           // posix_spawn failed (the rank never ran)
  [[nodiscard]] bool ok() const { return exit_code == 0; }
  // "rank 1 (pid 42) exited with code 3", "... was killed by signal 9 (Killed)", ...
  [[nodiscard]] std::string describe() const;
};

struct LaunchResult {
  std::vector<RankExit> ranks;
  int failed_rank = -1;  // the first rank that failed; -1 when all exited with 0
  [[nodiscard]] bool ok() const { return failed_rank < 0; }
  // The first failure and what happened to the other ranks (empty when ok).
  [[nodiscard]] std::string failure() const;
};

struct SpawnOptions {
  // After a rank fails, the others get SIGTERM, then SIGKILL after this long.
  std::chrono::milliseconds grace = std::chrono::seconds(5);
  // Ranks other than 0 write their stdout to /dev/null (rank 0 prints the output); stderr stays.
  bool quiet_other_ranks = true;
};

// Starts argv[r] with environment env[r] for every rank r (argv[r][0] is the executable's path),
// waits for all. When one exits with a non-zero code or dies by a signal, the others are stopped
// (SIGTERM, then SIGKILL after the grace period) and the result names the first failure.
LaunchResult run_ranks(const std::vector<std::vector<std::string>>& argv,
                       const std::vector<std::vector<std::string>>& env,
                       const SpawnOptions& options = {});

}  // namespace mxq::dist
