// `mxq bench linear --shape N,K`, `mxq bench tma-stream`'s and `mxq bench wgmma-rate`'s options: a
// malformed value is refused by flag name before any GPU is looked for, so the error is the same on
// a machine without one.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "cli_test_support.h"

namespace mxq {
namespace {

using testing::run_cli;
using testing::ScratchDir;

TEST(BenchCli, MalformedShapeIsRefusedByName) {
  const ScratchDir dir("mxq-bench-cli");
  for (const std::string shape : {"7168", "7168,x", "x,16384", "7168,16384,1", "0,512", "-4,512",
                                  "7168,", ",512", "7168;512"}) {
    const auto result = run_cli(dir, "bench linear --shape '" + shape + "'");
    EXPECT_EQ(result.exit_code, 2) << shape;
    EXPECT_NE(
        result.err.find("--shape: expected N,K with two positive integers, found '" + shape + "'"),
        std::string::npos)
        << shape << ": " << result.err;
  }
}

TEST(BenchCli, WellFormedShapeGetsPastTheParser) {
  const ScratchDir dir("mxq-bench-cli-ok");
  const auto result = run_cli(dir, "bench linear --shape 7168,16384 --shape 64,128 --m 1");
  // On a machine without a GPU (or without CUDA) the next error is about the GPU, not the shape;
  // with one, the bench runs.
  EXPECT_EQ(result.err.find("--shape"), std::string::npos) << result.err;
}

TEST(BenchCli, AnUnknownTacticIsRefusedByNameBeforeAnyGpuIsLookedFor) {
  const ScratchDir dir("mxq-bench-cli-tactic");
  const auto result =
      run_cli(dir, "bench linear --shape 7168,2048 --m 64 --tactic auto,cuda.sm90_wgmma.m64n7");
  if (result.err.find("needs a CUDA build") != std::string::npos) {
    GTEST_SKIP() << "a build without CUDA knows no CUDA tactic: " << result.err;
  }
  EXPECT_EQ(result.exit_code, 2) << result.err;
  EXPECT_NE(result.err.find("--tactic: expected auto or a tactic of this build (mxq linear "
                            "--explain lists them), found 'cuda.sm90_wgmma.m64n7'"),
            std::string::npos)
      << result.err;
  // Known names get past the check: the next error (without a GPU) is not about --tactic.
  const auto known =
      run_cli(dir, "bench linear --shape 7168,2048 --m 64 --tactic auto,cuda.sm90_wgmma.m64n64");
  EXPECT_EQ(known.err.find("--tactic"), std::string::npos) << known.err;
}

TEST(BenchCli, TmaStreamOptionsAreCheckedBeforeAnyGpuIsLookedFor) {
  const ScratchDir dir("mxq-bench-cli-tma");
  const std::pair<std::string, std::string> cases[] = {
      {"--rows 12", "--rows: expected values in [8, 256], multiples of 8, found 12"},
      {"--rows 16,512", "--rows: expected values in [8, 256], multiples of 8, found 512"},
      {"--depth 9", "--depth: expected values in [1, 8], found 9"},
      {"--stages 1", "--stages: expected values in [2, 64], found 1"},
      {"--a-rows 4", "--a-rows: expected values in [0, 256], multiples of 8, found 4"},
      {"--row-bytes 64,96", "--row-bytes: expected values in [64, 128], multiples of 64, found 96"},
      {"--k 1000", "--k a positive multiple of 128; got N = 2112, K = 1000"},
      {"--k 64 --row-bytes 64,128", "--k a positive multiple of 128; got N = 2112, K = 64"},
      {"--repeats 5", "--repeats: expected at least 20, found 5"},
  };
  for (const auto& [args, message] : cases) {
    const auto result = run_cli(dir, "bench tma-stream " + args);
    EXPECT_EQ(result.exit_code, 2) << args;
    EXPECT_NE(result.err.find(message), std::string::npos) << args << ": " << result.err;
  }
}

TEST(BenchCli, WgmmaRateOptionsAreCheckedBeforeAnyGpuIsLookedFor) {
  const ScratchDir dir("mxq-bench-cli-wgmma");
  const std::pair<std::string, std::string> cases[] = {
      {"--kind bf16-ss", "--kind: expected bf16-rs or e4m3-ss, found 'bf16-ss'"},
      {"--n 24", "--n: expected 16, 32, 64 or 128, found 24"},
      {"--warpgroups 5", "--warpgroups: expected 1 to 4, found 5"},
      {"--k-steps 3", "--k-steps: expected 1, 2, 4 or 8, found 3"},
      {"--in-flight 2", "--in-flight: expected 0 or 1, found 2"},
      {"--iterations 0", "--iterations: expected at least 1, found 0"},
      {"--repeats 5", "--repeats: expected at least 20, found 5"},
      // The defaults ask both kinds and in-flight 0 and 1: bf16-rs n128 at 4 k-steps a group is
      // a kernel ptxas serializes.
      {"--k-steps 4",
       "bf16-rs n128 with 4 k-steps a group and a group in flight compiles to "
       "serialized wgmma"},
      {"--kind bf16-rs --n 16 --k-steps 8 --in-flight 1", "bf16-rs n16 with 8 k-steps"},
  };
  for (const auto& [args, message] : cases) {
    const auto result = run_cli(dir, "bench wgmma-rate " + args);
    EXPECT_EQ(result.exit_code, 2) << args;
    EXPECT_NE(result.err.find(message), std::string::npos) << args << ": " << result.err;
  }
}

}  // namespace
}  // namespace mxq
