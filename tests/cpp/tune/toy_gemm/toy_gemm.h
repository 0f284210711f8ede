// toy_gemm: a test op of the autotuner (not in the shipped library), out[T,N] = a[T,K] · w[N,K]^T
// in fp32 on the CPU. Tuning it does real, fast measurements on a machine without a GPU. Its
// tactics differ in blocking and thread count, and some are valid only for some shapes
// (supports()) or token counts (token range), like real kernels. The tests reach it through
// toy_registry() (the built-in tactics plus toy_gemm) and toy_presets().
#pragma once

#include <cstdint>
#include <string_view>

#include <span>

#include "mxq/tune/presets.h"
#include "mxq/tune/problem.h"
#include "mxq/tune/registry.h"

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

// Adds the toy_gemm op and its tactics to `registry`.
void register_toy_gemm(TacticRegistry& registry);
// The built-in tactics plus toy_gemm (frozen; built on first use).
const TacticRegistry& toy_registry();
// "toy" (two toy_gemm layers) and "toy-draft" (a draft model for "toy": one shared and one own
// layer, odd token counts), as deployment presets of toy_registry()'s op.
std::span<const DeploymentPreset> toy_presets();

}  // namespace mxq::tune
