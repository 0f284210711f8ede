// The launcher: plans, child environments and the rank processes (posix_spawn + waitpid).
#include "mxq/dist/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "mxq/core/enum_names.h"
#include "mxq/core/error.h"

extern char** environ;  // NOLINT(readability-redundant-declaration)

namespace mxq::dist {

namespace {
constexpr EnumNames<LaunchMode, 3> kLaunchModeNames{{{{LaunchMode::kInProcess, "in-process"},
                                                      {LaunchMode::kSpawn, "spawn"},
                                                      {LaunchMode::kJoin, "join"}}}};
}  // namespace

std::string_view to_string(LaunchMode mode) { return kLaunchModeNames.name(mode); }

LaunchPlan plan_launch(const LaunchRequest& request) {
  const int n = request.ranks;
  if (n < 1) fail_argument(ErrorCode::kInvalidArgument, "ranks (--tp x --ep)", ">= 1", n);
  const std::string ranks = std::to_string(n) + " rank" + (n == 1 ? "" : "s");
  if (!request.on_gpu) {
    return {LaunchMode::kInProcess, ranks + " simulated in this process (CPU)"};
  }
  if (request.env.launcher != "none") {
    if (request.env.size != n) {
      fail(ErrorCode::kInvalidArgument, "ranks: --tp x --ep = ", n, " but the ",
           request.env.launcher, " launcher started a group of ", request.env.size,
           " (this is rank ", request.env.rank, "); start ", n, " processes or change --tp/--ep");
    }
    if (!request.have_nccl) {
      fail(ErrorCode::kUnsupported, "rank ", request.env.rank, " of ", n, " (",
           request.env.launcher,
           " launcher): this mxq was built without NCCL, so its ranks cannot talk");
    }
    return {LaunchMode::kJoin, "rank " + std::to_string(request.env.rank) + " of " +
                                   std::to_string(n) + ", started by the " + request.env.launcher +
                                   " launcher"};
  }
  if (n == 1) return {LaunchMode::kInProcess, "one rank"};
  if (request.visible_gpus < 2) {
    return {LaunchMode::kInProcess, ranks + " simulated in this process on its one GPU"};
  }
  if (n > request.visible_gpus) {
    return {LaunchMode::kInProcess, ranks +
                                        " simulated in this process on GPU 0: more ranks than "
                                        "the " +
                                        std::to_string(request.visible_gpus) + " visible GPUs"};
  }
  if (!request.have_nccl) {
    return {LaunchMode::kInProcess,
            ranks + " simulated in this process on GPU 0: this mxq was built without NCCL"};
  }
  return {LaunchMode::kSpawn,
          ranks + ", one process per GPU (GPUs 0.." + std::to_string(n - 1) + ")"};
}

std::vector<std::string> rank_environment(const std::vector<std::string>& parent, int rank,
                                          int world, const std::string& run_id,
                                          const std::string& rendezvous_dir) {
  static constexpr std::string_view kReplaced[] = {"MXQ_RANK", "MXQ_WORLD_SIZE", "MXQ_LOCAL_RANK",
                                                   "MXQ_RUN_ID", "MXQ_RENDEZVOUS_DIR"};
  std::vector<std::string> out;
  bool nvls_set = false;
  for (const std::string& entry : parent) {
    const std::string_view name = std::string_view(entry).substr(0, entry.find('='));
    if (std::find(std::begin(kReplaced), std::end(kReplaced), name) != std::end(kReplaced)) {
      continue;
    }
    nvls_set = nvls_set || name == "NCCL_NVLS_ENABLE";
    out.push_back(entry);
  }
  out.push_back("MXQ_RANK=" + std::to_string(rank));
  out.push_back("MXQ_WORLD_SIZE=" + std::to_string(world));
  out.push_back("MXQ_LOCAL_RANK=" + std::to_string(rank));
  out.push_back("MXQ_RUN_ID=" + run_id);
  out.push_back("MXQ_RENDEZVOUS_DIR=" + rendezvous_dir);
  if (!nvls_set) out.emplace_back("NCCL_NVLS_ENABLE=0");
  return out;
}

std::vector<std::string> current_environment() {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

std::string new_run_id() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return "mxq-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
}

std::string RankExit::describe() const {
  std::string who = "rank " + std::to_string(rank);
  if (!spawn_error.empty()) return who + " could not be started: " + spawn_error;
  who += " (pid " + std::to_string(pid) + ")";
  if (signal != 0) {
    const char* name = ::strsignal(signal);
    return who +
           (stopped_by_launcher ? " was stopped by the launcher (signal "
                                : " was killed by signal ") +
           std::to_string(signal) + (name != nullptr ? std::string(" ") + name : "") +
           (stopped_by_launcher ? ")" : "");
  }
  return who + " exited with code " + std::to_string(exit_code) +
         (stopped_by_launcher ? " after the launcher stopped it" : "");
}

std::string LaunchResult::failure() const {
  if (ok()) return "";
  std::string out = ranks[static_cast<std::size_t>(failed_rank)].describe();
  std::string others;
  for (const RankExit& r : ranks) {
    if (r.rank == failed_rank) continue;
    others += (others.empty() ? "" : "; ") + r.describe();
  }
  if (!others.empty()) out += "; the other ranks: " + others;
  return out;
}

namespace {

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

LaunchResult run_ranks(const std::vector<std::vector<std::string>>& argv,
                       const std::vector<std::vector<std::string>>& env,
                       const SpawnOptions& options) {
  MXQ_CHECK(!argv.empty() && argv.size() == env.size(), ErrorCode::kInvalidArgument,
            "run_ranks: argv and env: expected one entry per rank (at least one), found ",
            argv.size(), " and ", env.size());
  const std::size_t n = argv.size();
  LaunchResult result;
  result.ranks.resize(n);
  std::vector<bool> running(n, false);
  for (std::size_t r = 0; r < n; ++r) {
    RankExit& rank = result.ranks[r];
    rank.rank = static_cast<int>(r);
    MXQ_CHECK(!argv[r].empty(), ErrorCode::kInvalidArgument, "run_ranks: argv of rank ", r,
              ": expected the executable and its arguments, found nothing");
    std::vector<std::string> args = argv[r];
    std::vector<std::string> vars = env[r];
    std::vector<char*> arg_ptrs = pointers(args);
    std::vector<char*> env_ptrs = pointers(vars);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (r != 0 && options.quiet_other_ranks) {
      posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    }
    pid_t pid = 0;
    const int spawned =
        ::posix_spawn(&pid, args[0].c_str(), &actions, nullptr, arg_ptrs.data(), env_ptrs.data());
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      rank.spawn_error = args[0] + ": " + std::strerror(spawned);
      if (result.failed_rank < 0) result.failed_rank = rank.rank;
      break;  // the ranks already started are stopped below
    }
    rank.pid = pid;
    running[r] = true;
  }
  for (RankExit& rank : result.ranks) {
    if (rank.pid < 0 && rank.spawn_error.empty()) {
      rank.spawn_error = "not started (an earlier rank could not be started)";
    }
  }
  using Clock = std::chrono::steady_clock;
  Clock::time_point kill_at{};
  bool terminated = false;
  bool killed = false;
  for (;;) {
    bool any = false;
    for (std::size_t r = 0; r < n; ++r) {
      if (!running[r]) continue;
      RankExit& rank = result.ranks[r];
      int status = 0;
      const pid_t done = ::waitpid(rank.pid, &status, WNOHANG);
      if (done == 0) {
        any = true;
        continue;
      }
      running[r] = false;
      if (done < 0) {
        rank.spawn_error = std::string("waitpid: ") + std::strerror(errno);
      } else if (WIFEXITED(status)) {
        rank.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        rank.signal = WTERMSIG(status);
      }
      if (!rank.ok() && result.failed_rank < 0) result.failed_rank = rank.rank;
    }
    if (!any) break;
    if (result.failed_rank >= 0 && !terminated) {
      // One rank failed: the others would wait for it in a collective until their timeout.
      for (std::size_t r = 0; r < n; ++r) {
        if (!running[r]) continue;
        result.ranks[r].stopped_by_launcher = true;
        ::kill(result.ranks[r].pid, SIGTERM);
      }
      terminated = true;
      kill_at = Clock::now() + options.grace;
    }
    if (terminated && !killed && Clock::now() >= kill_at) {
      for (std::size_t r = 0; r < n; ++r) {
        if (running[r]) ::kill(result.ranks[r].pid, SIGKILL);
      }
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return result;
}

}  // namespace mxq::dist
