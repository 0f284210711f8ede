// block_fp8_linear: how the block-FP8 linear op (mxq/linear/linear.h) appears to the autotuner
// (mxq/tune/); its DeepSeek-V3 preset is in src/linear/linear_presets.cpp. The
// problem holds N, K, the weight block, the activation scale mode and the output dtype (never
// M: that is the token count); the tactics are the op's own tactics, adopted as they are:
//   cpu:  cpu.reference (the default), cpu.blocked_f32.n64, cpu.blocked_f32.n16
//   cuda: every cuda.* tactic of linear::linear_tactics(), plus the default "auto", which runs
//         what the rule-based dispatch (linear::select_tactic(problem, "auto")) picks.
// linear::linear() consults an autotuner given in LinearOptions::tuner (see there).
#pragma once

#include <cstdint>
#include <string_view>

#include "mxq/core/dtype.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/tune/problem.h"

namespace mxq::linear {

inline constexpr std::string_view kBlockFp8LinearOp = "block_fp8_linear";

// y[M, N] = x[M, K] W[N, K]^T, W block-FP8 with fp32 block scales (packed UE8M0 weight scales
// are unpacked to fp32 before any tactic runs, so they share the key), x quantized per 1 x
// block.k group with `activation_scales`, output `out` (bf16 or f32). Whether a bias is added
// is not part of the key (it costs every tactic the same epilogue). Throws naming the argument
// when a size is < 1 or `out` is not bf16/f32.
tune::Problem block_fp8_linear_problem(std::int64_t n, std::int64_t k,
                                       BlockShape block = {128, 128},
                                       ScaleMode activation_scales = ScaleMode::kFp32,
                                       DType out = DType::kBF16);

}  // namespace mxq::linear
