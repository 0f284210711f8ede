// The CUDA MXFP4 MoE forward (W4A16: bf16 activations, MXFP4 weights dequantized in the
// kernels; or W4A8: activations quantized to E4M3 in groups of 128, weights decoded to E4M3) on
// raw device pointers. The MoE layer class maps its prepared tensors onto
// MoeDeviceWeights; this header is what the kernels need and nothing else.
//
// Pipeline (all on `stream`, no host synchronization, no allocation: the workspace is sized up
// front by moe_workspace_bytes, so the whole forward can be captured in a CUDA graph):
//   1. routing   : router GEMV + top-k + softmax over the k (gpt-oss), or precomputed ids/weights;
//                  per-expert counts and offsets, pairs sorted by expert, work tiles
//                  (src/moe/cuda/tile_cut.h: decode 8 or 16 slots, prefill 128 + a remainder)
//                  (one kernel: its blocks meet through tickets in the workspace; for one
//                  token routed on the device with W4A16 register-streaming GEMMs it writes
//                  only the logits, and each GEMM1 block takes the top-k itself, GEMM1 then
//                  running as one wave of blocks that split the chosen experts' K chunks evenly)
//   (W4A8: x quantized to E4M3 groups of 128: decode_mma by token, overlapping the routing;
//    prefill_wgmma once per token into its pairs' slots, after it)
//   2. gemm1     : [gate; up] rows of w13 x tokens, + bias, SwiGLU variant, -> bf16 activations
//                  (W4A8: then quantized to E4M3 groups of 128, as the CPU reference does)
//   3. gemm2     : w2 x activations + bias -> fp32 per (token, expert) pair
//   4. combine   : weighted sum over the k experts of each token, in order j = 0..k-1
// Rounding points match the CPU reference (docs/moe.md): fp32 accumulation, activations rounded
// to bf16 between the GEMMs, the combined output rounded to bf16 once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mxq/core/macros.h"
#include "mxq/moe/config.h"
#include "mxq/moe/gemm_variant.h"

namespace mxq::moe::gpu {

enum class GpuActivation : int { kSwigluOai = 0, kSwigluClamp = 1, kSwiglu = 2 };

// The layer's activation as the kernels name it.
constexpr GpuActivation gpu_activation(Activation activation) {
  switch (activation) {
    case Activation::kSwigluOai:
      return GpuActivation::kSwigluOai;
    case Activation::kSwigluClamp:
      return GpuActivation::kSwigluClamp;
    case Activation::kSwiglu:
      return GpuActivation::kSwiglu;
  }
  return GpuActivation::kSwiglu;
}

// What the expert GEMMs multiply the weights with (MoeConfig's ActivationQuant): bf16 (W4A16), or
// E4M3 in groups of 128 along K with scale max(amax, 1e-4) / 448 (W4A8, kFp8Group128). W4A8 reads
// its weights in its own device layout (moe_weights_to_w4a8_layout); both GEMM variants run it.
enum class GpuActivationQuant : int { kBf16 = 0, kFp8Group128 = 1 };

// Bytes per row of E8M0 scales on the device for a K-long weight row: the K/32 scales, zero-padded
// to a multiple of 16 bytes, so a 128-wide K chunk's 4 scales are one aligned 32-bit load and
// scale rows meet TMA's 16-byte stride rule. (Padding scales are 0 = 2^-127 and meet zero
// weights: they contribute nothing and are never NaN.)
MXQ_HD_INLINE constexpr int moe_scale_pitch(int k) { return (k / 32 + 15) / 16 * 16; }

// w13 and w2 hold packed FP4 in the device layout of the activation quantization: the
// checkpoint's bytes after moe_weights_to_device_layout (W4A16: a bit permutation within each
// 32-bit word that makes the kernels' decode cheaper, rows in groups of 16) or
// moe_weights_to_w4a8_layout (W4A8); the
// scales' rows are padded to moe_scale_pitch bytes by moe_scales_to_device_layout; biases are as
// prepared.
struct MoeDeviceWeights {
  const std::uint8_t* w13 = nullptr;        // [E, 2P, H/2]: gate rows [0, I), up rows [P, P+I)
  const std::uint8_t* w13_scale = nullptr;  // [E, 2P, moe_scale_pitch(H)] E8M0
  const std::uint16_t* b13 = nullptr;       // [E, 2P] bf16, 16-byte aligned, or null
  const std::uint8_t* w2 = nullptr;         // [E, H, P/2]
  const std::uint8_t* w2_scale = nullptr;   // [E, H, moe_scale_pitch(P)] E8M0
  const std::uint16_t* b2 = nullptr;        // [E, H] bf16, 16-byte aligned, or null
  const std::uint16_t* router_w = nullptr;  // [E_global, H] bf16 (null: routing is precomputed)
  const std::uint16_t* router_b = nullptr;  // [E_global] bf16, or null
  int num_local_experts = 0;                // E (this rank)
  int first_local_expert = 0;               // global id of local expert 0 (EP)
  int num_global_experts = 0;               // router width
  int hidden = 0;                           // H, a multiple of 32
  int inter = 0;                            // I valid channels, a multiple of 32
  int inter_padded = 0;                     // P >= I: row offset of the up half, w2 row length
};

struct MoeParams {
  GemmVariant gemm = GemmVariant::kAuto;
  int top_k = 4;
  GpuActivation activation = GpuActivation::kSwigluOai;
  float swiglu_alpha = 1.702F;
  float swiglu_limit = 7.0F;
  bool add_down_bias = true;  // only one TP rank adds b2
  // Must match the layout the weights were converted to.
  GpuActivationQuant activation_quant = GpuActivationQuant::kBf16;
  // Launch each kernel after the first as a programmatic dependent of the previous one (PDL:
  // its launch and block scheduling overlap the predecessor's tail). Off: plain stream order.
  bool programmatic_launch = true;
};

struct MoeRun {
  const std::uint16_t* x = nullptr;     // [T, H] bf16
  int tokens = 0;                       // T
  const int* topk_ids = nullptr;        // [T, k] global expert ids, when routing is precomputed
  const float* topk_weights = nullptr;  // [T, k]
  float* out_f32 = nullptr;             // [T, H] fp32 partial (before the TP sum), or null
  std::uint16_t* out_bf16 = nullptr;    // [T, H] bf16 final output, or null
  // Optional: 5 events recorded before routing, before gemm1, gemm2, combine and after combine
  // (benchmarks time the phases with them; recording is legal under graph capture).
  cudaEvent_t* phase_events = nullptr;
};

// Where the router's decisions of the last forward (when routing was not precomputed) sit in
// the workspace: topk ids i32 [T, k] and weights f32 [T, k].
struct MoeRoutingView {
  const int* topk_ids;
  const float* topk_weights;
};
MoeRoutingView moe_routing_view(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens,
                                void* workspace);

// The routing kernel alone (w.router_w given): run.tokens tokens of run.x routed, the top-k ids
// and weights copied to `ids` i32 [T, k] and `weights` f32 [T, k] (device memory), on `stream`;
// the workspace as for moe_forward (it also holds the expert lists, which are then unused).
void moe_route(const MoeDeviceWeights& w, const MoeParams& p, const MoeRun& run, int* ids,
               float* weights, void* workspace, std::size_t workspace_bytes, int max_tokens,
               cudaStream_t stream);

// The variant a forward of `tokens` tokens runs: p.gemm, or for kAuto the dispatch rule above
// (expected slots per expert from the router width, or the local experts without one), for W4A16
// and W4A8 alike.
GemmVariant resolve_gemm_variant(const MoeDeviceWeights& w, const MoeParams& p, int tokens);

// Converts packed FP4 weights (w13 or w2 as prepared: `rows` rows of k values, rows a multiple of
// 16, k a multiple of 32 and at most 29056; w13: E * 2P rows of H, w2: E * H rows of P) to the
// W4A16 device layout in place, on `stream`: each 32-bit word's bits permuted
// (src/moe/layout/mxfp4_device_layout.h), rows stored in groups of 16, chunk-major
// (src/moe/layout/row_groups.h). Apply once per upload; the kernels read nothing else.
void moe_weights_to_device_layout(std::uint8_t* packed, std::size_t rows, int k,
                                  cudaStream_t stream);

// The W4A8 device layout instead (src/moe/layout/w4a8_layout.h: words that decode to E4M3 by a
// byte table, each lane's words of a 128-wide K chunk contiguous, rows in the same groups), same
// arguments.
void moe_weights_to_w4a8_layout(std::uint8_t* packed, std::size_t rows, int k, cudaStream_t stream);

// Copies E8M0 scales [rows, k/32] as prepared (host or device memory) into the device layout
// `dst` [rows, moe_scale_pitch(k)] (device memory, moe_scale_pitch(k) * rows bytes), padding with
// zeros, on `stream`.
void moe_scales_to_device_layout(const std::uint8_t* src, std::size_t rows, int k,
                                 std::uint8_t* dst, cudaStream_t stream);

// Bytes of one expert's weights the forward streams (valid rows and columns only: MXFP4, scales,
// biases).
std::size_t moe_expert_weight_bytes(const MoeDeviceWeights& w);

// Why the forward cannot run the shape (with these parameters), or nullptr when it can.
const char* moe_forward_unsupported_reason(const MoeDeviceWeights& w, const MoeParams& p);

// Device workspace for up to `max_tokens` tokens.
std::size_t moe_workspace_bytes(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens);

// Zeroes the workspace's first bytes (the routing kernel's tickets and counters) on `stream`.
// Required once after allocating a workspace and again before reusing it with another
// max_tokens; every forward leaves those bytes zero again, so graphs can replay without it. A
// forward on a workspace that was not initialized stops with a device trap (an unspecified launch
// failure) rather than compute with stale counters.
void moe_workspace_init(void* workspace, int max_tokens, cudaStream_t stream);

// Enqueues the forward. Throws mxq::Error on unsupported shapes, a too-small workspace or a
// CUDA launch failure.
void moe_forward(const MoeDeviceWeights& w, const MoeParams& p, const MoeRun& run, void* workspace,
                 std::size_t workspace_bytes, int max_tokens, cudaStream_t stream);

}  // namespace mxq::moe::gpu
