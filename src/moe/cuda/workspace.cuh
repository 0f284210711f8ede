// The MoE forward's device workspace: one owner for its layout, used by the host (sizes) and the
// kernels (pointers).
//
// The routing kernel synchronizes its blocks with tickets and per-expert counters in the
// workspace's first bytes (the sync region), and the single-token GEMM1 the two blocks that share
// a tile with a counter per block boundary. They must be zero when a forward starts:
// moe_workspace_init zeroes them once after allocation, and every forward returns them to zero
// (the routing's last block; the second of a tile's two blocks). The region sits at offset 0 with a
// size that depends only on max_tokens, so ranks that share one workspace (in-process TP/EP) see
// the same counters.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "moe/cuda/tile_cut.h"
#include "moe/layout/w4a8_layout.h"
#include "mxq/moe/cuda_moe.h"

namespace mxq::moe::gpu::detail {

constexpr int kMaxLocalExperts = 1024;  // moe_forward_unsupported_reason enforces it
constexpr int kRouteTokens = 16;        // tokens per routing group (the router mma's m)
// The single-token GEMM1 (gemm1_single_token.cuh) runs at most this many blocks: one counter and
// two partial tiles of 32 sums each per block boundary.
constexpr int kSplitMaxBlocks = 1024;
constexpr int kSplitTileSums = 32;  // a 16-channel tile's gate and up sums for one token

struct Workspace {
  int* final_ticket;       // [1] routing blocks done with their token group's counts
  int* expert_counts;      // [kMaxLocalExperts] pairs per local expert (routing, then zeroed)
  int* split_count;        // [kSplitMaxBlocks] single-token GEMM1: arrivals per block boundary
  int* group_tickets;      // [token groups] router blocks done with a token group's logits
  int* topk_ids;           // [T*k] (router output)
  float* topk_w;           // [T*k]
  float* logits;           // [T, E_global] (router output)
  int* num_tiles;          // [1]
  int* slot_pair;          // [T*k] pair index of each expert-sorted slot
  int* pair_slot;          // [T*k] slot of each pair, -1 when the expert is not local
  int* tile_expert;        // [max_tiles]
  int* tile_slot0;         // [max_tiles]
  int* tile_rows;          // [max_tiles]
  __nv_bfloat16* act;      // [T*k, I] (in the wgmma K order for GemmVariant::kPrefillWgmma)
  std::uint16_t* x_wgmma;  // [T*k, H] bf16: x by slot, in the wgmma K order (kPrefillWgmma only)
  float* y;                // [T*k, H]
  float* split_partial;    // [kSplitMaxBlocks, 2, kSplitTileSums] the two parts of a shared tile
  // W4A8 only (null otherwise): E4M3 rows in the layouts of w4a8_layout.h and their group
  // scales; decode_mma: x by token, scales [token][group]; prefill_wgmma: x by slot, scales
  // [group][slot] (pitch w4a8_wgmma_scale_pitch(T*k)). act_fp8 / act_scale serve both orders.
  std::uint8_t* x_fp8;       // [T, w4a8_act_pitch(H)]: x by token (decode_mma)
  float* x_scale;            // [T, w4a8_act_groups(H)]
  std::uint8_t* x_fp8_slot;  // [T*k, w4a8_act_pitch(H)]: x by slot (prefill_wgmma)
  float* x_slot_scale;       // [w4a8_act_groups(H), pitch]
  std::uint8_t* act_fp8;     // [T*k, w4a8_act_pitch(I)]: GEMM1's activations by slot
  float* act_scale;          // [T*k, w4a8_act_groups(I)] or [w4a8_act_groups(I), pitch]
};

inline int token_groups_for(int tokens) { return (tokens + kRouteTokens - 1) / kRouteTokens; }

constexpr int kRouterTileRows = 8;  // router rows per router mma tile (the mma's n)

// Router mma tiles per routing block: 4 from 64 token groups on (each block then reads its
// tokens' activations for 32 rows), 1 below (more blocks for fewer tokens).
inline int route_tiles_for(int tokens) { return token_groups_for(tokens) >= 64 ? 4 : 1; }

// Routing blocks along the router rows for `tiles` mma tiles per block.
inline int router_blocks_for(int router_experts, int tiles) {
  const int rows = kRouterTileRows * tiles;
  return (router_experts + rows - 1) / rows;
}

// Bytes of the sync region (offset 0) for up to max_tokens tokens.
inline std::size_t sync_region_bytes(int max_tokens) {
  // One group ticket per token group; sized for one-token groups, so the region's size does not
  // depend on the group size.
  return (1 + static_cast<std::size_t>(kMaxLocalExperts) + kSplitMaxBlocks +
          static_cast<std::size_t>(max_tokens)) *
         sizeof(int);
}

// Carves the workspace; with base == nullptr only the size is meaningful.
inline Workspace carve_workspace(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens,
                                 void* base, std::size_t* bytes) {
  auto* at = static_cast<char*>(base);
  const std::size_t pairs = static_cast<std::size_t>(max_tokens) * p.top_k;
  const std::size_t tiles =
      // Sized for the smallest tiles, so one workspace serves every GEMM variant.
      static_cast<std::size_t>(max_tiles_for(static_cast<int>(pairs), w.num_local_experts));
  std::size_t offset = 0;
  const auto take = [&](std::size_t n) {
    char* p0 = at == nullptr ? nullptr : at + offset;
    offset += (n + 255) / 256 * 256;
    return p0;
  };
  Workspace ws{};
  char* sync = take(sync_region_bytes(max_tokens));
  ws.final_ticket = reinterpret_cast<int*>(sync);
  ws.expert_counts = ws.final_ticket + (sync == nullptr ? 0 : 1);
  ws.split_count = ws.expert_counts + (sync == nullptr ? 0 : kMaxLocalExperts);
  ws.group_tickets = ws.split_count + (sync == nullptr ? 0 : kSplitMaxBlocks);
  ws.topk_ids = reinterpret_cast<int*>(take(pairs * sizeof(int)));
  ws.topk_w = reinterpret_cast<float*>(take(pairs * sizeof(float)));
  ws.logits = reinterpret_cast<float*>(
      take(static_cast<std::size_t>(max_tokens) * w.num_global_experts * sizeof(float)));
  ws.num_tiles = reinterpret_cast<int*>(take(sizeof(int)));
  ws.slot_pair = reinterpret_cast<int*>(take(pairs * sizeof(int)));
  ws.pair_slot = reinterpret_cast<int*>(take(pairs * sizeof(int)));
  ws.tile_expert = reinterpret_cast<int*>(take(tiles * sizeof(int)));
  ws.tile_slot0 = reinterpret_cast<int*>(take(tiles * sizeof(int)));
  ws.tile_rows = reinterpret_cast<int*>(take(tiles * sizeof(int)));
  ws.act = reinterpret_cast<__nv_bfloat16*>(take(pairs * static_cast<std::size_t>(w.inter) * 2));
  ws.y = reinterpret_cast<float*>(take(pairs * static_cast<std::size_t>(w.hidden) * 4));
  ws.split_partial = reinterpret_cast<float*>(
      take(static_cast<std::size_t>(kSplitMaxBlocks) * 2 * kSplitTileSums * sizeof(float)));
  ws.x_wgmma =
      reinterpret_cast<std::uint16_t*>(take(pairs * static_cast<std::size_t>(w.hidden) * 2));
  if (p.activation_quant == GpuActivationQuant::kFp8Group128) {
    const auto tokens = static_cast<std::size_t>(max_tokens);
    ws.x_fp8 = reinterpret_cast<std::uint8_t*>(
        take(tokens * static_cast<std::size_t>(w4a8_act_pitch(w.hidden))));
    ws.x_scale = reinterpret_cast<float*>(
        take(tokens * static_cast<std::size_t>(w4a8_act_groups(w.hidden)) * sizeof(float)));
    const std::size_t scale_pitch = w4a8_wgmma_scale_pitch(pairs);  // >= pairs
    ws.x_fp8_slot = reinterpret_cast<std::uint8_t*>(
        take(pairs * static_cast<std::size_t>(w4a8_act_pitch(w.hidden))));
    ws.x_slot_scale = reinterpret_cast<float*>(
        take(scale_pitch * static_cast<std::size_t>(w4a8_act_groups(w.hidden)) * sizeof(float)));
    ws.act_fp8 = reinterpret_cast<std::uint8_t*>(
        take(pairs * static_cast<std::size_t>(w4a8_act_pitch(w.inter))));
    ws.act_scale = reinterpret_cast<float*>(
        take(scale_pitch * static_cast<std::size_t>(w4a8_act_groups(w.inter)) * sizeof(float)));
  }
  if (bytes != nullptr) *bytes = offset;
  return ws;
}

}  // namespace mxq::moe::gpu::detail
