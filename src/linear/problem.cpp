#include "mxq/linear/problem.h"

#include <sstream>

#include "mxq/core/error.h"
#include "mxq/linear/tactic.h"

#if MXQ_WITH_CUDA
#include "mxq/core/cuda_check.h"
#endif

namespace mxq::linear {

std::string_view to_string(ScaleLayout layout) {
  return layout == ScaleLayout::kPackedUe8m0 ? "packed-ue8m0" : "fp32";
}

std::string_view to_string(TacticKind kind) {
  switch (kind) {
    case TacticKind::kReference:
      return "reference";
    case TacticKind::kFast:
      return "fast";
    case TacticKind::kFallback:
      return "fallback";
  }
  return "?";
}

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

void LinearTactic::run(const LinearOperands& operands, const LinearProblem& problem) const {
  const Support support = supports(problem);
  if (!support) {
    fail(ErrorCode::kUnsupported, "tactic ", name(), " does not support ", problem.str(), ": ",
         support.reason);
  }
  run_supported(operands, problem);
}

}  // namespace mxq::linear
