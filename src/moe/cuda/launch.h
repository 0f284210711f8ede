// The MoE forward's kernel families (internal), one launch file each; forward.cu runs them in
// the pipeline's order (include/mxq/moe/cuda_moe.h):
//   launch_routing.cu   routing.cuh                  router GEMV, top-k, expert lists, work tiles
//   launch_quantize.cu  quantize_activations.cuh     W4A8: activations to E4M3 groups of 128
//   launch_decode.cu    gemm_register_stream.cuh,    GemmVariant::kDecodeMma: mma.sync on
//                       gemm1_single_token.cuh       register-streamed MXFP4 (few slots/expert)
//   launch_prefill.cu   gemm_wgmma.cuh               GemmVariant::kPrefillWgmma: the activations
//                                                    gathered by slot, wgmma with a TMA producer
//   launch_prefill_w4a8.cu  gemm_wgmma_w4a8.cuh,     the same for W4A8: activations quantized by
//                       quantize_activations.cuh     slot, FP8 wgmma on table-decoded weights
//   launch_combine.cu   combine.cuh                  weighted sum over each token's k experts
// and weight_layout.cu converts prepared weights and scales to the kernels' device layouts.
// Each kernel header is included by its launch file only (a kernel has one translation unit).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gemm_common.cuh"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "routing.cuh"
#include "workspace.cuh"

namespace mxq::moe::gpu::detail {

// SMs of the current device (a cached attribute: cheap, and legal while a graph is captured).
// Slots an expert expects at `tokens` tokens: T * top_k / E over the router's experts (the local
// ones without a router width), the quantity the dispatch rule and the decode tile width use.
double expected_slots_per_expert(const MoeDeviceWeights& w, const MoeParams& p, int tokens);
int sm_count();

// Whether the forward runs W4A8 (activations quantized to E4M3 groups).
inline bool w4a8(const MoeParams& p) {
  return p.activation_quant == GpuActivationQuant::kFp8Group128;
}

// The routing kernel (the forward's first kernel: plain stream order after the caller's work).
// `routed`: the router runs (else the given ids are counted).
void launch_routing(const RouteArgs& route, bool routed, cudaStream_t stream);

// W4A8: rows [rows, k] bf16 -> E4M3 groups `q` and their scales. `reads_predecessor`: the rows
// are an earlier kernel's output (wait first); else quantize while that kernel runs.
void launch_quantize_fp8(bool reads_predecessor, const std::uint16_t* src, int rows, int k,
                         std::uint8_t* q, float* scales, bool programmatic, cudaStream_t stream);

// Whether one token routed on the device can run the single-token GEMM1 (which takes the top-k
// itself, route_single_token) for up to max_tiles chosen experts' tiles.
bool decode_single_token_fits(const MoeDeviceWeights& w, int max_tiles);
// GEMM1 (+ SwiGLU) or GEMM2 of the decode_mma variant over up to max_tiles work tiles, cut as
// `tiles` (tile_cut_for: 8 or 16 slots).
void launch_decode_gemm(bool gemm1, const GemmArgs& args, int max_tiles, const TileCut& tiles,
                        cudaStream_t stream);

// Prefill: GEMM1's activations by slot, in the wgmma K order (after the routing kernel's slots).
void launch_prefill_gather(const std::uint16_t* x, const Workspace& ws, int pairs, int top_k,
                           int hidden, bool programmatic, cudaStream_t stream);
// GEMM1 (+ SwiGLU) or GEMM2 of the prefill_wgmma variant over up to max_tiles work tiles.
void launch_prefill_gemm(bool gemm1, const GemmArgs& args, int tokens, int max_tiles,
                         cudaStream_t stream);

// W4A8 prefill: GEMM1's (x gathered by slot) or GEMM2's (the activations) E4M3 operand and its
// scales in the prefill_wgmma layout (w4a8_layout.h), after the kernel before.
void launch_prefill_w4a8_quantize(bool gemm1, const GemmArgs& args, int pairs, cudaStream_t stream);
// GEMM1 (+ SwiGLU) or GEMM2 of the W4A8 prefill_wgmma variant over up to max_tiles work tiles.
void launch_prefill_w4a8_gemm(bool gemm1, const GemmArgs& args, int tokens, int max_tiles,
                              cudaStream_t stream);

// The combine kernel: out = the weighted sum of each token's k GEMM2 rows.
void launch_combine(const Workspace& ws, const float* weights, const MoeParams& p, int hidden,
                    const MoeRun& run, cudaStream_t stream);

// The block timeline records of one family's translation unit (MXQ_MOE_BLOCK_TRACE builds):
// copies the blocks that ran into `all` [kMoeTraceKernels * kMoeTraceMaxBlocks] and clears them.
void take_routing_block_trace(MoeBlockTraceRecord* all);
void take_decode_block_trace(MoeBlockTraceRecord* all);
void take_combine_block_trace(MoeBlockTraceRecord* all);

}  // namespace mxq::moe::gpu::detail
