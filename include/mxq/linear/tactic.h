// A tactic is one kernel variant of the block-FP8 linear op: a name, its parameters (tile
// shapes), supports(problem) with the first reason it does not, and the token range it is valid
// for. A tactic whose supports() is false is never run (dispatch checks it; so does run()).
// The autotuner's registry adopts these objects as they are (src/linear/tune_support.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mxq/core/dtype.h"
#include "mxq/linear/problem.h"
#include "mxq/tune/tactic.h"

namespace mxq::linear {

enum class TacticKind {
  kReference,  // the CPU oracle (fp64 accumulation)
  kFast,       // a specialised path, eligible only for the layouts it was validated on
  kFallback,   // a general path (every block shape it documents)
};
std::string_view to_string(TacticKind kind);  // "reference" / "fast" / "fallback"

// The autotuner's vocabulary (mxq/tune/tactic.h) is the op's: Support (ok, or the first reason
// a tactic cannot run), TacticParams (the tile shape, printed as the tactic's cache id),
// TokenRange (the token counts a tactic is valid for).
using tune::Support;
using tune::TacticParams;
using tune::TokenRange;

// The operands a tactic reads and writes, all on the problem's device, already in the layout
// tactics share: quantized activations, fp32 scales (packed UE8M0 already unpacked).
struct LinearOperands {
  const std::uint8_t* a = nullptr;  // e4m3 [M, K], row stride lda bytes
  std::int64_t lda = 0;
  // Activation scale of (row m, K-group g) at a_scale[g * a_scale_group_stride + m *
  // a_scale_row_stride]
  const float* a_scale = nullptr;
  std::int64_t a_scale_row_stride = 0;
  std::int64_t a_scale_group_stride = 0;
  const std::uint8_t* w = nullptr;  // e4m3 [N, K], row stride ldw bytes
  std::int64_t ldw = 0;
  const float* w_scale = nullptr;  // f32 [ceil(N/bn), w_scale_ld]
  std::int64_t w_scale_ld = 0;
  const void* bias = nullptr;  // optional [N], f32 or bf16
  DType bias_dtype = DType::kBF16;
  void* out = nullptr;  // [M, N] of the problem's out dtype, row stride ldo elements
  std::int64_t ldo = 0;
  void* stream = nullptr;  // cudaStream_t for CUDA tactics (null: the default stream)
};

class LinearTactic {
 public:
  LinearTactic() = default;
  LinearTactic(const LinearTactic&) = delete;
  LinearTactic& operator=(const LinearTactic&) = delete;
  virtual ~LinearTactic() = default;

  [[nodiscard]] virtual const std::string& name() const = 0;  // e.g. "cuda.sm90_wgmma.m128n128"
  [[nodiscard]] virtual TacticKind kind() const = 0;
  [[nodiscard]] virtual TacticParams params() const = 0;
  [[nodiscard]] virtual TokenRange tokens() const { return {}; }
  // ok() when the tactic runs `problem`: M inside tokens(), then the tactic's own conditions;
  // otherwise the first reason why not.
  [[nodiscard]] Support supports(const LinearProblem& problem) const;
  // Computes the operands' output. Throws mxq::Error(kUnsupported) when !supports(problem), and
  // kInvalidArgument when the operands cannot hold the problem (a null pointer, a row stride
  // shorter than K or N, too few weight-scale columns, a missing bias).
  void run(const LinearOperands& operands, const LinearProblem& problem) const;

 protected:
  // The tactic's conditions besides the token range, in the order they are reported.
  [[nodiscard]] virtual Support check(const LinearProblem& problem) const = 0;
  virtual void run_supported(const LinearOperands& operands,
                             const LinearProblem& problem) const = 0;
};

}  // namespace mxq::linear
