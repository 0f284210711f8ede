// toy_gemm: a DEMO op of the autotuner, out[T,N] = a[T,K] · w[N,K]^T in fp32 on the CPU.
// It exists so that tuning does real work on a machine without a GPU before the real ops (MXFP4
// MoE, block-FP8 linear) register their tactics; presets use it only until then. Its tactics
// differ in blocking and thread count, and some are valid only for some shapes (supports()) or
// token counts (token range), like real kernels.
#pragma once

#include <cstdint>
#include <string_view>

#include "mxq/tune/problem.h"

namespace mxq::tune {

inline constexpr std::string_view kToyGemmOp = "toy_gemm";

struct ToyGemmArgs {
  const float* a = nullptr;  // [tokens, k]
  const float* w = nullptr;  // [n, k]
  float* out = nullptr;      // [tokens, n]
  std::int64_t tokens = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
};

// The problem key of a toy_gemm with weights [n, k].
Problem toy_gemm_problem(std::int64_t n, std::int64_t k);

// The answer, accumulated in double (the oracle every toy_gemm tactic is checked against).
void toy_gemm_reference(const ToyGemmArgs& args, double* out);

}  // namespace mxq::tune
