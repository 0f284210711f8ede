// The engine-facing MoE forward on the device (mxfp4_moe_backend.h): the caller's tensors mapped
// onto the kernels' arguments (mxq/moe/cuda_moe.h), nothing allocated, nothing synchronized.
#include <cuda_runtime_api.h>

#include "moe/mxfp4_moe_backend.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/device.h"
#include "mxq/core/error.h"
#include "mxq/moe/cuda_moe.h"

namespace mxq::moe::detail {
namespace {

gpu::MoeDeviceWeights device_weights(const PreparedMoeShapes& s, std::int64_t num_experts,
                                     std::int64_t hidden) {
  gpu::MoeDeviceWeights w;
  w.num_local_experts = static_cast<int>(s.ep.count);
  w.first_local_expert = static_cast<int>(s.ep.begin);
  w.num_global_experts = static_cast<int>(num_experts);
  w.hidden = static_cast<int>(hidden);
  // The kernels stream the channels holding data; zero-filled and padded ones contribute 0.
  w.inter = static_cast<int>(s.tp.valid);
  w.inter_padded = static_cast<int>(s.intermediate_size_per_partition_after_pad);
  return w;
}

gpu::MoeParams device_params(ActivationQuant quant, const Mxfp4MoeOptions& options, bool has_bias) {
  gpu::MoeParams p;
  p.gemm = options.gemm;
  p.top_k = static_cast<int>(options.top_k);
  p.activation = gpu::gpu_activation(options.activation);
  p.swiglu_alpha = static_cast<float>(options.swiglu_alpha);
  p.swiglu_limit = static_cast<float>(options.swiglu_limit);
  p.add_down_bias = has_bias && options.add_down_bias;
  p.activation_quant = quant == ActivationQuant::kFp8Group128
                           ? gpu::GpuActivationQuant::kFp8Group128
                           : gpu::GpuActivationQuant::kBf16;
  return p;
}

}  // namespace

std::size_t device_workspace_bytes(const PreparedMoeShapes& shapes, std::int64_t num_experts,
                                   std::int64_t hidden, ActivationQuant activation_quant,
                                   std::int64_t top_k, std::int64_t max_tokens) {
  Mxfp4MoeOptions options;
  options.top_k = top_k;
  return gpu::moe_workspace_bytes(device_weights(shapes, num_experts, hidden),
                                  device_params(activation_quant, options, false),
                                  static_cast<int>(max_tokens));
}

gpu::GemmVariant device_gemm_variant(const PreparedMoeShapes& shapes, std::int64_t num_experts,
                                     std::int64_t hidden, ActivationQuant activation_quant,
                                     const Mxfp4MoeOptions& options, std::int64_t tokens) {
  return gpu::resolve_gemm_variant(device_weights(shapes, num_experts, hidden),
                                   device_params(activation_quant, options, false),
                                   static_cast<int>(tokens));
}

const char* device_unsupported_reason(const PreparedMoeShapes& shapes, std::int64_t num_experts,
                                      std::int64_t hidden, ActivationQuant activation_quant,
                                      const Mxfp4MoeOptions& options, bool has_bias) {
  if (shapes.tp.valid == 0) return nullptr;  // the forward writes a zero partial, no kernel runs
  return gpu::moe_forward_unsupported_reason(device_weights(shapes, num_experts, hidden),
                                             device_params(activation_quant, options, has_bias));
}

void run_prepared_on_device(const ForwardPlan& plan, void* stream) {
  const mxq::detail::DeviceScope on_device(plan.x.device());
  auto* const cuda_stream = static_cast<cudaStream_t>(stream);
  if (plan.shapes.tp.valid == 0) {  // a TP rank past the last channel: an exact zero partial
    MXQ_CUDA_CHECK(cudaMemsetAsync(plan.out.data(), 0, plan.out.nbytes(), cuda_stream));
    return;
  }
  gpu::MoeDeviceWeights w = device_weights(plan.shapes, plan.num_experts, plan.hidden);
  w.w13 = static_cast<const std::uint8_t*>(plan.prepared.w13.data());
  w.w13_scale = static_cast<const std::uint8_t*>(plan.prepared.w13_scale.data());
  w.w2 = static_cast<const std::uint8_t*>(plan.prepared.w2.data());
  w.w2_scale = static_cast<const std::uint8_t*>(plan.prepared.w2_scale.data());
  if (plan.has_bias) {
    w.b13 = static_cast<const std::uint16_t*>(plan.prepared.w13_bias.data());
    w.b2 = static_cast<const std::uint16_t*>(plan.prepared.w2_bias.data());
  }
  const bool routed = is_given(plan.routing.router_weight);
  if (routed) {
    w.router_w = static_cast<const std::uint16_t*>(plan.routing.router_weight.data());
    w.router_b = static_cast<const std::uint16_t*>(plan.routing.router_bias.data());
  }
  const gpu::MoeParams p = device_params(plan.activation_quant, plan.options, plan.has_bias);
  if (const char* reason = gpu::moe_forward_unsupported_reason(w, p)) {
    fail(ErrorCode::kUnsupported, "mxfp4_moe on CUDA: ", reason);
  }
  gpu::MoeRun run;
  run.x = static_cast<const std::uint16_t*>(plan.x.data());
  run.tokens = static_cast<int>(plan.tokens);
  if (!routed) {
    run.topk_ids = static_cast<const int*>(plan.routing.topk_ids.data());
    run.topk_weights = static_cast<const float*>(plan.routing.topk_weights.data());
  }
  if (plan.out.dtype() == DType::kF32) {
    run.out_f32 = static_cast<float*>(plan.out.data());
  } else {
    run.out_bf16 = static_cast<std::uint16_t*>(plan.out.data());
  }
  gpu::moe_forward(w, p, run, plan.workspace.data(), plan.workspace.nbytes(),
                   static_cast<int>(plan.max_tokens), cuda_stream);
}

namespace {
// The router-only forward's weights: every expert is "local" (the lists are unused).
gpu::MoeDeviceWeights router_weights(std::int64_t num_experts, std::int64_t hidden) {
  gpu::MoeDeviceWeights w;
  w.num_local_experts = static_cast<int>(num_experts);
  w.num_global_experts = static_cast<int>(num_experts);
  w.hidden = static_cast<int>(hidden);
  w.inter = 32;
  w.inter_padded = 32;
  return w;
}
}  // namespace

std::size_t device_route_workspace_bytes(std::int64_t num_experts, std::int64_t hidden,
                                         std::int64_t top_k, std::int64_t max_tokens) {
  gpu::MoeParams p;
  p.top_k = static_cast<int>(top_k);
  return gpu::moe_workspace_bytes(router_weights(num_experts, hidden), p,
                                  static_cast<int>(max_tokens));
}

void route_on_device(const RoutePlan& plan, void* stream) {
  const mxq::detail::DeviceScope on_device(plan.x.device());
  gpu::MoeDeviceWeights w = router_weights(plan.num_experts, plan.x.size(1));
  w.router_w = static_cast<const std::uint16_t*>(plan.router_weight.data());
  w.router_b = static_cast<const std::uint16_t*>(plan.router_bias.data());
  gpu::MoeParams p;
  p.top_k = static_cast<int>(plan.top_k);
  gpu::MoeRun run;
  run.x = static_cast<const std::uint16_t*>(plan.x.data());
  run.tokens = static_cast<int>(plan.x.size(0));
  gpu::moe_route(w, p, run, static_cast<int*>(plan.topk_ids.data()),
                 static_cast<float*>(plan.topk_weights.data()), plan.workspace.data(),
                 plan.workspace.nbytes(), static_cast<int>(plan.max_tokens),
                 static_cast<cudaStream_t>(stream));
}

}  // namespace mxq::moe::detail
