// The block-FP8 linear op: y[M, N] = x[M, K] W[N, K]^T (+ bias), W a block-FP8 weight, x
// quantized per 1 x bk group along K (bk = the weight block's K extent) either inside the op or
// beforehand. Runs on the device holding x and W (CPU or CUDA) through the tactic that
// dispatch chooses (mxq/linear/dispatch.h).
//
// Numerics: every tactic computes sum over K-blocks of (codes dot-product in fp32) times
// a_scale[m, block] * w_scale[block row, block], accumulated in fp32 (CUDA, CPU blocked) or
// fp64 (CPU reference), plus bias, rounded once to the output type.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mxq/core/tensor.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/linear/problem.h"
#include "mxq/linear/tactic.h"
#include "mxq/linear/weight.h"

namespace mxq::tune {
class Autotuner;
class Problem;
}  // namespace mxq::tune

namespace mxq::linear {

// What a linear() call ran (LinearOptions::ran).
struct LinearRun {
  const LinearTactic* tactic = nullptr;
  bool from_tuner = false;  // the autotuner's cache made the choice (see dispatch.h)
};

struct LinearOptions {
  std::string tactic = "auto";                     // "auto", "fast", "fallback" or a tactic name
  ScaleMode activation_scales = ScaleMode::kFp32;  // in-op quantization of bf16 x
  DType out_dtype = DType::kBF16;                  // bf16 or f32
  void* stream = nullptr;                          // cudaStream_t for CUDA (null: default)
  // Optional: with tactic "auto", the tactic this autotuner's cache holds for the call's
  // block_fp8_linear problem and M runs when it supports the call; otherwise the dispatch rule
  // decides (mxq/linear/dispatch.h). Its backend must be the device's. Not owned; no global.
  const tune::Autotuner* tuner = nullptr;
  // Optional: that block_fp8_linear problem, built once by the caller
  // (linear::block_fp8_linear_problem(N, K, block, activation_scales, out_dtype)) so that the
  // lookup allocates nothing; must match the call. Null: built on each call.
  const tune::Problem* tune_problem = nullptr;
  // Optional out: the tactic that ran and whether the tuner's cache chose it.
  LinearRun* ran = nullptr;
};

// x: bf16 [M, K] (M >= 1), contiguous, on the weight's device; bias: optional bf16 or f32 [N].
// Returns [M, N] of options.out_dtype on the same device.
Tensor linear(const TensorView& x, const BlockFp8Weight& w, const TensorView* bias = nullptr,
              const LinearOptions& options = {});

// Pre-quantized activations: x.q e4m3 [M, K] and x.scale f32 [M, ceil(K/bk)] (or packed UE8M0
// i32 [ceil(G/4), round_up(M, 4)]) with x.block == {1, w.block.k}.
Tensor linear(const Fp8BlockTensor& x, const BlockFp8Weight& w, const TensorView* bias = nullptr,
              const LinearOptions& options = {});

// The problem `linear` would solve for these inputs (validating them), e.g. for explain().
LinearProblem make_problem(const TensorView& x, const BlockFp8Weight& w, const TensorView* bias,
                           const LinearOptions& options = {});

// Quantizes bf16 x [M, K] per 1 x group_k group on x's device (CUDA: the device kernel, bit-equal
// to the host quantizer). Returns q e4m3 [M, K] and scale f32 [M, ceil(K/group_k)].
Fp8BlockTensor quantize_activations(const TensorView& x, std::int64_t group_k,
                                    ScaleMode mode = ScaleMode::kFp32, void* stream = nullptr);

// Everything a tactic needs, prepared once: the problem and its operands (activation scales in
// the layout tactics share, packed UE8M0 scales unpacked, bias and output bound). `storage`
// keeps the temporaries alive; on a GPU they are allocated and freed in the order of
// options.stream (cudaMallocAsync / cudaFreeAsync), so releasing them never races a kernel
// still reading them. For calling tactics directly (benchmarks, the autotuner).
struct PreparedLinear {
  LinearProblem problem;
  LinearOperands operands;
  std::vector<std::shared_ptr<void>> storage;
};
// x: pre-quantized activations as in linear(); out: [M, N] of options.out_dtype, contiguous, on
// the weight's device.
PreparedLinear prepare_linear(const Fp8BlockTensor& x, const BlockFp8Weight& w,
                              const TensorView* bias, const TensorView& out,
                              const LinearOptions& options = {});

// The CPU reference on host tensors: dequantize, accumulate in fp64, round once.
Tensor linear_reference(const Fp8BlockTensor& x, const BlockFp8Weight& w,
                        const TensorView* bias = nullptr, DType out_dtype = DType::kBF16);

}  // namespace mxq::linear
