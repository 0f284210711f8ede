// How a multi-rank command runs its TP x EP ranks (mxq/dist/launcher.h decides): simulated in
// this process, one spawned process per GPU (this binary run again with MXQ_RANK, ... set), or as
// one rank of a group an outside launcher (torchrun, mpirun) or a spawning mxq started.
#pragma once

#include <memory>
#include <string>

#include "mxq/dist/communicator.h"
#include "mxq/dist/launcher.h"

namespace mxq::cli {

struct RankSetup {
  dist::LaunchPlan plan;
  dist::RankInfo rank;                       // rank 0 of 1 unless joined
  std::unique_ptr<dist::Communicator> comm;  // kJoin: the NCCL group; else null
  [[nodiscard]] bool spawned() const { return plan.mode == dist::LaunchMode::kSpawn; }
  [[nodiscard]] bool joined() const { return plan.mode == dist::LaunchMode::kJoin; }
  // Rank 0 (or the one process) prints the command's output.
  [[nodiscard]] bool prints() const { return rank.rank == 0; }
};

// Plans the launch of `ranks` ranks for `command` (its name, for messages). kSpawn: runs this
// binary once per rank with the same arguments, waits for all, and returns with spawned() true
// (the caller returns: rank 0 printed); a failed rank is an mxq::Error naming it and its exit.
// kJoin: joins the group over NCCL (rendezvous from the environment) on the local rank's GPU,
// which becomes current. kInProcess: nothing to do.
RankSetup launch_ranks(const std::string& command, int ranks, bool on_gpu);

// The plan launch_ranks(command, ranks, on_gpu) follows, with nothing started: a command refuses
// with it, before any process starts, what only ranks simulated in one process support.
dist::LaunchPlan plan_ranks(int ranks, bool on_gpu);

}  // namespace mxq::cli
