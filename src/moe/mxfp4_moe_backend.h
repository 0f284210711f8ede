// The engine-facing MoE op's backends (internal): src/moe/mxfp4_moe.cpp checks the arguments
// (mxq/moe/mxfp4_moe.h) and resolves them into these plans; src/moe/cpu/prepared_moe.cpp and
// src/moe/cuda/{prepare_moe.cu, mxfp4_moe_cuda.cpp} run them (the CUDA ones throw
// kUnsupported in a build without CUDA: src/moe/mxfp4_moe_without_cuda.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mxq/moe/mxfp4_moe.h"

namespace mxq::moe::detail {

// Where a prepared row's data comes from in the caller's expert tensors.
struct ExpertSource {
  const std::uint8_t* w13 = nullptr;        // packed rows of H values (the layout's order)
  const std::uint8_t* w13_scale = nullptr;  // [rows, H/32]
  const std::uint16_t* w13_bias = nullptr;  // [rows] or null
  const std::uint8_t* w2 = nullptr;         // [E_in, H, I_in/2]
  const std::uint8_t* w2_scale = nullptr;   // [E_in, H, I_in/32]
  const std::uint16_t* w2_bias = nullptr;   // [E_in, H] or null
  bool interleaved = false;                 // gate/up rows g0, u0, g1, u1, ... (gpt-oss)
  std::int64_t expert_offset = 0;   // input expert of local expert 0 (ep.begin, or 0: sliced)
  std::int64_t channel_offset = 0;  // input channel of the rank's channel 0 (tp.begin, or 0)
  std::int64_t inter_in = 0;        // channels the input holds (I, or tp.valid)
};

// A checked preparation: the rank's shapes and the caller's output pointers.
struct PreparePlan {
  PreparedMoeShapes shapes;
  Device device;
  std::int64_t hidden = 0;
  bool has_bias = false;
  bool add_down_bias = false;  // this TP rank stores the down bias (rank 0)
  ActivationQuant activation_quant = ActivationQuant::kBf16;
  ExpertSource source;
  std::uint8_t* w13 = nullptr;
  std::uint8_t* w13_scale = nullptr;
  std::uint16_t* w13_bias = nullptr;  // null without biases
  std::uint8_t* w2 = nullptr;
  std::uint8_t* w2_scale = nullptr;
  std::uint16_t* w2_bias = nullptr;
};

void prepare_on_host(const PreparePlan& plan);
void prepare_on_device(const PreparePlan& plan, void* stream);

// A checked forward: the rank, the caller's tensors and options.
struct ForwardPlan {
  PreparedMoeShapes shapes;
  std::int64_t num_experts = 0;
  std::int64_t hidden = 0;
  std::int64_t tokens = 0;
  std::int64_t max_tokens = 0;
  bool has_bias = false;
  ActivationQuant activation_quant = ActivationQuant::kBf16;
  Mxfp4MoeOptions options;
  TensorView x;  // bf16 [T, H] (CPU: or f32)
  PreparedMoe prepared;
  MoeRouting routing;  // the views given (ids + weights, or the router)
  TensorView out;      // f32 or bf16 [T, H]
  TensorView workspace;
};

void run_prepared_on_host(const ForwardPlan& plan);
void run_prepared_on_device(const ForwardPlan& plan, void* stream);
std::size_t device_workspace_bytes(const PreparedMoeShapes& shapes, std::int64_t num_experts,
                                   std::int64_t hidden, ActivationQuant activation_quant,
                                   std::int64_t top_k, std::int64_t max_tokens);
// For a layer that holds the op's tensors (MoeDistLayer; CUDA builds only): the variant the device
// forward of `tokens` tokens runs with `options` (kAuto resolved by the dispatch rule), and why
// the kernels cannot run this rank (null: they can; the router's width is checked by the forward),
// so that the layer refuses it before reading its weights.
gpu::GemmVariant device_gemm_variant(const PreparedMoeShapes& shapes, std::int64_t num_experts,
                                     std::int64_t hidden, ActivationQuant activation_quant,
                                     const Mxfp4MoeOptions& options, std::int64_t tokens);
const char* device_unsupported_reason(const PreparedMoeShapes& shapes, std::int64_t num_experts,
                                      std::int64_t hidden, ActivationQuant activation_quant,
                                      const Mxfp4MoeOptions& options, bool has_bias);

// The router alone on the device (checked arguments; mxfp4_moe.h).
struct RoutePlan {
  TensorView x;
  TensorView router_weight;
  TensorView router_bias;
  std::int64_t num_experts = 0;
  std::int64_t top_k = 0;
  std::int64_t max_tokens = 0;
  TensorView topk_ids;
  TensorView topk_weights;
  TensorView workspace;
};
void route_on_device(const RoutePlan& plan, void* stream);
std::size_t device_route_workspace_bytes(std::int64_t num_experts, std::int64_t hidden,
                                         std::int64_t top_k, std::int64_t max_tokens);

// Whether an optional view was given: a default TensorView (no shape, no data) is absent.
inline bool is_given(const TensorView& t) { return t.data() != nullptr || t.rank() > 0; }

// Bytes of one E8M0 scale row of K values in the prepared layout (K/32 rounded up to 16).
constexpr std::int64_t scale_pitch(std::int64_t k) { return (k / 32 + 15) / 16 * 16; }

}  // namespace mxq::moe::detail
