// Device routing of the MoE forward in one kernel: router logits, top-k + softmax, per-expert
// counts, expert-sorted slots and GEMM work tiles (tile_tokens slots each), with no host
// synchronization.
//
// Grid (router blocks, token groups); a block is kRouteWarps warps, one router row (expert) per
// warp, for the tokens of its group (route_group_tokens: 1 at small T, up to kRouteTokens). Blocks
// meet through tickets in the workspace's sync region (workspace.cuh) instead of kernel boundaries:
//   1. every block writes its logits; the last router block of a token group (group ticket)
//      takes the top-k of that group's tokens and adds its pairs to the per-expert counts;
//   2. the last token group to finish (final ticket) scans the counts, writes the tiles and the
//      slot of every pair, and returns the tickets and counts to zero for the next forward.
// With precomputed routing the grid is (1, token groups) and step 1 only counts the given ids.
// With one token group (T = 1) the group's last block builds the lists at once.
// One kernel instead of a router launch plus a one-block list kernel: at T = 1 the list work is
// a few hundred instructions, so its launch and its dependent round trips were the cost.
#pragma once

#include <cstdint>

#include "pdl.cuh"
#include "workspace.cuh"

namespace mxq::moe::cuda::detail {

constexpr int kRouteWarps = 4;
constexpr int kRouteUnroll = 12;  // 16-byte vectors per lane in flight per round (2880 = 1 round)
constexpr int kMaxTopK = 8;
constexpr int kMaxRouterExperts = 1024;

struct RouteArgs {
  const std::uint16_t* x;         // [T, H] bf16
  const std::uint16_t* router_w;  // [E_router, H] bf16; null when routing is given
  const std::uint16_t* router_b;  // [E_router] bf16 or null
  const int* given_ids;           // [T, k] global expert ids when routing is given
  int hidden;
  int router_experts;
  int top_k;
  int tokens;
  int first_expert;  // global id of local expert 0
  int experts;       // local experts
  int group_tokens;  // tokens per group (<= kRouteTokens)
  int tile_tokens;   // slots per GEMM work tile (the GEMM variant's; tile_tokens_for)
  Workspace ws;
};

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}

// Logits of expert e for tokens t0 .. t0+nt-1 (fp32). The router row is loaded once per round
// and reused for every token of the group; lane l visits vectors l, l+32, ... in increasing
// order and the lanes are summed by an xor butterfly, so each logit's rounding does not depend on
// the group size.
__device__ __forceinline__ void router_logits(const RouteArgs& a, int e, int t0, int nt, int lane) {
  const uint4* wrow =
      reinterpret_cast<const uint4*>(a.router_w + static_cast<std::size_t>(e) * a.hidden);
  const int vectors = a.hidden / 8;
  float acc[kRouteTokens] = {};
  for (int v0 = lane; v0 < vectors; v0 += 32 * kRouteUnroll) {
    uint4 wa[kRouteUnroll];
#pragma unroll
    for (int u = 0; u < kRouteUnroll; ++u) {
      const int v = v0 + 32 * u;
      wa[u] = v < vectors ? __ldg(wrow + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < kRouteTokens; ++t) {
      if (t >= nt) break;
      const uint4* xrow =
          reinterpret_cast<const uint4*>(a.x + static_cast<std::size_t>(t0 + t) * a.hidden);
      uint4 xa[kRouteUnroll];
#pragma unroll
      for (int u = 0; u < kRouteUnroll; ++u) {
        const int v = v0 + 32 * u;
        xa[u] = v < vectors ? __ldg(xrow + v) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kRouteUnroll; ++u) {
        if (v0 + 32 * u >= vectors) break;
        const std::uint32_t xs[4] = {xa[u].x, xa[u].y, xa[u].z, xa[u].w};
        const std::uint32_t ws[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[t] = fmaf(__uint_as_float(xs[i] << 16), __uint_as_float(ws[i] << 16), acc[t]);
          acc[t] = fmaf(__uint_as_float(xs[i] & 0xFFFF0000U), __uint_as_float(ws[i] & 0xFFFF0000U),
                        acc[t]);
        }
      }
    }
  }
  const float bias = a.router_b != nullptr ? bf16_bits_to_float(a.router_b[e]) : 0.0F;
#pragma unroll
  for (int t = 0; t < kRouteTokens; ++t) {
    if (t >= nt) break;
    float sum = acc[t];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFU, sum, offset);
    if (lane == 0)
      a.ws.logits[static_cast<std::size_t>(t0 + t) * a.router_experts + e] = sum + bias;
  }
}

// The routing order as one unsigned key per (logit, expert): larger logit first, equal logits
// (-0 equal to +0) by lower expert id, NaN below every number. The high word maps the float onto
// an unsigned order (NaN -> 0, -inf -> 0x007FFFFF, ...); the low word is 0xFFFFFFFF - id. Key 0
// is "nothing": a missing expert (ids < 1024 keep real keys above it).
__device__ __forceinline__ std::uint64_t routing_key(float logit, int id) {
  std::uint32_t order = 0;
  if (logit == logit) {
    const std::uint32_t bits = __float_as_uint(logit == 0.0F ? 0.0F : logit);
    order = (bits & 0x80000000U) != 0U ? ~bits : (bits | 0x80000000U);
  }
  return (static_cast<std::uint64_t>(order) << 32) | (0xFFFFFFFFU - static_cast<std::uint32_t>(id));
}
__device__ __forceinline__ int key_id(std::uint64_t key) {
  return static_cast<int>(0xFFFFFFFFU - static_cast<std::uint32_t>(key));
}
// The logit of a key (NaN for NaN; -0 comes back as +0, which the softmax cannot tell apart).
__device__ __forceinline__ float key_logit(std::uint64_t key) {
  const auto order = static_cast<std::uint32_t>(key >> 32);
  return __uint_as_float((order & 0x80000000U) != 0U ? (order & 0x7FFFFFFFU) : ~order);
}

// Warp per token: k rounds of a warp argmax over the keys held in registers (lane l holds experts
// l, l+32, ..., kPerLane of them), then the softmax over the k chosen logits in order
// j = 0..k-1, as the reference computes it.
template <int kPerLane>
__device__ __forceinline__ void warp_topk_softmax(const RouteArgs& a, int t, int lane) {
  const float* row = a.ws.logits + static_cast<std::size_t>(t) * a.router_experts;
  std::uint64_t keys[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    keys[i] = e < a.router_experts ? routing_key(__ldcg(row + e), e) : 0;  // other blocks wrote it
  }
  float top = 0.0F;
  float sum = 0.0F;
  float chosen = 0.0F;  // lane j keeps the j-th choice
  int chosen_id = -1;
  // Keys are distinct (the ids differ), so round j's choice is the largest key below round
  // j-1's: nothing needs striking, and the keys stay in registers.
  std::uint64_t ceiling = ~std::uint64_t{0};
  for (int j = 0; j < a.top_k; ++j) {
    std::uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) best = keys[i] < ceiling && keys[i] > best ? keys[i] : best;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const std::uint64_t other = __shfl_xor_sync(0xFFFFFFFFU, best, offset);
      best = other > best ? other : best;
    }
    ceiling = best;
    const float logit = key_logit(best);
    if (j == 0) top = logit;
    sum += expf(logit - top);
    if (lane == j) {
      chosen = logit;
      chosen_id = key_id(best);
    }
  }
  if (lane < a.top_k) {
    a.ws.topk_ids[t * a.top_k + lane] = chosen_id;
    a.ws.topk_w[t * a.top_k + lane] = expf(chosen - top) / sum;
  }
}

// The router width picks how many keys each lane holds (compile time, so they stay in registers).
__device__ __forceinline__ void token_topk_softmax(const RouteArgs& a, int t, int lane) {
  const int per_lane = (a.router_experts + 31) / 32;
  if (per_lane <= 1) {
    warp_topk_softmax<1>(a, t, lane);
  } else if (per_lane <= 2) {
    warp_topk_softmax<2>(a, t, lane);
  } else if (per_lane <= 4) {
    warp_topk_softmax<4>(a, t, lane);
  } else if (per_lane <= 8) {
    warp_topk_softmax<8>(a, t, lane);
  } else if (per_lane <= 16) {
    warp_topk_softmax<16>(a, t, lane);
  } else {
    warp_topk_softmax<kMaxRouterExperts / 32>(a, t, lane);
  }
}

// True in the block whose ticket is the last of `blocks`: every block's global writes before the
// call are visible to that block afterwards (fence, ticket, fence).
__device__ __forceinline__ bool block_is_last(int* ticket, int blocks) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int before = atomicAdd(ticket, 1);
    if (before >= blocks) __trap();  // the sync region was not zeroed (moe_workspace_init)
    last = before == blocks - 1 ? 1 : 0;
    __threadfence();
  }
  __syncthreads();
  return last != 0;
}

// The final block: expert offsets (exclusive scan), 8-token tiles, the slot of every pair; then
// the sync region back to zero. Slots within an expert are taken with shared-memory atomics: their
// order varies, but each slot's result depends only on its own token and expert.
// counts_from_ids: one token group, so this block counts the pairs itself (shared-memory atomics)
// instead of reading the counters the groups added to.
__device__ __forceinline__ void build_lists(const RouteArgs& a, const int* ids, int* smem,
                                            bool counts_from_ids) {
  const int experts = a.experts;
  int* counts = smem;                         // [E]
  int* offsets = counts + experts;            // [E+1]
  int* tile_offsets = offsets + experts + 1;  // [E+1]
  int* cursor = tile_offsets + experts + 1;   // [E]
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int pairs = a.tokens * a.top_k;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    counts[e] = counts_from_ids ? 0 : __ldcg(a.ws.expert_counts + e);
    cursor[e] = 0;
  }
  __syncthreads();
  if (counts_from_ids) {
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
      const int e = __ldcg(ids + p) - a.first_expert;
      if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
    }
    __syncthreads();
  }
  if (warp == 0) {  // exclusive scans of slots and tiles: lane l owns a run of experts
    const int per_lane = (experts + 31) / 32;
    const int begin = min(lane * per_lane, experts);
    const int end = min(begin + per_lane, experts);
    int slots = 0;
    int tiles = 0;
    for (int e = begin; e < end; ++e) {
      slots += counts[e];
      tiles += (counts[e] + a.tile_tokens - 1) / a.tile_tokens;
    }
    int slot_prefix = slots;
    int tile_prefix = tiles;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int s_up = __shfl_up_sync(0xFFFFFFFFU, slot_prefix, offset);
      const int t_up = __shfl_up_sync(0xFFFFFFFFU, tile_prefix, offset);
      if (lane >= offset) {
        slot_prefix += s_up;
        tile_prefix += t_up;
      }
    }
    slots = slot_prefix - slots;
    tiles = tile_prefix - tiles;
    for (int e = begin; e < end; ++e) {
      offsets[e] = slots;
      tile_offsets[e] = tiles;
      slots += counts[e];
      tiles += (counts[e] + a.tile_tokens - 1) / a.tile_tokens;
    }
    if (lane == 31) *a.ws.num_tiles = tile_prefix;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const int count = counts[e];
    for (int i = 0; i * a.tile_tokens < count; ++i) {
      const int tile = tile_offsets[e] + i;
      a.ws.tile_expert[tile] = e;
      a.ws.tile_slot0[tile] = offsets[e] + i * a.tile_tokens;
      a.ws.tile_rows[tile] = min(a.tile_tokens, count - i * a.tile_tokens);
    }
    if (!counts_from_ids) a.ws.expert_counts[e] = 0;
  }
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = __ldcg(ids + p) - a.first_expert;
    if (e >= 0 && e < experts) {
      const int slot = offsets[e] + atomicAdd(&cursor[e], 1);
      a.ws.slot_pair[slot] = p;
      a.ws.pair_slot[p] = slot;
    } else {
      a.ws.pair_slot[p] = -1;
    }
  }
  for (int g = threadIdx.x; g < static_cast<int>(gridDim.y); g += blockDim.x)
    a.ws.group_tickets[g] = 0;
  if (threadIdx.x == 0) *a.ws.final_ticket = 0;
}

__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(RouteArgs a) {
  extern __shared__ int route_smem[];  // build_lists: 4 E + 2 ints
  allow_dependents();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int t0 = blockIdx.y * a.group_tokens;
  const int nt = min(a.group_tokens, a.tokens - t0);
  const bool routing = a.router_w != nullptr;
  if (routing) {
    const int e = blockIdx.x * kRouteWarps + warp;
    if (e < a.router_experts) router_logits(a, e, t0, nt, lane);
    if (!block_is_last(a.ws.group_tickets + blockIdx.y, static_cast<int>(gridDim.x))) return;
    for (int t = t0 + warp; t < t0 + nt; t += kRouteWarps) token_topk_softmax(a, t, lane);
    __syncthreads();
  }
  const int* ids = routing ? a.ws.topk_ids : a.given_ids;
  if (gridDim.y == 1) {  // one token group: this block is the last one, no counters needed
    build_lists(a, ids, route_smem, true);
    return;
  }
  for (int p = t0 * a.top_k + static_cast<int>(threadIdx.x); p < (t0 + nt) * a.top_k;
       p += blockDim.x) {
    const int e = ids[p] - a.first_expert;
    if (e >= 0 && e < a.experts) atomicAdd(a.ws.expert_counts + e, 1);
  }
  if (!block_is_last(a.ws.final_ticket, static_cast<int>(gridDim.y))) return;
  build_lists(a, ids, route_smem, false);
}

inline std::size_t route_smem_bytes(int experts) {
  return (4 * static_cast<std::size_t>(experts) + 2) * sizeof(int);
}

}  // namespace mxq::moe::cuda::detail
