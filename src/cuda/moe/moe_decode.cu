// The decode-regime MXFP4 MoE forward: see include/mxq/moe/cuda_moe.h for the pipeline.
//
// GEMM kernels: one block = 16 output rows (channels) x one tile of <= 8 tokens of one expert,
// 4 warps splitting K. Lane (r = lane/4, c = lane%4) streams 16-byte chunks (one MXFP4 block of
// 32 values) of rows r and r+8 and feeds them to m16n8k16 bf16 mma. The mma's k order is
// permuted consistently on both operands: in k-step s of a 128-wide chunk, lane c contributes
// elements 32c + 4s .. 32c + 4s + 3, so every lane decodes only bytes of its own MX block and
// applies one scale per block; the activations in shared memory are read with the same map.
#include <cuda_bf16.h>

#include <algorithm>

#include "mxfp4_mma.cuh"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/moe/cuda_moe.h"

namespace mxq::moe::cuda {
namespace {

constexpr int kTileTokens = 8;  // mma n
constexpr int kTileRows = 16;   // mma m
constexpr int kGemmWarps = 4;   // split-K warps per block
constexpr int kChunk = 128;     // K elements per lane-quad per iteration (4 MX blocks)
constexpr int kMaxTopK = 8;

struct Workspace {
  int* topk_ids;       // [T*k] (router output)
  float* topk_w;       // [T*k]
  int* counts;         // [E]
  int* offsets;        // [E+1]
  int* num_tiles;      // [1]
  int* slot_pair;      // [T*k] pair index of each expert-sorted slot
  int* pair_slot;      // [T*k] slot of each pair, -1 when the expert is not local
  int* tile_expert;    // [max_tiles]
  int* tile_slot0;     // [max_tiles]
  int* tile_rows;      // [max_tiles]
  __nv_bfloat16* act;  // [T*k, I]
  float* y;            // [T*k, H]
};

std::size_t align_up(std::size_t n) { return (n + 255) / 256 * 256; }

int max_tiles_for(int pairs, int experts) {
  return std::min(pairs, experts) + pairs / kTileTokens + 1;
}

template <typename Visit>
std::size_t layout(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens, Visit&& visit) {
  const std::size_t pairs = static_cast<std::size_t>(max_tokens) * p.top_k;
  const std::size_t experts = static_cast<std::size_t>(w.num_local_experts);
  const std::size_t tiles =
      static_cast<std::size_t>(max_tiles_for(static_cast<int>(pairs), w.num_local_experts));
  std::size_t offset = 0;
  const auto take = [&](std::size_t bytes) {
    const std::size_t at = offset;
    offset += align_up(bytes);
    return at;
  };
  visit(take(pairs * sizeof(int)), take(pairs * sizeof(float)), take(experts * sizeof(int)),
        take((experts + 1) * sizeof(int)), take(sizeof(int)), take(pairs * sizeof(int)),
        take(pairs * sizeof(int)), take(tiles * sizeof(int)), take(tiles * sizeof(int)),
        take(tiles * sizeof(int)), take(pairs * static_cast<std::size_t>(w.inter) * 2),
        take(pairs * static_cast<std::size_t>(w.hidden) * 4));
  return offset;
}

Workspace carve(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens, void* base) {
  auto* bytes = static_cast<char*>(base);
  Workspace ws{};
  layout(w, p, max_tokens,
         [&](std::size_t ids, std::size_t tw, std::size_t counts, std::size_t offsets,
             std::size_t ntiles, std::size_t slot_pair, std::size_t pair_slot, std::size_t texp,
             std::size_t tslot, std::size_t trows, std::size_t act, std::size_t y) {
           ws.topk_ids = reinterpret_cast<int*>(bytes + ids);
           ws.topk_w = reinterpret_cast<float*>(bytes + tw);
           ws.counts = reinterpret_cast<int*>(bytes + counts);
           ws.offsets = reinterpret_cast<int*>(bytes + offsets);
           ws.num_tiles = reinterpret_cast<int*>(bytes + ntiles);
           ws.slot_pair = reinterpret_cast<int*>(bytes + slot_pair);
           ws.pair_slot = reinterpret_cast<int*>(bytes + pair_slot);
           ws.tile_expert = reinterpret_cast<int*>(bytes + texp);
           ws.tile_slot0 = reinterpret_cast<int*>(bytes + tslot);
           ws.tile_rows = reinterpret_cast<int*>(bytes + trows);
           ws.act = reinterpret_cast<__nv_bfloat16*>(bytes + act);
           ws.y = reinterpret_cast<float*>(bytes + y);
         });
  return ws;
}

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}

// ---- 1. routing: logits = x . Wr^T + br (fp32), top-k (ties: lower expert id), softmax ----
__global__ void router_topk_kernel(const std::uint16_t* __restrict__ x,
                                   const std::uint16_t* __restrict__ router_w,
                                   const std::uint16_t* __restrict__ router_b, int hidden,
                                   int experts, int top_k, int* __restrict__ topk_ids,
                                   float* __restrict__ topk_w) {
  extern __shared__ float smem[];
  float* xs = smem;               // [H]
  float* logits = smem + hidden;  // [E]
  const int t = blockIdx.x;
  const std::uint16_t* xrow = x + static_cast<std::size_t>(t) * hidden;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) xs[h] = bf16_bits_to_float(xrow[h]);
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  for (int e = warp; e < experts; e += warps) {
    const std::uint16_t* wrow = router_w + static_cast<std::size_t>(e) * hidden;
    float acc = 0.0F;
    for (int h = lane; h < hidden; h += 32) acc = fmaf(xs[h], bf16_bits_to_float(wrow[h]), acc);
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xFFFFFFFFU, acc, offset);
    if (lane == 0) logits[e] = acc + (router_b != nullptr ? bf16_bits_to_float(router_b[e]) : 0.0F);
  }
  __syncthreads();
  if (warp != 0) return;
  float chosen[kMaxTopK];
  int chosen_id[kMaxTopK];
  for (int j = 0; j < top_k; ++j) {
    float best = -INFINITY;
    int best_id = experts;
    for (int e = lane; e < experts; e += 32) {
      const float v = logits[e];
      // NaN logits never win; among equal values the lower id wins.
      if (v > best || (v == best && e < best_id)) {
        best = v;
        best_id = e;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xFFFFFFFFU, best, offset);
      const int other_id = __shfl_xor_sync(0xFFFFFFFFU, best_id, offset);
      if (other > best || (other == best && other_id < best_id)) {
        best = other;
        best_id = other_id;
      }
    }
    if (best_id >= experts) best_id = j;  // all remaining logits NaN: deterministic fallback
    chosen[j] = best;
    chosen_id[j] = best_id;
    if (lane == 0) logits[best_id] = -INFINITY;
    __syncwarp();
    if (lane == (best_id % 32)) logits[best_id] = -INFINITY;
    __syncwarp();
  }
  if (lane == 0) {
    const float top = chosen[0];
    float sum = 0.0F;
    for (int j = 0; j < top_k; ++j) sum += expf(chosen[j] - top);
    for (int j = 0; j < top_k; ++j) {
      topk_ids[t * top_k + j] = chosen_id[j];
      topk_w[t * top_k + j] = expf(chosen[j] - top) / sum;
    }
  }
}

// ---- 2. expert lists: counts, offsets, expert-sorted slots, 8-token tiles ------------------
__global__ void build_lists_kernel(const int* __restrict__ topk_ids, int pairs, int first_expert,
                                   int experts, Workspace ws) {
  extern __shared__ int lists_smem[];
  int* counts = lists_smem;                   // [E]
  int* offsets = lists_smem + experts;        // [E+1]
  int* tile_offsets = offsets + experts + 1;  // [E+1]
  for (int e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = topk_ids[p] - first_expert;
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // E <= a few hundred: a serial scan is cheaper than a sync tree
    int slots = 0;
    int tiles = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = slots;
      tile_offsets[e] = tiles;
      slots += counts[e];
      tiles += (counts[e] + kTileTokens - 1) / kTileTokens;
    }
    offsets[experts] = slots;
    tile_offsets[experts] = tiles;
    *ws.num_tiles = tiles;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const int count = counts[e];
    for (int i = 0; i * kTileTokens < count; ++i) {
      const int tile = tile_offsets[e] + i;
      ws.tile_expert[tile] = e;
      ws.tile_slot0[tile] = offsets[e] + i * kTileTokens;
      ws.tile_rows[tile] = min(kTileTokens, count - i * kTileTokens);
    }
  }
  __syncthreads();
  // Slots in pair order within each expert (one thread per expert keeps it deterministic).
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int slot = offsets[e];
    if (counts[e] == 0) continue;
    for (int p = 0; p < pairs; ++p) {
      if (topk_ids[p] - first_expert == e) {
        ws.slot_pair[slot] = p;
        ws.pair_slot[p] = slot;
        ++slot;
      }
    }
  }
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = topk_ids[p] - first_expert;
    if (e < 0 || e >= experts) ws.pair_slot[p] = -1;
  }
}

// ---- 3/4. grouped GEMMs ---------------------------------------------------------------------
__device__ __forceinline__ float sigmoidf_(float z) { return 1.0F / (1.0F + expf(-z)); }

__device__ __forceinline__ float apply_activation(GpuActivation kind, float g, float u, float alpha,
                                                  float limit) {
  switch (kind) {
    case GpuActivation::kSwigluOai:
      g = fminf(g, limit);
      u = fminf(fmaxf(u, -limit), limit);
      return (u + 1.0F) * g * sigmoidf_(alpha * g);
    case GpuActivation::kSwigluClamp:
      g = fminf(g, limit);
      u = fminf(fmaxf(u, -limit), limit);
      return g * sigmoidf_(g) * u;
    case GpuActivation::kSwiglu:
    default:
      return g * sigmoidf_(g) * u;
  }
}

// Streams rows r and r+8 (of `rows_a`) over K, multiplying by the tile's activations in shared
// memory; `kAcc` accumulator sets share the activation fragments (GEMM1: gate and up).
template <int kAcc>
struct RowPair {
  const std::uint8_t* row[kAcc][2];    // packed FP4 rows (r, r+8)
  const std::uint8_t* scale[kAcc][2];  // their E8M0 scales
};

template <int kAcc>
__device__ __forceinline__ void stream_k(const RowPair<kAcc>& rp, const __nv_bfloat16* xs,
                                         int xs_stride, int k_total, int warp, int lane,
                                         float (&acc)[kAcc][4]) {
  const int c = lane % 4;
  const int n = lane / 4;
  const int chunks = (k_total + kChunk - 1) / kChunk;
  for (int chunk = warp; chunk < chunks; chunk += kGemmWarps) {
    const int k0 = chunk * kChunk + 32 * c;  // this lane's MX block
    // Ragged K: a lane past the end feeds zeros (mma.sync needs every lane of the warp).
    const bool has_block = k0 < k_total;
    uint4 data[kAcc][2];
    std::uint32_t scales[kAcc][2];
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        data[a][h] =
            has_block ? detail::load_stream_16(rp.row[a][h] + k0 / 2) : make_uint4(0, 0, 0, 0);
        scales[a][h] = has_block ? rp.scale[a][h][k0 / 32] : 127U;
      }
    }
    const __nv_bfloat16* xk = xs + n * xs_stride + (has_block ? k0 : 0);
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const uint2 bx = has_block ? *reinterpret_cast<const uint2*>(xk + 4 * s) : make_uint2(0, 0);
#pragma unroll
      for (int a = 0; a < kAcc; ++a) {
        const detail::ScaleFactors f0 = detail::e8m0_scale_factors(scales[a][0]);
        const detail::ScaleFactors f1 = detail::e8m0_scale_factors(scales[a][1]);
        const std::uint32_t hw0 = detail::halfword(data[a][0], s);
        const std::uint32_t hw1 = detail::halfword(data[a][1], s);
        const std::uint32_t frag[4] = {
            detail::decode_e2m1x2(hw0 & 0xFFU, f0), detail::decode_e2m1x2(hw1 & 0xFFU, f1),
            detail::decode_e2m1x2(hw0 >> 8, f0), detail::decode_e2m1x2(hw1 >> 8, f1)};
        detail::mma_bf16_16816(acc[a], frag, bx.x, bx.y);
      }
    }
  }
}

// Sums the 4 warps' accumulators into warp 0's registers.
template <int kAcc>
__device__ __forceinline__ void reduce_warps(float (&acc)[kAcc][4], float* red, int warp,
                                             int lane) {
  if (warp != 0) {
#pragma unroll
    for (int a = 0; a < kAcc; ++a)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[((warp - 1) * kAcc * 4 + a * 4 + i) * 32 + lane] = acc[a][i];
  }
  __syncthreads();
  if (warp == 0) {
    for (int w = 1; w < kGemmWarps; ++w)
#pragma unroll
      for (int a = 0; a < kAcc; ++a)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[a][i] += red[((w - 1) * kAcc * 4 + a * 4 + i) * 32 + lane];
  }
}

// Loads the tile's token rows (bf16) into shared memory; missing rows are zero.
__device__ __forceinline__ void load_tile_rows(__nv_bfloat16* xs, int stride,
                                               const std::uint16_t* src_rows_base,
                                               const int* row_index, int rows, int width) {
  const int vec_per_row = width / 8;  // 16-byte vectors (width is a multiple of 32)
  for (int i = threadIdx.x; i < kTileTokens * vec_per_row; i += blockDim.x) {
    const int r = i / vec_per_row;
    const int v = i % vec_per_row;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      value = reinterpret_cast<const uint4*>(src_rows_base +
                                             static_cast<std::size_t>(row_index[r]) * width)[v];
    }
    reinterpret_cast<uint4*>(xs + r * stride)[v] = value;
  }
}

struct GemmArgs {
  MoeDeviceWeights w;
  MoeParams p;
  const std::uint16_t* x;
  int top_k;
  Workspace ws;
};

__global__ void __launch_bounds__(kGemmWarps * 32) gemm1_swiglu_kernel(GemmArgs args) {
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  const int hidden = args.w.hidden;
  const int stride = hidden + 8;  // bf16 elements; +16 bytes staggers rows across banks
  auto* xs = reinterpret_cast<__nv_bfloat16*>(gemm_smem);
  auto* red = reinterpret_cast<float*>(gemm_smem + kTileTokens * stride * 2);
  __shared__ int tokens[kTileTokens];

  const int expert = args.ws.tile_expert[tile];
  const int slot0 = args.ws.tile_slot0[tile];
  const int rows = args.ws.tile_rows[tile];
  if (threadIdx.x < kTileTokens) {
    tokens[threadIdx.x] =
        threadIdx.x < rows ? args.ws.slot_pair[slot0 + threadIdx.x] / args.top_k : 0;
  }
  __syncthreads();
  load_tile_rows(xs, stride, args.x, tokens, rows, hidden);
  __syncthreads();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int ch0 = blockIdx.x * kTileRows;
  const int r = lane / 4;
  const std::size_t row_bytes = hidden / 2;
  const std::size_t scale_row = hidden / 32;
  const std::size_t rows_per_expert = 2 * static_cast<std::size_t>(args.w.inter_padded);
  const std::size_t base_row = static_cast<std::size_t>(expert) * rows_per_expert;
  RowPair<2> rp;
  for (int h = 0; h < 2; ++h) {
    const std::size_t gate = base_row + ch0 + r + 8 * h;
    const std::size_t up = gate + args.w.inter_padded;
    rp.row[0][h] = args.w.w13 + gate * row_bytes;
    rp.row[1][h] = args.w.w13 + up * row_bytes;
    rp.scale[0][h] = args.w.w13_scale + gate * scale_row;
    rp.scale[1][h] = args.w.w13_scale + up * scale_row;
  }
  float acc[2][4] = {};
  stream_k<2>(rp, xs, stride, hidden, warp, lane, acc);
  reduce_warps<2>(acc, red, warp, lane);
  if (warp != 0) return;

  const int c = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int channel = ch0 + r + (i >= 2 ? 8 : 0);
    const int n = 2 * c + (i & 1);
    if (n >= rows) continue;
    float g = acc[0][i];
    float u = acc[1][i];
    if (args.w.b13 != nullptr) {
      g += bf16_bits_to_float(args.w.b13[base_row + channel]);
      u += bf16_bits_to_float(args.w.b13[base_row + args.w.inter_padded + channel]);
    }
    const float out =
        apply_activation(args.p.activation, g, u, args.p.swiglu_alpha, args.p.swiglu_limit);
    args.ws.act[static_cast<std::size_t>(slot0 + n) * args.w.inter + channel] =
        __float2bfloat16_rn(out);
  }
}

__global__ void __launch_bounds__(kGemmWarps * 32) gemm2_kernel(GemmArgs args) {
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  const int inter = args.w.inter;
  const int stride = inter + 8;
  auto* xs = reinterpret_cast<__nv_bfloat16*>(gemm_smem);
  auto* red = reinterpret_cast<float*>(gemm_smem + kTileTokens * stride * 2);
  __shared__ int slots[kTileTokens];

  const int expert = args.ws.tile_expert[tile];
  const int slot0 = args.ws.tile_slot0[tile];
  const int rows = args.ws.tile_rows[tile];
  if (threadIdx.x < kTileTokens) slots[threadIdx.x] = slot0 + threadIdx.x;
  __syncthreads();
  load_tile_rows(xs, stride, reinterpret_cast<const std::uint16_t*>(args.ws.act), slots, rows,
                 inter);
  __syncthreads();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int h0 = blockIdx.x * kTileRows;
  const int r = lane / 4;
  const std::size_t row_bytes = args.w.inter_padded / 2;
  const std::size_t scale_row = args.w.inter_padded / 32;
  const std::size_t base_row = static_cast<std::size_t>(expert) * args.w.hidden;
  RowPair<1> rp;
  for (int h = 0; h < 2; ++h) {
    const std::size_t row = base_row + h0 + r + 8 * h;
    rp.row[0][h] = args.w.w2 + row * row_bytes;
    rp.scale[0][h] = args.w.w2_scale + row * scale_row;
  }
  float acc[1][4] = {};
  stream_k<1>(rp, xs, stride, inter, warp, lane, acc);
  reduce_warps<1>(acc, red, warp, lane);
  if (warp != 0) return;

  const int c = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int h = h0 + r + (i >= 2 ? 8 : 0);
    const int n = 2 * c + (i & 1);
    if (n >= rows) continue;
    float v = acc[0][i];
    if (args.w.b2 != nullptr && args.p.add_down_bias)
      v += bf16_bits_to_float(args.w.b2[base_row + h]);
    args.ws.y[static_cast<std::size_t>(slot0 + n) * args.w.hidden + h] = v;
  }
}

// ---- 5. combine -----------------------------------------------------------------------------
__global__ void combine_kernel(const float* __restrict__ y, const int* __restrict__ pair_slot,
                               const float* __restrict__ topk_w, int top_k, int hidden,
                               float* __restrict__ out_f32, std::uint16_t* __restrict__ out_bf16) {
  const int t = blockIdx.y;
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= hidden) return;
  float sum = 0.0F;
  for (int j = 0; j < top_k; ++j) {
    const int slot = pair_slot[t * top_k + j];
    if (slot >= 0) sum += topk_w[t * top_k + j] * y[static_cast<std::size_t>(slot) * hidden + h];
  }
  const std::size_t at = static_cast<std::size_t>(t) * hidden + h;
  if (out_f32 != nullptr) out_f32[at] = sum;
  if (out_bf16 != nullptr) {
    out_bf16[at] = __bfloat16_as_ushort(__float2bfloat16_rn(sum));
  }
}

std::size_t gemm_smem_bytes(int k) {
  return static_cast<std::size_t>(kTileTokens) * (k + 8) * 2 +
         static_cast<std::size_t>(kGemmWarps - 1) * 2 * 4 * 32 * sizeof(float);
}

}  // namespace

const char* moe_decode_unsupported_reason(const MoeDeviceWeights& w, const MoeParams& p) {
  if (w.hidden <= 0 || w.hidden % 32 != 0) return "hidden size must be a positive multiple of 32";
  if (w.inter <= 0 || w.inter % 32 != 0)
    return "intermediate size must be a positive multiple of 32";
  if (w.inter_padded < w.inter || w.inter_padded % 32 != 0)
    return "padded intermediate size must be a multiple of 32 and >= the intermediate size";
  if (p.top_k < 1 || p.top_k > kMaxTopK) return "top-k must be in [1, 8]";
  if (w.num_local_experts < 1 || w.num_local_experts > 1024) return "experts must be in [1, 1024]";
  if (w.router_w != nullptr && (w.num_global_experts < p.top_k || w.num_global_experts > 1024))
    return "router width must be in [top-k, 1024]";
  if (gemm_smem_bytes(std::max(w.hidden, w.inter)) > 200 * 1024) return "hidden size too large";
  return nullptr;
}

std::size_t moe_workspace_bytes(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens) {
  return layout(w, p, max_tokens, [](auto...) {});
}

void moe_forward(const MoeDeviceWeights& w, const MoeParams& p, const MoeRun& run, void* workspace,
                 std::size_t workspace_bytes, int max_tokens, cudaStream_t stream) {
  if (const char* reason = moe_decode_unsupported_reason(w, p)) {
    fail(ErrorCode::kUnsupported, "CUDA MoE decode tactic: ", reason);
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
      MXQ_CUDA_CHECK(cudaEventRecord(run.phase_events[phase], stream));
  };
  mark(0);
  const Workspace ws = carve(w, p, max_tokens, workspace);
  const int pairs = run.tokens * p.top_k;

  const int* ids = run.topk_ids;
  const float* weights = run.topk_weights;
  if (ids == nullptr) {
    const std::size_t smem = (static_cast<std::size_t>(w.hidden) + w.num_global_experts) * 4;
    if (smem > 48 * 1024) {
      MXQ_CUDA_CHECK(cudaFuncSetAttribute(
          router_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    router_topk_kernel<<<run.tokens, 256, smem, stream>>>(run.x, w.router_w, w.router_b, w.hidden,
                                                          w.num_global_experts, p.top_k,
                                                          ws.topk_ids, ws.topk_w);
    MXQ_CUDA_CHECK_LAUNCH();
    ids = ws.topk_ids;
    weights = ws.topk_w;
  }
  const std::size_t lists_smem = (3 * static_cast<std::size_t>(w.num_local_experts) + 2) * 4;
  build_lists_kernel<<<1, 256, lists_smem, stream>>>(ids, pairs, w.first_local_expert,
                                                     w.num_local_experts, ws);
  MXQ_CUDA_CHECK_LAUNCH();

  mark(1);
  const int max_tiles = max_tiles_for(pairs, w.num_local_experts);
  const GemmArgs args{w, p, run.x, p.top_k, ws};
  const std::size_t smem1 = gemm_smem_bytes(w.hidden);
  MXQ_CUDA_CHECK(cudaFuncSetAttribute(
      gemm1_swiglu_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem1)));
  gemm1_swiglu_kernel<<<dim3(w.inter / kTileRows, max_tiles), kGemmWarps * 32, smem1, stream>>>(
      args);
  MXQ_CUDA_CHECK_LAUNCH();
  mark(2);
  const std::size_t smem2 = gemm_smem_bytes(w.inter);
  MXQ_CUDA_CHECK(cudaFuncSetAttribute(gemm2_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem2)));
  gemm2_kernel<<<dim3(w.hidden / kTileRows, max_tiles), kGemmWarps * 32, smem2, stream>>>(args);
  MXQ_CUDA_CHECK_LAUNCH();
  mark(3);
  combine_kernel<<<dim3((w.hidden + 255) / 256, run.tokens), 256, 0, stream>>>(
      ws.y, ws.pair_slot, weights, p.top_k, w.hidden, run.out_f32, run.out_bf16);
  MXQ_CUDA_CHECK_LAUNCH();
  mark(4);
}

std::size_t moe_expert_weight_bytes(const MoeDeviceWeights& w) {
  const std::size_t h = static_cast<std::size_t>(w.hidden);
  const std::size_t i = static_cast<std::size_t>(w.inter);
  const std::size_t w13 = 2 * i * (h / 2 + h / 32) + (w.b13 != nullptr ? 2 * i * 2 : 0);
  const std::size_t w2 = h * (i / 2 + i / 32) + (w.b2 != nullptr ? h * 2 : 0);
  return w13 + w2;
}

}  // namespace mxq::moe::cuda
