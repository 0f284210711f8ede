#include "launch.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

#include "mxq/core/build_info.h"
#include "mxq/core/error.h"
#include "mxq/dist/rendezvous.h"

#if MXQ_WITH_CUDA
#include <cuda_runtime_api.h>

#include "mxq/core/cuda_check.h"
#endif
#if MXQ_WITH_NCCL
#include "mxq/dist/nccl.h"
#endif

namespace mxq::cli {
namespace {

// This process's argv, from /proc (main() does not hand it around).
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  std::string current;
  for (const char c : all) {
    if (c == '\0') {
      out.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  MXQ_CHECK(!out.empty(), ErrorCode::kIo, "launcher: cannot read /proc/self/cmdline");
  std::error_code error;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", error).string();
  MXQ_CHECK(!error, ErrorCode::kIo, "launcher: cannot read /proc/self/exe: ", error.message());
  out[0] = exe;
  return out;
}

}  // namespace

dist::LaunchPlan plan_ranks(int ranks, bool on_gpu) {
  dist::LaunchRequest request;
  request.ranks = ranks;
  request.on_gpu = on_gpu;
  request.visible_gpus = on_gpu ? static_cast<int>(query_gpus().gpus.size()) : 0;
  request.have_nccl = MXQ_WITH_NCCL != 0;
  request.env = on_gpu ? dist::rank_info_from_env() : dist::RankInfo{};
  return dist::plan_launch(request);
}

RankSetup launch_ranks(const std::string& command, int ranks, bool on_gpu) {
  RankSetup setup;
  setup.plan = plan_ranks(ranks, on_gpu);
  if (setup.plan.mode == dist::LaunchMode::kSpawn) {
    std::cerr << "mxq " << command << ": " << setup.plan.reason << std::endl;
    const std::vector<std::string> argv = own_arguments();
    const std::string run_id = dist::new_run_id();
    const std::string dir = dist::RendezvousOptions::from_env().dir;
    const std::vector<std::string> parent = dist::current_environment();
    std::vector<std::vector<std::string>> argvs;
    std::vector<std::vector<std::string>> envs;
    for (int r = 0; r < ranks; ++r) {
      argvs.push_back(argv);
      envs.push_back(dist::rank_environment(parent, r, ranks, run_id, dir));
    }
    const dist::LaunchResult result = dist::run_ranks(argvs, envs);
    if (!result.ok()) fail(ErrorCode::kInternal, "mxq ", command, ": ", result.failure());
    return setup;
  }
  if (setup.plan.mode == dist::LaunchMode::kJoin) {
#if MXQ_WITH_NCCL
    dist::Rendezvous rendezvous = dist::Rendezvous::from_env();
    setup.rank = rendezvous.ranks();
    MXQ_CUDA_CHECK(cudaSetDevice(setup.rank.local_rank));
    setup.comm = dist::make_nccl_communicator(rendezvous);
#endif
  }
  return setup;
}

}  // namespace mxq::cli
