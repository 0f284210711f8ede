// The CUDA MXFP4 MoE forward's host API (include/mxq/moe/cuda_moe.h): the checks, the workspace,
// the dispatch rule between the GEMM variants, and the pipeline, which runs the kernel families of
// launch.h in order on the caller's stream.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "launch.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "workspace.cuh"

namespace mxq::moe::gpu {

namespace detail {

double expected_slots_per_expert(const MoeDeviceWeights& w, const MoeParams& p, int tokens) {
  const int experts =
      std::max(w.num_global_experts > 0 ? w.num_global_experts : w.num_local_experts, 1);
  return static_cast<double>(tokens) * p.top_k / experts;
}

int sm_count() {
  int device = 0;
  int sms = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace detail

const char* moe_forward_unsupported_reason(const MoeDeviceWeights& w, const MoeParams& p) {
  if (w.hidden <= 0 || w.hidden % 32 != 0) return "hidden size must be a positive multiple of 32";
  if (w.inter <= 0 || w.inter % 32 != 0)
    return "intermediate size must be a positive multiple of 32";
  if (w.inter_padded < w.inter || w.inter_padded % 32 != 0)
    return "padded intermediate size must be a multiple of 32 and >= the intermediate size";
  if (p.top_k < 1 || p.top_k > detail::kMaxTopK) return "top-k must be in [1, 8]";
  const auto aligned16 = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
  };
  if (!aligned16(w.b13) || !aligned16(w.b2))
    return "bias arrays must be 16-byte aligned (the GEMM blocks copy them in 16-byte pieces)";
  if (w.num_local_experts < 1 || w.num_local_experts > detail::kMaxLocalExperts)
    return "experts must be in [1, 1024]";
  if (w.router_w != nullptr &&
      (w.num_global_experts < p.top_k || w.num_global_experts > detail::kMaxRouterExperts))
    return "router width must be in [top-k, 1024]";
  return nullptr;
}

std::size_t moe_workspace_bytes(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens) {
  std::size_t bytes = 0;
  detail::carve_workspace(w, p, max_tokens, nullptr, &bytes);
  return bytes;
}

void moe_workspace_init(void* workspace, int max_tokens, cudaStream_t stream) {
  MXQ_CUDA_CHECK(cudaMemsetAsync(workspace, 0, detail::sync_region_bytes(max_tokens), stream));
}

void moe_forward(const MoeDeviceWeights& w, const MoeParams& p, const MoeRun& run, void* workspace,
                 std::size_t workspace_bytes, int max_tokens, cudaStream_t stream) {
  if (const char* reason = moe_forward_unsupported_reason(w, p)) {
    fail(ErrorCode::kUnsupported, "CUDA MoE forward: ", reason);
  }
  MXQ_CHECK(run.tokens >= 0 && run.tokens <= max_tokens, ErrorCode::kOutOfRange,
            "moe_forward: tokens: expected 0..", max_tokens, ", found ", run.tokens);
  MXQ_CHECK(workspace_bytes >= moe_workspace_bytes(w, p, max_tokens), ErrorCode::kInvalidArgument,
            "moe_forward: workspace: expected at least ", moe_workspace_bytes(w, p, max_tokens),
            " bytes, found ", workspace_bytes);
  MXQ_CHECK(run.topk_ids != nullptr || w.router_w != nullptr, ErrorCode::kInvalidArgument,
            "moe_forward: no routing: give precomputed top-k ids/weights or router weights");
  if (run.tokens == 0) return;
  const auto mark = [&](int phase) {
    if (run.phase_events != nullptr)
      // External: under stream capture a plain record only orders work inside the graph; this
      // one becomes an event record node that the caller can synchronize on and time.
      MXQ_CUDA_CHECK(
          cudaEventRecordWithFlags(run.phase_events[phase], stream, cudaEventRecordExternal));
  };
  mark(0);
  MoeParams resolved = p;
  resolved.gemm = resolve_gemm_variant(w, p, run.tokens);
  const detail::Workspace ws = detail::carve_workspace(w, p, max_tokens, workspace, nullptr);
  const int pairs = run.tokens * p.top_k;
  const bool routing = run.topk_ids == nullptr;
  const detail::TileCut tiles = detail::tile_cut_for(
      resolved.gemm, detail::w4a8(p), detail::expected_slots_per_expert(w, p, run.tokens));
  const int max_tiles = detail::max_tiles_for(pairs, w.num_local_experts, tiles.tokens);
  const bool decode = resolved.gemm == GemmVariant::kDecodeMma;
  // One token routed on the device, W4A16 decode GEMMs: GEMM1 takes the top-k
  // (route_single_token), so the routing kernel computes only the logits. With precomputed
  // routing the kernel only counts the given ids, even when the layer has a router.
  const bool single_token =
      routing && run.tokens == 1 && !detail::w4a8(p) && decode &&
      detail::decode_single_token_fits(w, detail::max_tiles_for(p.top_k, w.num_local_experts));
  detail::RouteArgs route{run.x,
                          routing ? w.router_w : nullptr,
                          w.router_b,
                          run.topk_ids,
                          w.hidden,
                          w.num_global_experts,
                          p.top_k,
                          run.tokens,
                          w.first_local_expert,
                          w.num_local_experts,
                          tiles,
                          ws};
  route.logits_only = single_token;
  detail::launch_routing(route, routing, stream);
  const float* weights = routing ? ws.topk_w : run.topk_weights;
  detail::GemmArgs args{w, resolved, run.x, p.top_k, ws};
  args.single_token = single_token;
  // Each GEMM's activations: W4A8 quantizes them (decode_mma: x by token, while the routing
  // runs; prefill_wgmma: by slot, after it), W4A16 prefill gathers x by slot.
  const bool w4a8 = detail::w4a8(p);
  const auto prepare_activations = [&](bool gemm1) {
    if (w4a8 && decode) {
      if (gemm1) {
        detail::launch_quantize_fp8(false, run.x, run.tokens, w.hidden, ws.x_fp8, ws.x_scale,
                                    p.programmatic_launch, stream);
      } else {
        detail::launch_quantize_fp8(true, reinterpret_cast<const std::uint16_t*>(ws.act), pairs,
                                    w.inter, ws.act_fp8, ws.act_scale, p.programmatic_launch,
                                    stream);
      }
    } else if (w4a8) {
      detail::launch_prefill_w4a8_quantize(gemm1, args, pairs, stream);
    } else if (!decode && gemm1) {
      detail::launch_prefill_gather(run.x, ws, pairs, p.top_k, w.hidden, p.programmatic_launch,
                                    stream);
    }
  };
  const auto launch_gemm = [&](bool gemm1) {
    if (decode) {
      detail::launch_decode_gemm(gemm1, args, max_tiles, tiles, stream);
    } else if (w4a8) {
      detail::launch_prefill_w4a8_gemm(gemm1, args, run.tokens, max_tiles, stream);
    } else {
      detail::launch_prefill_gemm(gemm1, args, run.tokens, max_tiles, stream);
    }
  };
  prepare_activations(true);

  mark(1);
  launch_gemm(true);
  prepare_activations(false);
  mark(2);
  launch_gemm(false);
  mark(3);
  detail::launch_combine(ws, weights, p, w.hidden, run, stream);
  mark(4);
}

void moe_route(const MoeDeviceWeights& w, const MoeParams& p, const MoeRun& run, int* ids,
               float* weights, void* workspace, std::size_t workspace_bytes, int max_tokens,
               cudaStream_t stream) {
  MXQ_CHECK(w.router_w != nullptr, ErrorCode::kInvalidArgument, "moe_route: no router weights");
  if (const char* reason = moe_forward_unsupported_reason(w, p)) {
    fail(ErrorCode::kUnsupported, "CUDA MoE routing: ", reason);
  }
  MXQ_CHECK(run.tokens >= 0 && run.tokens <= max_tokens, ErrorCode::kOutOfRange,
            "moe_route: tokens: expected 0..", max_tokens, ", found ", run.tokens);
  MXQ_CHECK(workspace_bytes >= moe_workspace_bytes(w, p, max_tokens), ErrorCode::kInvalidArgument,
            "moe_route: workspace: expected at least ", moe_workspace_bytes(w, p, max_tokens),
            " bytes, found ", workspace_bytes);
  if (run.tokens == 0) return;
  const detail::Workspace ws = detail::carve_workspace(w, p, max_tokens, workspace, nullptr);
  detail::RouteArgs route{run.x,
                          w.router_w,
                          w.router_b,
                          nullptr,
                          w.hidden,
                          w.num_global_experts,
                          p.top_k,
                          run.tokens,
                          w.first_local_expert,
                          w.num_local_experts,
                          detail::tile_cut_for(GemmVariant::kDecodeMma, false, 0.0),
                          ws};
  detail::launch_routing(route, true, stream);
  const std::size_t pairs = static_cast<std::size_t>(run.tokens) * p.top_k;
  MXQ_CUDA_CHECK(
      cudaMemcpyAsync(ids, ws.topk_ids, pairs * sizeof(int), cudaMemcpyDeviceToDevice, stream));
  MXQ_CUDA_CHECK(
      cudaMemcpyAsync(weights, ws.topk_w, pairs * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}

GemmVariant resolve_gemm_variant(const MoeDeviceWeights& w, const MoeParams& p, int tokens) {
  if (p.gemm != GemmVariant::kAuto) return p.gemm;
  return detail::expected_slots_per_expert(w, p, tokens) >= kPrefillMinSlotsPerExpert
             ? GemmVariant::kPrefillWgmma
             : GemmVariant::kDecodeMma;
}

MoeRoutingView moe_routing_view(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens,
                                void* workspace) {
  const detail::Workspace ws = detail::carve_workspace(w, p, max_tokens, workspace, nullptr);
  return {ws.topk_ids, ws.topk_w};
}

bool moe_block_trace_enabled() { return MXQ_MOE_BLOCK_TRACE != 0; }

std::array<std::vector<MoeBlockTraceRecord>, kMoeTraceKernels> moe_block_trace_take() {
#if MXQ_MOE_BLOCK_TRACE
  std::vector<MoeBlockTraceRecord> all(static_cast<std::size_t>(kMoeTraceKernels) *
                                       kMoeTraceMaxBlocks);
  detail::take_routing_block_trace(all.data());
  detail::take_decode_block_trace(all.data());
  detail::take_combine_block_trace(all.data());
  std::array<std::vector<MoeBlockTraceRecord>, kMoeTraceKernels> out;
  for (int k = 0; k < kMoeTraceKernels; ++k) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(k) * kMoeTraceMaxBlocks;
    auto last = first + kMoeTraceMaxBlocks;
    while (last != first && (last - 1)->at_ns[0] == 0) --last;  // blocks that never started
    out[k].assign(first, last);
  }
  return out;
#else
  fail(ErrorCode::kUnsupported,
       "moe_block_trace_take: this build does not record the MoE block timeline (configure with "
       "-DMXQ_MOE_BLOCK_TRACE=ON)");
#endif
}

std::size_t moe_expert_weight_bytes(const MoeDeviceWeights& w) {
  const std::size_t h = static_cast<std::size_t>(w.hidden);
  const std::size_t i = static_cast<std::size_t>(w.inter);
  const std::size_t w13 = 2 * i * (h / 2 + h / 32) + (w.b13 != nullptr ? 2 * i * 2 : 0);
  const std::size_t w2 = h * (i / 2 + i / 32) + (w.b2 != nullptr ? h * 2 : 0);
  return w13 + w2;
}

}  // namespace mxq::moe::gpu
