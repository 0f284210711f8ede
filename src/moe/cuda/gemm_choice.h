// The GEMM variant a CUDA MoE forward runs per call, shared by the one-GPU simulation
// (MoeGpuLayer) and the distributed layer (MoeDistLayer), so that both ask an autotuner the same
// question: the decision its cache holds for the rank's moe_gpu_forward problem (mxq/moe/tune.h)
// and the call's token count, else the layer's own variant.
#pragma once

#include <cstdint>
#include <string>

#include "mxq/moe/gemm_variant.h"

namespace mxq::tune {
class Autotuner;
class Problem;
}  // namespace mxq::tune

namespace mxq::moe::detail {

// `fallback` (kAuto already resolved by the caller) unless `tuner` (may be null) has a tuned
// decision for `problem` (may be empty: nothing to ask) at `tokens`. Allocation-free and safe
// under CUDA graph capture (the tuner's lookup is).
gpu::GemmChoice choose_gemm(const tune::Autotuner* tuner, const tune::Problem& problem,
                            std::int64_t tokens, gpu::GemmVariant fallback) noexcept;

// "cuda.moe.w4a16.<variant>" (W4A8: "cuda.moe.w4a8.<variant>").
std::string moe_tactic_name(bool w4a8, gpu::GemmVariant gemm);

}  // namespace mxq::moe::detail
