// The moe_gpu_forward problem (include/mxq/tune/moe_gpu_forward.h). Built in every build, so that
// presets and cache tools name it the same with and without CUDA; its tactics are registered by
// src/cuda/moe/moe_gpu_forward_autotune.cpp.
#include "mxq/tune/moe_gpu_forward.h"

#include <string>

#include "mxq/core/error.h"

namespace mxq::tune {

Problem moe_gpu_forward_problem(const MoeGpuForwardShape& shape) {
  (void)moe_expert_gemm_problem(shape.rank);  // the checks of the rank's shape
  const MoeExpertGemmShape& r = shape.rank;
  if (shape.intermediate_padded < r.intermediate || shape.intermediate_padded % 32 != 0) {
    fail_argument(ErrorCode::kShapeMismatch, "moe_gpu_forward intermediate_padded",
                  "a multiple of 32 >= the intermediate width " + std::to_string(r.intermediate),
                  shape.intermediate_padded);
  }
  return Problem(std::string(kMoeGpuForwardOp),
                 {{"E", r.experts},
                  {"E_local", r.experts_local},
                  {"H", r.hidden},
                  {"I", r.intermediate},
                  {"P", shape.intermediate_padded},
                  {"top_k", r.top_k},
                  {"bias", r.has_bias ? 1 : 0}},
                 {{"act", std::string(moe::to_string(shape.activation))},
                  {"w", "mxfp4"},
                  {"x", "bf16"},
                  {"out", "bf16"}});
}

}  // namespace mxq::tune
