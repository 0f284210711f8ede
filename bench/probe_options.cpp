// The option checks of the two kernel probes (`mxq bench tma-stream`, `mxq bench wgmma-rate`):
// host code in every build, so that the CLI refuses an option out of range the same way with or
// without CUDA, before it looks for a GPU.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "mxq/core/error.h"
#include "tma_stream.h"
#include "wgmma_rate.h"

namespace mxq::bench {
namespace {

// Every value of a list option in [lo, hi] and a multiple of `multiple`.
void check_list(const std::vector<int>& values, const char* flag, int lo, int hi, int multiple) {
  const std::string expected =
      detail::concat("values in [", lo, ", ", hi, "]",
                     multiple > 1 ? detail::concat(", multiples of ", multiple) : std::string());
  if (values.empty()) fail_argument(ErrorCode::kInvalidArgument, flag, expected, "nothing");
  for (const int v : values) {
    if (v < lo || v > hi || v % multiple != 0) {
      fail_argument(ErrorCode::kInvalidArgument, flag, expected, v);
    }
  }
}

// Every value of a list option is one of `allowed`.
void check_values(const std::vector<int>& values, const char* flag,
                  std::initializer_list<int> allowed, const char* expected) {
  if (values.empty()) fail_argument(ErrorCode::kInvalidArgument, flag, expected, "nothing");
  for (const int v : values) {
    bool ok = false;
    for (const int a : allowed) ok = ok || v == a;
    if (!ok) fail_argument(ErrorCode::kInvalidArgument, flag, expected, v);
  }
}

}  // namespace

void check_tma_stream_options(const TmaStreamOptions& options) {
  check_list(options.row_bytes, "--row-bytes", 64, 128, 64);
  // K is whole K-blocks of every row width asked for (64 alone allows K = 64: a matrix of
  // 64-byte rows streamed in boxes of whole rows, as the MoE weights' row groups lie).
  const int k_multiple = *std::max_element(options.row_bytes.begin(), options.row_bytes.end());
  if (options.n < 1 || options.k < k_multiple || options.k % k_multiple != 0) {
    fail(ErrorCode::kInvalidArgument, "mxq bench tma-stream: --n must be positive and --k a ",
         "positive multiple of ", k_multiple, "; got N = ", options.n, ", K = ", options.k);
  }
  check_list(options.rows, "--rows", 8, 256, 8);
  check_list(options.depth, "--depth", 1, 8, 1);
  check_list(options.stages, "--stages", 2, 64, 1);
  check_list(options.a_rows, "--a-rows", 0, 256, 8);
  if (options.repeats < 20) {
    fail_argument(ErrorCode::kInvalidArgument, "--repeats", "at least 20", options.repeats);
  }
}

void check_wgmma_rate_options(const WgmmaRateOptions& options) {
  if (options.kinds.empty()) {
    fail_argument(ErrorCode::kInvalidArgument, "--kind", "bf16-rs or e4m3-ss", "nothing");
  }
  for (const std::string& kind : options.kinds) {
    if (kind != "bf16-rs" && kind != "e4m3-ss") {
      fail_argument(ErrorCode::kInvalidArgument, "--kind", "bf16-rs or e4m3-ss", "'" + kind + "'");
    }
  }
  check_values(options.n, "--n", {16, 32, 64, 128}, "16, 32, 64 or 128");
  check_values(options.warpgroups, "--warpgroups", {1, 2, 3, 4}, "1 to 4");
  check_values(options.k_steps, "--k-steps", {1, 2, 4, 8}, "1, 2, 4 or 8");
  check_values(options.in_flight, "--in-flight", {0, 1}, "0 or 1");
  if (options.iterations < 1) {
    fail_argument(ErrorCode::kInvalidArgument, "--iterations", "at least 1", options.iterations);
  }
  if (options.repeats < 20) {
    fail_argument(ErrorCode::kInvalidArgument, "--repeats", "at least 20", options.repeats);
  }
  for (const std::string& kind : options.kinds) {
    for (const int n : options.n) {
      for (const int k_steps : options.k_steps) {
        for (const int in_flight : options.in_flight) {
          if (!wgmma_rate_serialized_by_ptxas(kind == "e4m3-ss", n, k_steps, in_flight)) continue;
          fail(ErrorCode::kInvalidArgument, "mxq bench wgmma-rate: ", kind, " n", n, " with ",
               k_steps, " k-steps a group and a group in flight compiles to serialized wgmma ",
               "(ptxas C7511/C7512: each waits for the one before), so it would time the serial ",
               "chain; ask --k-steps 1 or 2 (4 below n128) for groups in flight, or --in-flight 0 ",
               "for the serial time");
        }
      }
    }
  }
}

}  // namespace mxq::bench
