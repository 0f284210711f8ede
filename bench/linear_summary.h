// The summary of `mxq bench linear`: for each token count M, how the tactic mxq's dispatch picks
// compares with cuBLASLt in the same run, over the shapes timed (the issue targets are geomeans
// and per-shape minimums of these ratios).
#pragma once

#include <nlohmann/json.hpp>

namespace mxq::bench {

// From run_linear_bench's "points" (each with "m", "n", "k" and "timings", the dispatch's choice
// on 128x128 blocks named with a trailing " *" and holding "speedup_vs_cublaslt" = cuBLASLt µs /
// mxq µs): one entry per M, in increasing M, {"m", "shapes", "geomean_vs_cublaslt",
// "min_vs_cublaslt", "min_at": "NxK"}; points without a cuBLASLt time are left out. When every
// counted point has a read floor ("read_floor": {"total_us"}) and its choice a "us", the entry also
// has "read_floor_geomean_vs_cublaslt": the geomean of cuBLASLt µs / floor µs, the speed-up over
// cuBLASLt of a kernel that took only the time of reading its weights once (the most any tactic
// can reach where the weights' bytes bound the GEMM; a target above it is above the card).
nlohmann::json summarize_linear_points(const nlohmann::json& points);

}  // namespace mxq::bench
