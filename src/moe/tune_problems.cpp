// The MoE's tuning problems (include/mxq/moe/tune.h). Built in every build, so that presets and
// cache tools name them the same with and without CUDA; the tactics are registered by
// src/moe/cpu/moe_expert_gemm_autotune.cpp and src/moe/cuda/moe_gpu_forward_autotune.cpp.
#include "mxq/moe/tune.h"

#include <string>
#include <string_view>

#include "mxq/core/error.h"

namespace mxq::moe {

using tune::Problem;

namespace {

// The checks both problems make of a rank's shape; `op` and `intermediate` name the fields in
// the message.
void check_rank_shape(std::string_view op, std::int64_t experts, std::int64_t experts_local,
                      std::int64_t hidden, std::string_view intermediate_name,
                      std::int64_t intermediate, std::int64_t top_k) {
  const auto positive = [op](std::string_view name, std::int64_t value, std::int64_t multiple) {
    if (value < 1 || value % multiple != 0) {
      fail_argument(ErrorCode::kShapeMismatch, std::string(op) + " " + std::string(name),
                    multiple == 1 ? ">= 1" : "a positive multiple of " + std::to_string(multiple),
                    value);
    }
  };
  positive("experts", experts, 1);
  positive("experts_local", experts_local, 1);
  positive("hidden", hidden, 32);
  positive(intermediate_name, intermediate, 32);
  positive("top_k", top_k, 1);
  if (experts_local > experts || top_k > experts) {
    fail_argument(ErrorCode::kShapeMismatch, std::string(op) + " experts_local, top_k",
                  "<= experts (" + std::to_string(experts) + ")",
                  std::to_string(experts_local) + ", " + std::to_string(top_k));
  }
}

}  // namespace

Problem moe_expert_gemm_problem(const MoeExpertGemmShape& shape) {
  check_rank_shape(kMoeExpertGemmOp, shape.experts, shape.experts_local, shape.hidden,
                   "intermediate_size_per_partition", shape.intermediate_size_per_partition,
                   shape.top_k);
  return Problem(std::string(kMoeExpertGemmOp),
                 {{"E", shape.experts},
                  {"E_local", shape.experts_local},
                  {"H", shape.hidden},
                  {"I", shape.intermediate_size_per_partition},
                  {"top_k", shape.top_k},
                  {"bias", shape.has_bias ? 1 : 0}},
                 {{"w", "mxfp4"}, {"x", "bf16"}, {"out", "f32"}});
}

Problem moe_gpu_forward_problem(const MoeGpuForwardShape& shape) {
  check_rank_shape(kMoeGpuForwardOp, shape.experts, shape.experts_local, shape.hidden,
                   "intermediate_valid", shape.intermediate_valid, shape.top_k);
  if (shape.intermediate_after_pad < shape.intermediate_valid ||
      shape.intermediate_after_pad % 32 != 0) {
    fail_argument(ErrorCode::kShapeMismatch, "moe_gpu_forward intermediate_after_pad",
                  "a multiple of 32 >= the valid intermediate channels " +
                      std::to_string(shape.intermediate_valid),
                  shape.intermediate_after_pad);
  }
  return Problem(std::string(kMoeGpuForwardOp),
                 {{"E", shape.experts},
                  {"E_local", shape.experts_local},
                  {"H", shape.hidden},
                  {"I", shape.intermediate_valid},
                  {"P", shape.intermediate_after_pad},
                  {"top_k", shape.top_k},
                  {"bias", shape.has_bias ? 1 : 0}},
                 {{"act", std::string(to_string(shape.activation))},
                  {"w", "mxfp4"},
                  {"x", std::string(to_string(shape.activation_quant))},
                  {"out", "bf16"}});
}

}  // namespace mxq::moe
