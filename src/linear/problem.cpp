#include "mxq/linear/problem.h"

#include <sstream>

#include "mxq/core/enum_names.h"
#include "mxq/core/error.h"
#include "mxq/linear/tactic.h"

#if MXQ_WITH_CUDA
#include "mxq/core/cuda_check.h"
#endif

namespace mxq::linear {

namespace {
constexpr EnumNames<ScaleLayout, 2> kScaleLayoutNames{
    {{{ScaleLayout::kFp32, "fp32"}, {ScaleLayout::kPackedUe8m0, "packed-ue8m0"}}}};
}  // namespace

std::string_view to_string(ScaleLayout layout) { return kScaleLayoutNames.name(layout); }

namespace {
constexpr EnumNames<TacticKind, 3> kTacticKindNames{{{{TacticKind::kReference, "reference"},
                                                      {TacticKind::kFast, "fast"},
                                                      {TacticKind::kFallback, "fallback"}}}};
}  // namespace

std::string_view to_string(TacticKind kind) { return kTacticKindNames.name(kind); }

std::string LinearProblem::str() const {
  std::ostringstream out;
  out << "M=" << m << " N=" << n << " K=" << k << " block=" << block
      << " w-scales=" << to_string(weight_scales) << " a-scales=" << to_string(activation_scales)
      << " out=" << out_dtype << (has_bias ? " bias" : "") << " " << device;
  if (device.is_cuda()) out << " sm_" << sm << " (" << sm_count << " SMs)";
  return out.str();
}

void describe_device(LinearProblem& problem, Device device) {
  problem.device = device;
  problem.sm = 0;
  problem.sm_count = 0;
  if (device.is_cpu()) return;
#if MXQ_WITH_CUDA
  int major = 0;
  int minor = 0;
  int sms = 0;
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index));
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device.index));
  problem.sm = major * 10 + minor;
  problem.sm_count = sms;
#else
  fail(ErrorCode::kUnsupported, "device ", device,
       ": this build of mxq has no CUDA support (configure with -DMXQ_CUDA=ON)");
#endif
}

Support LinearTactic::supports(const LinearProblem& problem) const {
  const TokenRange range = tokens();
  if (!range.contains(problem.m)) {
    return Support::no(
        detail::concat("valid for M in [", range.min, ", ", range.max, "]; M = ", problem.m));
  }
  return check(problem);
}

namespace {

// The operands must hold what the problem says they hold: a tactic reads M x K activations, N x K
// weights and their scales and writes M x N outputs through these pointers and strides, so a
// null pointer or a stride shorter than a row would read or write outside the caller's memory.
void check_operands(const LinearOperands& ops, const LinearProblem& p, const std::string& tactic) {
  const auto require = [&](bool ok, std::string_view operand, auto&&... what) {
    if (!ok) {
      fail(ErrorCode::kInvalidArgument, "tactic ", tactic, ": operands.", operand, ": expected ",
           what..., " for ", p.str());
    }
  };
  require(p.m >= 0 && p.n >= 0 && p.k >= 0, "problem", "M, N, K >= 0");
  if (p.m == 0 || p.n == 0) return;  // nothing is read or written
  const std::int64_t groups = (p.k + p.block.k - 1) / p.block.k;
  if (p.k > 0) {
    require(ops.a != nullptr, "a", "an activation pointer");
    require(ops.lda >= p.k, "lda", "a row stride >= K = ", p.k, " bytes, found ", ops.lda);
    require(ops.a_scale != nullptr, "a_scale", "an activation scale pointer");
    require(ops.a_scale_row_stride >= 0 && ops.a_scale_group_stride >= 0, "a_scale strides",
            "non-negative strides, found ", ops.a_scale_row_stride, " and ",
            ops.a_scale_group_stride);
    require(ops.w != nullptr, "w", "a weight pointer");
    require(ops.ldw >= p.k, "ldw", "a row stride >= K = ", p.k, " bytes, found ", ops.ldw);
    require(ops.w_scale != nullptr, "w_scale", "a weight scale pointer");
    require(ops.w_scale_ld >= groups, "w_scale_ld", "a row stride >= ceil(K / ", p.block.k,
            ") = ", groups, ", found ", ops.w_scale_ld);
  }
  require(ops.out != nullptr, "out", "an output pointer");
  require(ops.ldo >= p.n, "ldo", "a row stride >= N = ", p.n, " elements, found ", ops.ldo);
  if (p.has_bias) {
    require(ops.bias != nullptr, "bias", "a bias pointer (the problem has a bias)");
    require(ops.bias_dtype == DType::kF32 || ops.bias_dtype == DType::kBF16, "bias_dtype",
            "f32 or bf16, found ", ops.bias_dtype);
  }
}

}  // namespace

void LinearTactic::run(const LinearOperands& operands, const LinearProblem& problem) const {
  const Support support = supports(problem);
  if (!support) {
    fail(ErrorCode::kUnsupported, "tactic ", name(), " does not support ", problem.str(), ": ",
         support.reason);
  }
  check_operands(operands, problem, name());
  run_supported(operands, problem);
}

}  // namespace mxq::linear
