// `mxq bench linear`: times every supported mxq block-FP8 tactic and cuBLASLt's block-scaled
// FP8 GEMM (1x128 activation scales x 128x128 weight scales, bf16 out) on the same inputs, on one
// GPU, the fallback on 64x64 blocks, and the op as engines call it (linear_into: the caller's
// output and workspace) per activation input (points[].op), and the read floor of each point's
// operands (points[].read_floor) and the per-tensor FP8 GEMM's time (points[].ceiling).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace mxq::bench {

struct LinearBenchOptions {
  std::string preset = "deepseek-v3";       // the (N, K) pairs
  std::vector<std::pair<int, int>> shapes;  // when not empty, these (N, K) pairs instead
  std::vector<int> m = {64, 128, 4096};     // token counts
  int repeats = 30;                         // timed runs per point (median reported), >= 20
  bool baseline = true;                     // time cuBLASLt
  bool fallback_64 = true;                  // time the fallback on 64x64 blocks too
  bool op = true;  // time linear_into (the op engines call) per activation input
  // Also time the read floor (points[].read_floor, read_floor.h): the weights, their scales, the
  // activations and theirs read once by a streaming kernel, nothing else done.
  bool read_floor = true;
  // Also time the compute ceiling (points[].ceiling): cuBLASLt's FP8 GEMM of the same shape with
  // one scale per tensor, which promotes nothing inside K.
  bool ceiling = true;
  // When not empty, only these mxq tactics are timed (exact names; "auto" = the dispatch's choice).
  std::vector<std::string> tactics;
};

// The (N, K) pairs of a preset; throws mxq::Error(kInvalidArgument) for an unknown name.
std::vector<std::pair<int, int>> linear_preset_shapes(const std::string& preset);

// Runs the benchmark and returns its results as JSON. Throws mxq::Error(kUnsupported) when no
// GPU is visible.
nlohmann::json run_linear_bench(const LinearBenchOptions& options, bool progress);

}  // namespace mxq::bench
