// block_fp8_linear: the autotuner's view of the block-FP8 linear op (mxq/linear/linear.h). The
// problem holds N, K, the weight block and the activation scale mode; the tactics are the op's
// own CPU tactics (cpu.reference, cpu.blocked_f32.n64, cpu.blocked_f32.n16), adopted as they
// are; the default is the reference, which supports every problem and token count.
#pragma once

#include <cstdint>
#include <string_view>

#include "mxq/formats/fp8_block.h"
#include "mxq/tune/problem.h"

namespace mxq::tune {

inline constexpr std::string_view kBlockFp8LinearOp = "block_fp8_linear";

// y[M, N] = x[M, K] W[N, K]^T, W block-FP8 with fp32 block scales, x quantized per 1 x block.k
// group with `activation_scales`, bf16 output. Throws naming the argument when a size is < 1.
Problem block_fp8_linear_problem(std::int64_t n, std::int64_t k, BlockShape block = {128, 128},
                                 ScaleMode activation_scales = ScaleMode::kFp32);

}  // namespace mxq::tune
