// `mxq bench linear --shape N,K`: a malformed pair is refused by flag name before any GPU is
// looked for, so the error is the same on a machine without one.
#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace mxq
