// `mxq bench moe`: times the CUDA MXFP4 MoE forward per phase against a straightforward bf16
// cuBLAS implementation of the same layer, on one GPU.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mxq::bench {

struct MoeBenchOptions {
  std::string preset = "gpt-oss-120b";  // or gpt-oss-20b
  std::vector<int> tokens = {1, 8, 64, 512, 4096};
  int tp = 1;
  int align = 128;   // padding of I_rank (the prepared layout)
  int repeats = 50;  // timed replays per point (median reported)
  bool baseline = true;
  // Besides the default (kAuto, as "mxq"), also time each variant ("mxq_decode_mma",
  // "mxq_prefill_wgmma") and the default without PDL ("mxq_no_pdl").
  bool all_gemm_variants = true;
  // Also time the W4A8 forward ("mxq_w4a8": fp8_g128 activations, weights in the W4A8 layout) on
  // the same weights and inputs.
  bool w4a8 = false;
  // Before each timed replay (outside the timed events), overwrite a buffer of twice the L2 size,
  // so that every replay starts with nothing of the layer in L2 — kernel code, parameters, router
  // weights and workspace included — as when other layers ran in between. Applies to the bf16
  // baseline too.
  bool cold_l2 = false;
  // Also time the read floor ("read_floor", read_floor.h): the touched experts' GEMM1 bytes read
  // by a plain streaming kernel, then their GEMM2 bytes, in graphs like the layer's.
  bool read_floor = true;
  // When set: after timing the default, replay its graphs kBlockTraceReplays more times and write
  // each replay's per-block timeline (gpu::moe_block_trace_take) to this JSON file. Needs a build
  // with MXQ_MOE_BLOCK_TRACE (throws kUnsupported otherwise, before any work).
  std::string block_trace_path;
};

inline constexpr int kBlockTraceReplays = 6;

// Runs the benchmark; returns one JSON object per token count. Throws mxq::Error without a GPU.
nlohmann::json run_moe_bench(const MoeBenchOptions& options, bool progress);

}  // namespace mxq::bench
