// Counts and sizes given on the command line (--tp, --ep, --align, --intermediate-per-rank,
// --tokens, --layers) are checked against the layer and the machine before anything is allocated
// or written, and refused by flag name; an allocation that fails anyway names the flags. Every
// command runs under `ulimit -v` so that a regression allocates until it fails, not until the
// kernel's OOM killer ends the test machine's processes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "cli_test_support.h"
#include "mxq/io/npy.h"
#include "mxq/moe/synthetic.h"

namespace mxq {
namespace {

using testing::run_cli;
using testing::ScratchDir;

// The address space (KiB) the CLI needs just to start: its shared libraries (a CUDA build maps
// cuBLAS, hundreds of MB) and nothing else. Found once by bisection on `mxq --version`.
std::int64_t startup_address_space_kib(const ScratchDir& dir) {
  static const std::int64_t kib = [&] {
    std::int64_t low = 1 << 10;   // fails
    std::int64_t high = 1 << 24;  // 16 GiB: starts
    while (high - low > (1 << 12)) {
      const std::int64_t mid = (low + high) / 2;
      const bool starts =
          run_cli(dir, "--version", "ulimit -v " + std::to_string(mid) + "; ").exit_code == 0;
      (starts ? high : low) = mid;
    }
    return high;
  }();
  return kib;
}

// `ulimit -v` of what the CLI needs to start plus `extra_kib`.
std::string limit_above_startup(const ScratchDir& dir, std::int64_t extra_kib) {
  return "ulimit -v " + std::to_string(startup_address_space_kib(dir) + extra_kib) + "; ";
}

// 4 GB of address space beyond the start: plenty for every command below that is meant to run.
constexpr std::int64_t kPlentyKib = 4000000;

class SizesCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<ScratchDir>("mxq-cli-sizes");
    moe::SyntheticSpec spec;  // E=6, H=64, I=96 (3 blocks of 32), top-2
    spec.experts = 6;
    spec.hidden = 64;
    spec.intermediate = 96;
    spec.top_k = 2;
    moe::write_synthetic_checkpoint(dir_->file("ckpt"), spec);
    io::write_npy(dir_->file("x.npy"), moe::synthetic_tokens(3, 64, 1));
    env_ = limit_above_startup(*dir_, kPlentyKib) + "MXQ_CACHE_DIR=" + dir_->file("cache");
  }
  [[nodiscard]] std::string moe(const std::string& flags) const {
    return "moe --checkpoint " + dir_->file("ckpt") + " --input " + dir_->file("x.npy") +
           " --output " + dir_->file("y.npy") + " " + flags;
  }
  std::unique_ptr<ScratchDir> dir_;
  std::string env_;
};

void expect_refused(const testing::CliResult& result, const std::string& text) {
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_NE(result.err.find("mxq: error: " + text), std::string::npos) << result.err;
}

TEST_F(SizesCli, TpAboveTheLayersBlocksIsRefusedByName) {
  // I = 96 has 3 blocks of 32 channels: a 4th rank would hold only zero fill.
  auto result = run_cli(*dir_, moe("--tp 4"), env_);
  expect_refused(result, "--tp: expected at most 3");
  EXPECT_NE(result.err.find("I = 96"), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(dir_->file("y.npy")));
  EXPECT_EQ(run_cli(*dir_, moe("--tp 3"), env_).exit_code, 0);

  // `mxq run`'s layer (I = 2880: 90 blocks): refused before the checkpoint is synthesized.
  const auto start = std::chrono::steady_clock::now();
  result = run_cli(*dir_, "run --tp 100000", env_);
  expect_refused(result, "--tp: expected at most 90");
  EXPECT_FALSE(std::filesystem::exists(dir_->file("cache/synth")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST_F(SizesCli, EpAboveTheExpertsAndRankCountsBeyondAnIntAreRefusedByName) {
  expect_refused(run_cli(*dir_, moe("--ep 7"), env_), "--ep: expected at most 6");
  expect_refused(run_cli(*dir_, moe("--ep 0"), env_), "--ep: expected >= 1");
  expect_refused(run_cli(*dir_, moe("--tp 2 --ep 2000000000"), env_), "--ep: expected at most 6");
  // `mxq tune` counts its ranks in an int too: no overflow into a small or negative count.
  expect_refused(run_cli(*dir_, "tune --preset tiny-moe --tp 100000 --ep 100000", env_),
                 "--tp x --ep: expected at most 2147483647 ranks, found 100000 x 100000");
}

TEST_F(SizesCli, SizesBeyondTheMachinesMemoryAreRefusedBeforeAnyAllocation) {
  // P = 2^30 channels per rank: ~650 GB of padded weights.
  auto result = run_cli(*dir_, moe("--align 1073741824"), env_);
  expect_refused(result, "--align: expected a value whose memory fits in the ");
  EXPECT_NE(result.err.find("of host memory available"), std::string::npos) << result.err;
  // An alignment near INT64_MAX overflows nothing.
  expect_refused(run_cli(*dir_, moe("--align 9223372036854775776"), env_),
                 "--align: expected a value whose memory fits in the ");
  expect_refused(run_cli(*dir_, moe("--intermediate-per-rank 34359738368"), env_),
                 "--intermediate-per-rank: expected a value whose memory fits in the ");
  // The forward's buffers: 10^10 tokens of H = 2880.
  result = run_cli(*dir_, "run --tokens 10000000000", env_);
  expect_refused(result, "--tokens: expected a value whose memory fits in the ");
  EXPECT_FALSE(std::filesystem::exists(dir_->file("cache/synth")));
  EXPECT_FALSE(std::filesystem::exists(dir_->file("y.npy")));
}

TEST_F(SizesCli, AnAllocationThatFailsNamesTheFlagsThatSizedIt) {
  // P = 2^19: ~330 MB of padded weights, which the machine has, but 250 MB of address space
  // beyond the start does not. (Where the machine has less, the up-front check refuses --align
  // instead.)
  const auto result = run_cli(*dir_, moe("--align 524288"), limit_above_startup(*dir_, 250000));
  EXPECT_EQ(result.exit_code, 2) << result.err;
  if (result.err.find("of host memory available") == std::string::npos) {
    EXPECT_NE(result.err.find("mxq: error: --tp 1 --ep 1 --intermediate-per-rank 0 --align 524288"),
              std::string::npos)
        << result.err;
    EXPECT_NE(result.err.find("an allocation failed (host allocation of"), std::string::npos)
        << result.err;
  } else {
    expect_refused(result, "--align: expected a value whose memory fits in the ");
  }
  EXPECT_FALSE(std::filesystem::exists(dir_->file("y.npy")));
}

TEST_F(SizesCli, SynthNamesItsFlagsWhenAnAllocationFails) {
  // One default layer (E=32, H=I=2880) needs ~1 GB while it is synthesized: more than 400 MB of
  // address space beyond the start. (Where the machine has less, the up-front check refuses the
  // same flags.)
  const auto result =
      run_cli(*dir_, "synth gpt-oss " + dir_->file("s"), limit_above_startup(*dir_, 400000));
  expect_refused(result, "--experts/--hidden/--intermediate: expected ");
  EXPECT_FALSE(std::filesystem::exists(dir_->file("s")));
}

TEST_F(SizesCli, SynthChecksMemoryAndDiskBeforeWritingAnything) {
  // 2 * 10^9 layers of ~2 kB: terabytes, more than the disk has.
  auto result = run_cli(*dir_,
                        "synth gpt-oss " + dir_->file("s") +
                            " --experts 1 --hidden 32 --intermediate 32 --top-k 1 --layers "
                            "2000000000",
                        limit_above_startup(*dir_, kPlentyKib) + "timeout 60");
  expect_refused(result, "--layers: expected at most ");
  EXPECT_FALSE(std::filesystem::exists(dir_->file("s")));
  // 10^6 experts of H = I = 2880: one layer is terabytes.
  result =
      run_cli(*dir_, "synth gpt-oss " + dir_->file("s") + " --experts 1000000 --top-k 1", env_);
  expect_refused(result, "--experts/--hidden/--intermediate: expected a value whose memory fits");
  EXPECT_FALSE(std::filesystem::exists(dir_->file("s")));
}

}  // namespace
}  // namespace mxq
