// `mxq bench tma-stream`: a probe of how fast one GPU streams a row-major [N, K] byte matrix (a
// linear layer's FP8 weights) through TMA boxes into a shared-memory ring, with nothing else done.
// Each block takes `rows` rows of N at a time and walks all of K in boxes of `rows` x `row_bytes`
// x `depth` K-blocks (a 3-D tensor map: one instruction loads `depth` slices of each row of
// `row_bytes` = 64 or 128 bytes, swizzled 64B or 128B),
// optionally with a second box of `a_rows` rows from a small [a_rows, K] matrix per stage (the
// activations of a GEMM), into a ring of `stages` stages that one consumer thread hands back as
// soon as each stage lands. The same bytes are also read by the MoE bench's streaming kernel
// (read_floor.h: 16-byte loads), so each configuration's rate stands beside the plain read floor.
// It separates what sets a narrow GEMM tile's rate at decode: the rows a box has, the bytes of
// each row a box reads, the ring's depth, the extra box per stage.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

namespace mxq::bench {

struct TmaStreamOptions {
  int n = 2112;
  int k = 7168;
  std::vector<int> rows = {16, 64, 128};  // rows of N a box (and a block's tile) has
  std::vector<int> depth = {1, 4};        // K-blocks (of row_bytes) a box reads of each row
  std::vector<int> stages = {8, 16, 32};  // ring depth (configurations that do not fit skipped)
  std::vector<int> a_rows = {0, 8};       // rows of the second box per stage (0: none)
  std::vector<int> row_bytes = {128};     // bytes of a row per K-block: 64 or 128
  int repeats = 30;                       // timed runs per configuration (median), >= 20
};

// Throws mxq::Error(kInvalidArgument) naming the first option out of range (every build:
// probe_options.cpp).
void check_tma_stream_options(const TmaStreamOptions& options);

// Runs the probe and returns its results as JSON. Throws mxq::Error(kUnsupported) when no GPU
// is visible, kInvalidArgument for an option out of range (checked first).
nlohmann::json run_tma_stream(const TmaStreamOptions& options, bool progress);

}  // namespace mxq::bench
