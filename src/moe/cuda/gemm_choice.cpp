#include "gemm_choice.h"

#include <any>

#include "mxq/tune/autotuner.h"

namespace mxq::moe::detail {

gpu::GemmChoice choose_gemm(const tune::Autotuner* tuner, const tune::Problem& problem,
                            std::int64_t tokens, gpu::GemmVariant fallback) noexcept {
  const gpu::GemmChoice own{fallback, false};
  if (tuner == nullptr || problem.empty()) return own;
  const tune::Selection selection = tuner->lookup(problem, tokens);
  if (selection.source != tune::SelectionSource::kTuned || selection.tactic == nullptr) return own;
  const auto* variant = std::any_cast<gpu::GemmVariant>(&selection.tactic->native);
  return variant == nullptr ? own : gpu::GemmChoice{*variant, true};
}

std::string moe_tactic_name(bool w4a8, gpu::GemmVariant gemm) {
  return std::string(w4a8 ? "cuda.moe.w4a8." : "cuda.moe.w4a16.") + gpu::to_string(gemm);
}

}  // namespace mxq::moe::detail
