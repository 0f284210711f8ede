// Two GPUs (label multigpu; skipped with fewer): TP=2 and EP=2 as one rank per GPU over NCCL give
// the simulated ranks' result (the same fp32 sum) and the single-GPU TP=1 result within the
// GPU-vs-reference tolerance; `mxq moe --tp 2` spawns one process per GPU with the same output;
// `mxq tune` ranks started with deliberately different caches end with the same digest; a rank
// killed during tuning leaves a cache file that `mxq cache verify` accepts.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include "moe/dist_test_util.h"
#include "mxq/dist/launcher.h"
#include "mxq/io/npy.h"
#include "mxq/moe/dist_layer.h"
#include "mxq/moe/gpu_layer.h"
#if MXQ_WITH_NCCL
#include "mxq/dist/nccl.h"
#endif

namespace mxq::moe {
namespace {

using testing::TempDir;

#if !MXQ_WITH_NCCL
TEST(MoeDistMultiGpu, NeedsNccl) { GTEST_SKIP() << "this mxq was built without NCCL"; }
#else

int device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// One rank per GPU as threads, each reading only its own shard of layer 0 (tp x ep, padded to
// 128); returns each rank's output.
std::vector<Tensor> run_ranks_in_threads(const MoeCheckpoint& checkpoint, int tp, int ep,
                                         const Tensor& x) {
  const int n = tp * ep;
  const dist::NcclUniqueId id = dist::nccl_unique_id();
  std::vector<Tensor> out(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
        dist::NcclCommunicator comm(r, n, id, r, std::chrono::seconds(120));
        const MoeDistLayer dist =
            MoeDistLayer::from_checkpoint(checkpoint, 0, {}, comm, tp, ep, kDefaultAlignment,
                                          static_cast<int>(x.shape()[0]), Device::cuda(r));
        out[static_cast<std::size_t>(r)] = dist.forward_host(x);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void check_split(int tp, int ep) {
  if (device_count() < tp * ep) GTEST_SKIP() << "needs " << tp * ep << " GPUs";
  TempDir dir("ckpt");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  const MoeLayer split = testing::load_dist_layer(dir.file("ckpt"), tp, ep);
  const MoeLayer whole = testing::load_dist_layer(dir.file("ckpt"), 1, 1);
  Tensor x = synthetic_tokens(9, 128, 4);
  x.data_as<float>()[128 * 2 + 7] = std::nanf("");
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const Tensor simulated = MoeGpuLayer::upload(split, 9).forward_host(x);
  const Tensor single = MoeGpuLayer::upload(whole, 9).forward_host(x);
  const Tensor reference = whole.forward(x).output;
  const std::vector<Tensor> ranks =
      run_ranks_in_threads(MoeCheckpoint::open(dir.file("ckpt")), tp, ep, x);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_TRUE(ranks[r].defined()) << "rank " << r;
    // With two ranks the all-reduce adds the same two fp32 partials as the simulation.
    if (tp * ep == 2) EXPECT_EQ(testing::value_differences(ranks[r], simulated), 0) << "rank " << r;
    EXPECT_LE(testing::normalized_difference(ranks[r], single), 4e-3) << "rank " << r;
    EXPECT_LE(testing::normalized_difference(ranks[r], reference), 4e-3) << "rank " << r;
    for (std::int64_t h = 0; h < 128; ++h) {
      EXPECT_TRUE(std::isnan(ranks[r].data_as<float>()[2 * 128 + h])) << "NaN row, rank " << r;
    }
  }
}

TEST(MoeDistMultiGpu, Tp2EqualsTheSingleGpuResult) { check_split(2, 1); }
TEST(MoeDistMultiGpu, Ep2EqualsTheSingleGpuResult) { check_split(1, 2); }
TEST(MoeDistMultiGpu, Tp2Ep2EqualsTheSingleGpuResult) { check_split(2, 2); }

TEST(MoeDistMultiGpu, MxqMoeSpawnsOneProcessPerGpu) {
  TempDir dir("cli");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  io::write_npy(dir.file("x.npy"), synthetic_tokens(5, 128, 3));
  const std::string common = "moe --checkpoint " + dir.file("ckpt") + " --input " +
                             dir.file("x.npy") + " --device cuda --tp 2 --json --output ";
  const testing::CliResult spawned =
      testing::run_cli("", common + dir.file("spawned.npy"), dir, "spawned");
  ASSERT_EQ(spawned.exit_code, 0) << spawned.err;
  EXPECT_NE(spawned.out.find("\"mode\": \"join\""), std::string::npos) << spawned.out;
  EXPECT_NE(spawned.out.find("\"processes\": 2"), std::string::npos) << spawned.out;
  EXPECT_NE(spawned.err.find("2 ranks, one process per GPU"), std::string::npos) << spawned.err;
  const testing::CliResult simulated = testing::run_cli(
      "CUDA_VISIBLE_DEVICES=0", common + dir.file("simulated.npy"), dir, "simulated");
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_EQ(testing::value_differences(io::read_npy(dir.file("spawned.npy")),
                                       io::read_npy(dir.file("simulated.npy"))),
            0);
}

// Starts `mxq arguments` as rank `rank` of 2 (mxq's launcher variables), output to files.
pid_t start_rank(int rank, const std::string& run_id, const std::string& arguments,
                 const TempDir& dir) {
  const std::string command =
      "MXQ_RANK=" + std::to_string(rank) + " MXQ_WORLD_SIZE=2 MXQ_RUN_ID=" + run_id +
      " MXQ_RENDEZVOUS_DIR=" + dir.file("rdv") + " NCCL_NVLS_ENABLE=0 exec " + MXQ_CLI_PATH + " " +
      arguments + " >" + dir.file("rank" + std::to_string(rank) + ".out") + " 2>" +
      dir.file("rank" + std::to_string(rank) + ".err");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(MoeDistMultiGpu, TuningRanksWithDifferentCachesAgree) {
  TempDir dir("tune");
  const std::string base = "tune --preset tiny-moe --device cuda --tp 2 --ops moe_gpu_forward ";
  // Different pre-existing caches: rank 0's knows bucket 1, rank 1's bucket 2 (tuned alone).
  for (int r = 0; r < 2; ++r) {
    const testing::CliResult alone =
        testing::run_cli("CUDA_VISIBLE_DEVICES=" + std::to_string(r),
                         base + "--tokens " + std::to_string(r + 1) + " --cache " +
                             dir.file("cache" + std::to_string(r) + ".json"),
                         dir, "alone" + std::to_string(r));
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(start_rank(
        r, "agree",
        base + "--tokens 1,2,4 --json --cache " + dir.file("cache" + std::to_string(r) + ".json"),
        dir));
  }
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(wait_exit(pids[static_cast<std::size_t>(r)]), 0)
        << slurp(dir.file("rank" + std::to_string(r) + ".err"));
  std::smatch m0;
  std::smatch m1;
  const std::string out0 = slurp(dir.file("rank0.out"));
  const std::string err1 = slurp(dir.file("rank1.err"));
  ASSERT_TRUE(std::regex_search(out0, m0, std::regex("\"digest\": \"([0-9a-f]{16})\""))) << out0;
  ASSERT_TRUE(std::regex_search(err1, m1, std::regex("rank 1 of 2: .* digest ([0-9a-f]{16})")))
      << err1;
  EXPECT_EQ(m0[1].str(), m1[1].str());
}

TEST(MoeDistMultiGpu, ARankKilledDuringTuningLeavesAValidCache) {
  TempDir dir("kill");
  const std::string cache = dir.file("node.json");  // one file for the node, both ranks
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(start_rank(r, "kill",
                              "tune --preset tiny-moe --device cuda --tp 2 --ops moe_gpu_forward "
                              "--tokens 1,2,4,8,16,32,64,128 --cache " +
                                  cache,
                              dir));
  }
  // Kill rank 1 once the first winner is saved, as a crash would; then stop rank 0 as the
  // launcher does.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (!std::filesystem::exists(cache) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(cache)) << slurp(dir.file("rank0.err"));
  ::kill(pids[1], SIGKILL);
  EXPECT_EQ(wait_exit(pids[1]), 128 + SIGKILL);
  ::kill(pids[0], SIGTERM);
  (void)wait_exit(pids[0]);
  const testing::CliResult verify = testing::run_cli("", "cache verify " + cache, dir, "verify");
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

#endif  // MXQ_WITH_NCCL

}  // namespace
}  // namespace mxq::moe
