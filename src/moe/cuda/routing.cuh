// Device routing of the MoE forward in one kernel: router logits, top-k + softmax, per-expert
// counts, expert-sorted slots and GEMM work tiles (tile_tokens slots each), with no host
// synchronization.
//
// Grid (router blocks, token groups of kRouteTokens); a block takes 8 or 32 router rows
// (route_tiles_for: 32 at large T, so each token's activations are read from L2 fewer times) for
// the tokens of its group, its kRouteWarps warps splitting K (router_logits). Blocks
// meet through tickets in the workspace's sync region (workspace.cuh) instead of kernel boundaries:
//   1. every block writes its logits; the last router block of a token group (group ticket)
//      takes the top-k of that group's tokens and adds its pairs to the per-expert counts;
//   2. the last token group to finish (final ticket) scans the counts, writes the tiles and the
//      slot of every pair, and returns the tickets and counts to zero for the next forward.
// With precomputed routing the grid is (1, token groups) and step 1 only counts the given ids.
// With logits_only (one token, W4A16 register-streaming GEMMs) the blocks stop after the logits:
// GEMM1's blocks take the top-k and write the lists (gemm1_single_token.cuh, route_single_token).
// With one token group (T <= kRouteTokens) the group's last block builds the lists at once, from
// the ids it keeps in shared memory.
// One kernel instead of a router launch plus a one-block list kernel: at T = 1 the list work is
// a few hundred instructions, so its launch and its dependent round trips were the cost.
#pragma once

#include <cstdint>

#include "block_trace.cuh"
#include "cuda_common/mma.cuh"
#include "cuda_common/pdl.cuh"
#include "cuda_common/smem.cuh"
#include "mxfp4_mma.cuh"
#include "workspace.cuh"

namespace mxq::moe::gpu::detail {

constexpr int kRouteWarps = 8;  // split K of the router product; top-k of one token each
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
  TileCut tiles;     // how each expert's slots become GEMM work tiles (tile_cut_for)
  Workspace ws;
  // Only the logits: GEMM1 takes the top-k and writes the lists itself (one token;
  // gemm1_single_token.cuh, route_single_token).
  bool logits_only = false;
};

using mxq::ptx::bf16_bits_to_float;

// Logits of the router rows e0 .. e0 + 8 kNTiles - 1 for the tokens t0 .. t0 + nt - 1 (fp32), on
// the tensor cores: logits = x (tokens x H) * router_w^T, bf16 inputs, fp32 accumulation.
// Warp w takes the 32-wide K steps w, w + kRouteWarps, ... in increasing order and keeps a 16 x 8
// mma tile per 8 router rows; the warps' partial sums are added in warp order in shared memory.
// Lane (r, c) loads 8 consecutive values (one 16-byte vector) of tokens r and r + 8 and of router
// row r of each tile per step, and the same registers serve as A (tokens) and B (router rows):
// the k order inside a step is permuted the same way for both operands, so the dot products are
// unchanged. Why this shape: every logit is computed by the same instructions in the same order
// whatever T and kNTiles are (rows of an mma do not interact), so a token's routing does not
// depend on the batch it arrives in; and at T = 4096 the 1.5 GFLOP of router work takes the
// tensor cores microseconds where the fp32 FMA version took half a millisecond.
template <int kNTiles>
__device__ __forceinline__ void router_logits(
    const RouteArgs& a, int e0, int t0, int nt,
    float (*partial)[kRouteTokens][kRouterTileRows * kNTiles]) {
  constexpr int kBatch = kNTiles == 1 ? 6 : 3;  // steps whose loads are in flight together
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int r = lane / 4;
  const int c = lane % 4;
  const int steps = a.hidden / 32;
  const auto token_row = [&](int t) -> const uint4* {
    return t < nt
               ? reinterpret_cast<const uint4*>(a.x + static_cast<std::size_t>(t0 + t) * a.hidden)
               : nullptr;
  };
  const uint4* x_lo = token_row(r);
  const uint4* x_hi = token_row(r + 8);
  const uint4* w_row[kNTiles];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const int e = e0 + kRouterTileRows * j + r;
    w_row[j] =
        e < a.router_experts
            ? reinterpret_cast<const uint4*>(a.router_w + static_cast<std::size_t>(e) * a.hidden)
            : nullptr;
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float acc[kNTiles][4] = {};
  for (int s0 = warp; s0 < steps; s0 += kRouteWarps * kBatch) {
    uint4 xl[kBatch];
    uint4 xh[kBatch];
    uint4 wv[kBatch][kNTiles];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int s = s0 + b * kRouteWarps;
      const int v = 4 * s + c;  // this lane's vector of the step
      const bool in = s < steps;
      xl[b] = in && x_lo != nullptr ? __ldg(x_lo + v) : zero;
      xh[b] = in && x_hi != nullptr ? __ldg(x_hi + v) : zero;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
        wv[b][j] = in && w_row[j] != nullptr ? __ldg(w_row[j] + v) : zero;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (s0 + b * kRouteWarps >= steps) break;
      const std::uint32_t a0[4] = {xl[b].x, xh[b].x, xl[b].y,
                                   xh[b].y};  // values 0..3 of the vector
      const std::uint32_t a1[4] = {xl[b].z, xh[b].z, xl[b].w, xh[b].w};  // values 4..7
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        ptx::mma_m16n8k16_bf16(acc[j], a0, wv[b][j].x, wv[b][j].y);
        ptx::mma_m16n8k16_bf16(acc[j], a1, wv[b][j].z, wv[b][j].w);
      }
    }
  }
  // acc[j][i]: token r (i < 2) or r + 8, router row 8 j + 2 c + (i & 1).
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      partial[warp][r + (i >= 2 ? 8 : 0)][kRouterTileRows * j + 2 * c + (i & 1)] = acc[j][i];
  __syncthreads();
  for (int q = static_cast<int>(threadIdx.x); q < kRouteTokens * kRouterTileRows * kNTiles;
       q += blockDim.x) {
    const int t = q / (kRouterTileRows * kNTiles);
    const int n = q % (kRouterTileRows * kNTiles);
    const int e = e0 + n;
    if (t >= nt || e >= a.router_experts) continue;
    float sum = 0.0F;
#pragma unroll
    for (int w = 0; w < kRouteWarps; ++w) sum += partial[w][t][n];
    const float bias = a.router_b != nullptr ? bf16_bits_to_float(a.router_b[e]) : 0.0F;
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

// One warp's top-k of a row of `width` router logits: k rounds of a warp argmax over the keys
// held in registers (lane l holds experts l, l+32, ..., kPerLane of them), then the softmax over
// the k chosen logits in order j = 0..k-1, as the reference computes it. Lane j < k ends with the
// j-th choice: its expert id and its weight.
template <int kPerLane>
__device__ __forceinline__ void warp_row_topk(const float* row, int width, int top_k, int lane,
                                              int& chosen_id, float& weight) {
  // Every load is issued before any is used: a load under the `e < width` branch waited for the
  // one before it (kPerLane serial L2 round trips). Lanes past the width read the last logit and
  // key it out. The loads bypass L1: other blocks wrote the logits.
  float logit[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) logit[i] = __ldcg(row + min(lane + 32 * i, width - 1));
  std::uint64_t keys[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    keys[i] = e < width ? routing_key(logit[i], e) : 0;
  }
  float top = 0.0F;
  float sum = 0.0F;
  float chosen = 0.0F;  // lane j keeps the j-th choice
  chosen_id = -1;
  // Keys are distinct (the ids differ), so round j's choice is the largest key below round
  // j-1's: nothing needs striking, and the keys stay in registers.
  std::uint64_t ceiling = ~std::uint64_t{0};
  for (int j = 0; j < top_k; ++j) {
    std::uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) best = keys[i] < ceiling && keys[i] > best ? keys[i] : best;
    // The warp's largest key: the largest high word, then the largest low word among the lanes
    // holding it (two redux.sync instead of five rounds of 64-bit shuffles).
    const auto high = static_cast<std::uint32_t>(best >> 32);
    const std::uint32_t top_high = __reduce_max_sync(0xFFFFFFFFU, high);
    const std::uint32_t top_low =
        __reduce_max_sync(0xFFFFFFFFU, high == top_high ? static_cast<std::uint32_t>(best) : 0U);
    best = (static_cast<std::uint64_t>(top_high) << 32) | top_low;
    ceiling = best;
    const float logit = key_logit(best);
    if (j == 0) top = logit;
    sum += expf(logit - top);
    if (lane == j) {
      chosen = logit;
      chosen_id = key_id(best);
    }
  }
  weight = expf(chosen - top) / sum;
}

// The router width picks how many keys each lane holds (compile time, so they stay in registers).
__device__ __forceinline__ void row_topk(const float* row, int width, int top_k, int lane,
                                         int& chosen_id, float& weight) {
  const int per_lane = (width + 31) / 32;
  if (per_lane <= 1) {
    warp_row_topk<1>(row, width, top_k, lane, chosen_id, weight);
  } else if (per_lane <= 2) {
    warp_row_topk<2>(row, width, top_k, lane, chosen_id, weight);
  } else if (per_lane <= 4) {
    warp_row_topk<4>(row, width, top_k, lane, chosen_id, weight);
  } else if (per_lane <= 8) {
    warp_row_topk<8>(row, width, top_k, lane, chosen_id, weight);
  } else if (per_lane <= 16) {
    warp_row_topk<16>(row, width, top_k, lane, chosen_id, weight);
  } else {
    warp_row_topk<kMaxRouterExperts / 32>(row, width, top_k, lane, chosen_id, weight);
  }
}

// Warp per token: the token's top-k and weights into the workspace. shared_ids (one token group,
// which starts at token 0): the ids are also kept there, by pair.
__device__ __forceinline__ void token_topk_softmax(const RouteArgs& a, int t, int lane,
                                                   int* shared_ids) {
  int chosen_id = -1;
  float weight = 0.0F;
  row_topk(a.ws.logits + static_cast<std::size_t>(t) * a.router_experts, a.router_experts, a.top_k,
           lane, chosen_id, weight);
  if (lane < a.top_k) {
    a.ws.topk_ids[t * a.top_k + lane] = chosen_id;
    a.ws.topk_w[t * a.top_k + lane] = weight;
    if (shared_ids != nullptr) shared_ids[t * a.top_k + lane] = chosen_id;
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
// kIdsShared: `ids` is in shared memory (one token group), else in global memory, written by
// other blocks of this kernel (read through L2).
template <bool kIdsShared>
__device__ __forceinline__ void build_lists(const RouteArgs& a, const int* ids, int* smem,
                                            bool counts_from_ids) {
  const auto id_of = [&](int p) {
    if constexpr (kIdsShared) {
      return ids[p];
    } else {
      return __ldcg(ids + p);
    }
  };
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
      const int e = id_of(p) - a.first_expert;
      if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
    }
    __syncthreads();
  }
  // Exclusive scans of slots and tiles over the experts, by the whole block: each thread sums a
  // run of experts (one when E <= blockDim), the warps scan their threads' sums with shuffles and
  // add the sums of the warps before them from shared memory. (One warp scanning 4+ experts a
  // lane was ~0.9 us of the routing's critical path at T = 1.)
  __shared__ int warp_slots[kRouteWarps];
  __shared__ int warp_tiles[kRouteWarps];
  const int per_thread = (experts + kRouteWarps * 32 - 1) / (kRouteWarps * 32);
  const int begin = min(static_cast<int>(threadIdx.x) * per_thread, experts);
  const int end = min(begin + per_thread, experts);
  int slots = 0;
  int tiles = 0;
  for (int e = begin; e < end; ++e) {
    slots += counts[e];
    tiles += tile_count(a.tiles, counts[e]);
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
  if (lane == 31) {
    warp_slots[warp] = slot_prefix;
    warp_tiles[warp] = tile_prefix;
  }
  __syncthreads();
  int all_tiles = 0;
  for (int w = 0; w < kRouteWarps; ++w) {
    if (w < warp) {
      slot_prefix += warp_slots[w];
      tile_prefix += warp_tiles[w];
    }
    all_tiles += warp_tiles[w];
  }
  slots = slot_prefix - slots;
  tiles = tile_prefix - tiles;
  for (int e = begin; e < end; ++e) {
    offsets[e] = slots;
    tile_offsets[e] = tiles;
    slots += counts[e];
    tiles += tile_count(a.tiles, counts[e]);
  }
  if (threadIdx.x == 0) *a.ws.num_tiles = all_tiles;
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const int count = counts[e];
    const int expert_tiles = tile_count(a.tiles, count);
    for (int i = 0; i < expert_tiles; ++i) {
      const int tile = tile_offsets[e] + i;
      a.ws.tile_expert[tile] = e;
      a.ws.tile_slot0[tile] = offsets[e] + tile_first_slot(a.tiles, i);
      a.ws.tile_rows[tile] = tile_rows(a.tiles, count, i);
    }
    if (!counts_from_ids) a.ws.expert_counts[e] = 0;
  }
  // The pairs' slots, kSlotBatch pairs a thread per round with their ids loaded together: one
  // pair at a time, each id's L2 round trip waited for the stores before it (the compiler cannot
  // move a load of `ids` above a store to the workspace), and this one block's loop grew with T
  // (at T = 4096, 64 dependent rounds a thread).
  constexpr int kSlotBatch = 8;
  for (int p0 = threadIdx.x; p0 < pairs; p0 += kSlotBatch * blockDim.x) {
    int e[kSlotBatch];
#pragma unroll
    for (int b = 0; b < kSlotBatch; ++b) {
      const int p = p0 + b * static_cast<int>(blockDim.x);
      e[b] = p < pairs ? id_of(p) - a.first_expert : -1;
    }
#pragma unroll
    for (int b = 0; b < kSlotBatch; ++b) {
      const int p = p0 + b * static_cast<int>(blockDim.x);
      if (p >= pairs) break;
      if (e[b] >= 0 && e[b] < experts) {
        const int slot = offsets[e[b]] + atomicAdd(&cursor[e[b]], 1);
        a.ws.slot_pair[slot] = p;
        a.ws.pair_slot[p] = slot;
      } else {
        a.ws.pair_slot[p] = -1;
      }
    }
  }
  for (int g = threadIdx.x; g < static_cast<int>(gridDim.y); g += blockDim.x)
    a.ws.group_tickets[g] = 0;
  if (threadIdx.x == 0) *a.ws.final_ticket = 0;
}

template <int kNTiles>
__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(RouteArgs a) {
  extern __shared__ int route_smem[];  // build_lists: 4 E + 2 ints
  __shared__ float partial[kRouteWarps][kRouteTokens][kRouterTileRows * kNTiles];
  __shared__ int group_ids[kRouteTokens * kMaxTopK];  // one token group: its pairs' expert ids
  trace_block(MoeTraceKernel::kRouting, MoeTracePoint::kStart);
  ptx::allow_dependents();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int t0 = blockIdx.y * kRouteTokens;
  const int nt = min(kRouteTokens, a.tokens - t0);
  const bool routing = a.router_w != nullptr;
  if (routing) {
    router_logits<kNTiles>(a, blockIdx.x * kRouterTileRows * kNTiles, t0, nt, partial);
    trace_block<true>(MoeTraceKernel::kRouting, MoeTracePoint::kReleased);
    if (a.logits_only) return;
    if (!block_is_last(a.ws.group_tickets + blockIdx.y, static_cast<int>(gridDim.x))) return;
    trace_block(MoeTraceKernel::kRouting, MoeTracePoint::kMid);
    for (int t = t0 + warp; t < t0 + nt; t += kRouteWarps)
      token_topk_softmax(a, t, lane, gridDim.y == 1 ? group_ids : nullptr);
    __syncthreads();
  }
  const int* ids = routing ? a.ws.topk_ids : a.given_ids;
  if (gridDim.y == 1) {  // one token group: this block is the last one, no counters needed
    // The group's ids in shared memory, for the lists' two passes over them: the top-k above
    // kept them there, or the given ones are copied once.
    if (!routing) {
      for (int p = static_cast<int>(threadIdx.x); p < nt * a.top_k; p += blockDim.x)
        group_ids[p] = ids[p];
      __syncthreads();
    }
    build_lists<true>(a, group_ids, route_smem, true);
    trace_block<true>(MoeTraceKernel::kRouting, MoeTracePoint::kEnd);
    return;
  }
  for (int p = t0 * a.top_k + static_cast<int>(threadIdx.x); p < (t0 + nt) * a.top_k;
       p += blockDim.x) {
    const int e = ids[p] - a.first_expert;
    if (e >= 0 && e < a.experts) atomicAdd(a.ws.expert_counts + e, 1);
  }
  if (!block_is_last(a.ws.final_ticket, static_cast<int>(gridDim.y))) return;
  build_lists<false>(a, ids, route_smem, false);
  trace_block<true>(MoeTraceKernel::kRouting, MoeTracePoint::kEnd);
}

inline std::size_t route_smem_bytes(int experts) {
  return (4 * static_cast<std::size_t>(experts) + 2) * sizeof(int);
}

}  // namespace mxq::moe::gpu::detail
