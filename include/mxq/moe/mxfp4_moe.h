// The MXFP4 MoE as an inference engine calls it (docs/engines.md): stateless ops on the caller's
// tensors, one rank per process.
//
//   1. prepared_moe_shapes(layer, rank): the shapes of this rank's prepared tensors; the caller
//      allocates them (any allocator, on the device the op will run on);
//   2. prepare_mxfp4_moe(experts, layer, rank, prepared, stream): writes them from the
//      checkpoint's expert tensors (TP slice, EP slice, padding of the intermediate size, the
//      kernels' layout); called after loading, and again after a weight update (the result is
//      bit-identical to a fresh preparation);
//   3. mxfp4_moe_workspace_bytes(...): the caller allocates a workspace of that size and zeroes
//      it once (every forward leaves it zeroed for the next one);
//   4. mxfp4_moe(x, prepared, routing, options, out, workspace, stream) per forward: on the
//      caller's stream, nothing allocated, nothing synchronized, capturable in a CUDA graph.
//      `out` is this rank's partial; the engine sums the ranks' partials (its all-reduce).
//
// The prepared tensors have one layout on every device (the kernels' device layout: packed FP4
// rows in groups of 16 with their words arranged for the decode, E8M0 scale rows padded to 16
// bytes), so they can be saved, loaded and moved between CPU and GPU as they are; the CPU
// implementation reads that layout too (it is the reference the GPU kernels are tested against).
// Names follow the engines' (docs/moe.md, "Names of the intermediate size").
#pragma once

#include <cstddef>
#include <cstdint>

#include "mxq/core/shape.h"
#include "mxq/core/tensor.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/config.h"
#include "mxq/moe/gemm_variant.h"
#include "mxq/moe/sharding.h"

namespace mxq::moe {

// The whole layer (every rank the same).
struct MoeLayerShape {
  std::int64_t num_experts = 0;        // E (global: the router's width)
  std::int64_t hidden_size = 0;        // H, a multiple of 32
  std::int64_t intermediate_size = 0;  // I per expert, before TP, a multiple of 32
  bool has_bias = true;                // gate/up bias [E, 2I] and down bias [E, H]
};

// This rank's place and the prepared layout it wants.
struct MoeRank {
  int tp_rank = 0;
  int tp_size = 1;
  int ep_rank = 0;
  int ep_size = 1;
  // The intermediate size is padded to a multiple of this (a positive multiple of 32; 128 for
  // the kernels' tiles), or not padded (0).
  std::int64_t alignment = 128;
  // The layout of the activation quantization the forward will run (W4A16 or W4A8).
  ActivationQuant activation_quant = ActivationQuant::kBf16;
};

// What a rank holds: its shards and the shapes of its prepared tensors (u8 / u8 / bf16 / u8 /
// u8 / bf16; the bias shapes are given even when the layer has no bias).
struct PreparedMoeShapes {
  TpShard tp;  // channels [tp.begin, tp.begin + tp.valid) of I; tp.width stored
  EpShard ep;  // experts [ep.begin, ep.begin + ep.count)
  std::int64_t intermediate_size_per_partition = 0;            // W = tp.width (unpadded)
  std::int64_t intermediate_size_per_partition_after_pad = 0;  // P
  Shape w13;        // [E_local, 2P, H/2]: gate rows [0, W), up rows [P, P + W)
  Shape w13_scale;  // [E_local, 2P, scale pitch of H] (E8M0; rows padded to 16 bytes)
  Shape w13_bias;   // [E_local, 2P]
  Shape w2;         // [E_local, H, P/2]
  Shape w2_scale;   // [E_local, H, scale pitch of P]
  Shape w2_bias;    // [E_local, H] (zeros on TP ranks other than 0: the bias is added once)
};
// Throws mxq::Error naming the argument for shapes or ranks the layer cannot have.
PreparedMoeShapes prepared_moe_shapes(const MoeLayerShape& layer, const MoeRank& rank);

// Views of the caller's prepared tensors (on one device; the bias views empty when the layer has
// none).
struct PreparedMoe {
  TensorView w13;
  TensorView w13_scale;
  TensorView w13_bias;
  TensorView w2;
  TensorView w2_scale;
  TensorView w2_bias;
};

// A checkpoint's expert tensors as stored (the caller's, on the device that prepares), for every
// expert (E) or only this rank's (E_local), over the whole intermediate size (I) or only this
// rank's channels (tp.valid: what vLLM and SGLang hold after loading):
//   kGptOss: w13 = gate_up_proj_blocks u8 [E, 2I, H/32, 16] with gate and up rows interleaved
//            (g0, u0, g1, u1, ...), w13_scale = gate_up_proj_scales u8 [E, 2I, H/32],
//            w13_bias = gate_up_proj_bias bf16 [E, 2I]; w2 = down_proj_blocks u8
//            [E, H, I/32, 16], w2_scale = down_proj_scales u8 [E, H, I/32], w2_bias =
//            down_proj_bias bf16 [E, H];
//   kNative: w13 u8 [E, 2I, H/2] with the gate rows then the up rows, w13_scale [E, 2I, H/32],
//            w13_bias [E, 2I]; w2 u8 [E, H, I/2], w2_scale [E, H, I/32], w2_bias [E, H].
// Packed FP4 may also be given as [E, R, K/32, 16] in the native layout (the same bytes).
struct MoeExpertTensors {
  CheckpointLayout layout = CheckpointLayout::kNative;
  TensorView w13;
  TensorView w13_scale;
  TensorView w13_bias;
  TensorView w2;
  TensorView w2_scale;
  TensorView w2_bias;
};

// Writes `prepared` (shapes from prepared_moe_shapes, contiguous, all on the experts' device) from
// `experts`: the rank's experts and channels, padded (weights 0, scales 1.0, biases 0), in the
// kernels' layout. CUDA tensors: enqueued on `stream` (a cudaStream_t; null: the default
// stream), no host synchronization; CPU tensors: on the host. Nothing of `experts` is modified.
void prepare_mxfp4_moe(const MoeExpertTensors& experts, const MoeLayerShape& layer,
                       const MoeRank& rank, const PreparedMoe& prepared, void* stream = nullptr);

// The routing of a forward: the engine's top-k (global expert ids i32 [T, top_k], -1 = a dropped
// slot; weights f32 [T, top_k]), or the gpt-oss router (bf16 [E, H], optional bias bf16 [E]):
// top-k of x . Wr^T + br, softmax over the k (the layer's router, mxq/moe/routing.h).
struct MoeRouting {
  TensorView topk_ids;
  TensorView topk_weights;
  TensorView router_weight;
  TensorView router_bias;
};

struct Mxfp4MoeOptions {
  std::int64_t top_k = 4;
  Activation activation = Activation::kSwigluOai;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;
  // Whether this rank adds the down bias (the prepared w2_bias holds it on TP rank 0 only, so the
  // default adds what was prepared; an engine that keeps the bias on every rank passes tp_rank ==
  // 0).
  bool add_down_bias = true;
  // The most tokens one forward takes with this workspace (0: the call's own T, for a workspace
  // used by calls of one size). A workspace is laid out for its max_tokens: give every call that
  // shares it the same value.
  std::int64_t max_tokens = 0;
  gpu::GemmVariant gemm = gpu::GemmVariant::kAuto;  // CUDA: the grouped GEMMs' variant
};

// Bytes of workspace a forward on `device` needs (CUDA: the routing lists, the activations
// between the GEMMs and the counters; CPU: 0) for up to options.max_tokens tokens (> 0 here).
std::size_t mxfp4_moe_workspace_bytes(const MoeLayerShape& layer, const MoeRank& rank,
                                      const Mxfp4MoeOptions& options, Device device);

// One rank's MoE forward: out [T, H] (f32, or bf16 rounded once) = sum over each token's slots
// routed to this rank's experts of weight * (w2 . act(w13 . x + b13) + b2). x: bf16 [T, H] (on
// the CPU f32 holding bf16 values is accepted too); every tensor on one device; workspace: u8
// of at least mxfp4_moe_workspace_bytes, 256-byte aligned, zeroed before its first forward
// (CPU: may be empty). Bad arguments (dtype, device, shape, stride, alignment, workspace size,
// routing) throw mxq::Error naming the argument before anything runs; ids out of [0, E) on the
// device are caught by the kernels' device-side checks only where the host cannot read them.
// A token whose x row holds a NaN or Inf gets a NaN row in the summed partials, as the layer
// gives (on the CPU every rank's row is NaN; on the device the ranks holding the experts it is
// routed to give NaN, the others may give 0).
void mxfp4_moe(const TensorView& x, const PreparedMoe& prepared, const MoeLayerShape& layer,
               const MoeRank& rank, const MoeRouting& routing, const Mxfp4MoeOptions& options,
               const TensorView& out, const TensorView& workspace, void* stream = nullptr);

// The router alone, as the forward routes (gpt-oss: top-k of x . Wr^T + br, softmax over the
// k): x bf16 [T, H] (CPU: or f32 holding bf16 values), router_weight bf16 [E, H], router_bias
// bf16 [E] or empty; writes topk_ids i32 [T, top_k] (global ids) and topk_weights f32
// [T, top_k]. CUDA: a workspace of moe_route_workspace_bytes(..., max_tokens), zeroed once, as
// the forward's; CPU: the reference router (mxq/moe/routing.h), no workspace.
std::size_t moe_route_workspace_bytes(std::int64_t num_experts, std::int64_t hidden,
                                      std::int64_t top_k, std::int64_t max_tokens, Device device);
void moe_route(const TensorView& x, const TensorView& router_weight, const TensorView& router_bias,
               std::int64_t top_k, const TensorView& topk_ids, const TensorView& topk_weights,
               const TensorView& workspace, std::int64_t max_tokens = 0, void* stream = nullptr);

}  // namespace mxq::moe
