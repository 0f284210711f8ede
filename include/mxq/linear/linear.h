// The block-FP8 linear op: y[M, N] = x[M, K] W[N, K]^T (+ bias), W a block-FP8 weight, x
// quantized per 1 x bk group along K (bk = the weight block's K extent) either inside the op or
// beforehand. Runs on the device holding x and W (CPU or CUDA) through the tactic that
// dispatch chooses (mxq/linear/dispatch.h).
//
// The op as engines call it is linear_into: it writes into the caller's `out`, takes its
// temporaries from the caller's `workspace` (linear_workspace_bytes says how many bytes), and on
// CUDA only queues kernels on options.stream: no allocation, no synchronization, no host copy, so
// a call can be captured in a CUDA graph. Its pre-quantized form is DeepGEMM's
// fp8_gemm_nt((x_q, x_scale), (w, w_scale), out) (docs/linear.md, "The linear as engines call
// it"). linear() is the convenience on top: it allocates its output and workspace.
//
// Numerics: every tactic computes sum over K-blocks of (codes dot-product in fp32) times
// a_scale[m, block] * w_scale[block row, block], accumulated in fp32 (CUDA, CPU blocked) or
// fp64 (CPU reference), plus bias, rounded once to the output type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
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

// What a linear() or linear_into() call ran (LinearOptions::ran).
struct LinearRun {
  const LinearTactic* tactic = nullptr;
  bool from_tuner = false;  // the autotuner's cache made the choice (see dispatch.h)
};

struct LinearOptions {
  std::string tactic = "auto";  // "auto", "fast", "fallback" or a tactic name
  // bf16 x: how the op quantizes it. Pre-quantized f32 scales: what they are (kUe8m0: powers of
  // two), which only selects the autotuner's problem; packed UE8M0 scales are kUe8m0 anyway.
  ScaleMode activation_scales = ScaleMode::kFp32;
  DType out_dtype = DType::kBF16;  // linear() only (bf16 or f32); linear_into writes out's dtype
  void* stream = nullptr;          // cudaStream_t for CUDA (null: default)
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

// How the activations reach a call. With the weight's scale layout and the device it decides
// what the workspace holds. G = ceil(K / bk) groups of 1 x bk along K, bk = the weight block's
// K extent.
enum class ActivationInput {
  kBf16,  // bf16 x [M, K], quantized inside the op (into the workspace)
  // Pre-quantized: e4m3 x_q [M, K] and
  kFp8,  // f32 x_scale [M, G] with any strides but kFp8MnMajor's, e.g. row-major (vLLM's
         // per_token_group_quant_fp8, DeepGEMM's per_token_cast_to_fp8); CUDA tactics read them
         // K-group major: copied so into the workspace (the CPU reads any strides in place)
  kFp8MnMajor,  // f32 x_scale [M, G] MN-major: element (m, g) at m + g * ld, ld >= M a multiple of
                // 4, 16-byte aligned (DeepGEMM's get_mn_major_tma_aligned_tensor): read in place
  kFp8PackedUe8m0,  // i32 x_scale, packed UE8M0 [ceil(G/4), round_up(M, 4)]
                    // (mxq/formats/ue8m0_pack.h): unpacked into the workspace
};
std::string_view to_string(ActivationInput input);  // "bf16", "fp8", "fp8-mn-major", ...
ActivationInput parse_activation_input(std::string_view text, std::string_view argument);

// The form of pre-quantized activations with these scales: i32 -> kFp8PackedUe8m0; f32 [M, G]
// whose strides put element (m, g) at m + g * ld with ld >= M and ld % 4 == 0 (any ld when
// G == 1), at a 16-byte aligned address -> kFp8MnMajor; any other f32 -> kFp8. Throws naming
// "x_scale" for another dtype or rank.
ActivationInput activation_input_of(const TensorView& x_scale);

// Bytes of workspace a linear_into call needs on the problem's device (problem.m, n, k, block,
// weight_scales and device are read): the quantized activations (kBf16), the activation scales in
// the layout the device's tactics read (kBf16, kFp8PackedUe8m0, and kFp8 on CUDA) and the
// weight's packed UE8M0 scales unpacked to f32. 0 when the call needs none (fp32 weight scales
// with kFp8MnMajor, or with kFp8 on the CPU). Never decreases with M: a workspace sized for the
// largest M serves every smaller one (e.g. CUDA graphs captured per batch size).
std::size_t linear_workspace_bytes(const LinearProblem& problem, ActivationInput input);
std::size_t linear_workspace_bytes(std::int64_t m, const BlockFp8Weight& w, ActivationInput input);

// The workspace's base address must be a multiple of this (16-byte TMA and vector accesses).
inline constexpr std::size_t kLinearWorkspaceAlignment = 16;

// y = x W^T (+ bias) into `out`, temporaries in `workspace`, on the weight's device; on CUDA the
// work is queued on options.stream and nothing allocates or synchronizes (graph-capturable).
//   x: bf16 [M, K] (M >= 0; M = 0 does nothing), contiguous, on the weight's device.
//   bias: optional bf16 or f32 [N], contiguous, on the weight's device.
//   out: bf16 or f32 [M, N], contiguous (its dtype is the output's; options.out_dtype is not read).
//   workspace: u8 [bytes], bytes >= linear_workspace_bytes(M, w, kBf16), base address a multiple
//       of kLinearWorkspaceAlignment, on the weight's device; not read when that size is 0 (any
//       view, an empty one included, will do).
// On CUDA, out and the weight's codes must be 16-byte aligned (TMA). Every argument is checked
// before any kernel runs: a wrong dtype, device, shape, stride or alignment, or too small a
// workspace, is an mxq::Error naming the argument, what was expected and what was found.
void linear_into(const TensorView& x, const BlockFp8Weight& w, const TensorView* bias,
                 const TensorView& out, const TensorView& workspace,
                 const LinearOptions& options = {});

// Pre-quantized activations (DeepGEMM's fp8_gemm_nt((x_q, x_scale), (w, w_scale), out)):
//   x_q: e4m3 [M, K], contiguous (16-byte aligned on CUDA).
//   x_scale: one scale per 1 x bk group in one of the layouts of ActivationInput (f32 [M, G] with
//       any strides, or packed UE8M0), on the weight's device.
//   workspace: bytes >= linear_workspace_bytes(M, w, activation_input_of(x_scale)).
// The rest as above.
void linear_into(const TensorView& x_q, const TensorView& x_scale, const BlockFp8Weight& w,
                 const TensorView* bias, const TensorView& out, const TensorView& workspace,
                 const LinearOptions& options = {});

// Conveniences over linear_into that allocate their output ([M, N] of options.out_dtype on the
// weight's device) and workspace (on a GPU in the order of options.stream: cudaMallocAsync /
// cudaFreeAsync).
// x: bf16 [M, K] (M >= 1), contiguous, on the weight's device; bias: optional bf16 or f32 [N].
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
// The same into the caller's q e4m3 [M, K] and scale f32 [M, ceil(K/group_k)] (contiguous, on
// x's device), nothing allocated: on CUDA the kernel's group-major scales go through `workspace`
// (u8, at least quantize_activations_workspace_bytes, 16-byte aligned; empty on the CPU), in the
// order of `stream`.
void quantize_activations_into(const TensorView& x, std::int64_t group_k, ScaleMode mode,
                               const TensorView& q, const TensorView& scale,
                               const TensorView& workspace, void* stream = nullptr);
std::size_t quantize_activations_workspace_bytes(std::int64_t m, std::int64_t k,
                                                 std::int64_t group_k, Device device);

// Everything a tactic needs, prepared once: the problem and its operands (activation scales in
// the layout tactics share, packed UE8M0 scales unpacked, bias and output bound). `storage`
// keeps the temporaries (linear_into's workspace) alive; on a GPU they are allocated and freed in
// the order of options.stream (cudaMallocAsync / cudaFreeAsync), so releasing them never races a
// kernel still reading them. For calling tactics directly (benchmarks, the autotuner).
struct PreparedLinear {
  LinearProblem problem;
  LinearOperands operands;
  std::vector<std::shared_ptr<void>> storage;
};
// x: pre-quantized activations as in linear(); out: bf16 or f32 [M, N] as in linear_into.
PreparedLinear prepare_linear(const Fp8BlockTensor& x, const BlockFp8Weight& w,
                              const TensorView* bias, const TensorView& out,
                              const LinearOptions& options = {});

// The CPU reference on host tensors: dequantize, accumulate in fp64, round once.
Tensor linear_reference(const Fp8BlockTensor& x, const BlockFp8Weight& w,
                        const TensorView* bias = nullptr, DType out_dtype = DType::kBF16);

}  // namespace mxq::linear
