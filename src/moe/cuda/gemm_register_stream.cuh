// The register-streaming grouped GEMMs of the MoE forward (GemmVariant::kDecodeMma), for
// decode: W4A16 and W4A8.
//
// GEMM kernels: one block = 4 warps splitting K over one tile of <= 8 tokens of one expert and
// 32 weight rows (GEMM1: the gate and up rows of 16 channels; GEMM2: 32 rows of w2), as two
// m16n8k16 bf16 mma tiles sharing their activation operand. Lane (r = lane/4, c = lane%4) streams
// 16-byte chunks (one MXFP4 block of 32 values) of rows r and r+8 of each tile and decodes them a
// 32-bit word at a time (mxfp4_mma.cuh, weights in the device layout of mxfp4_device_layout.h,
// each tile one row group of row_groups.h, so a warp's 8 rows of a chunk are 512 contiguous bytes);
// the mma's k order is permuted consistently on both operands, so every lane decodes only bytes
// of its own MX block and applies one scale per block, and reads its token's activations with the
// same map.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "block_trace.cuh"
#include "cuda_common/pdl.cuh"
#include "gemm_common.cuh"
#include "moe/layout/row_groups.h"
#include "moe/layout/w4a8_layout.h"
#include "mxfp4_mma.cuh"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "w4a8_mma.cuh"
#include "workspace.cuh"

namespace mxq::moe::gpu::detail {

constexpr int kTileRows = 16;  // mma m
constexpr int kGemmWarps = 4;  // split-K warps per block
constexpr int kChunk = 128;    // K elements per lane-quad per iteration (4 MX blocks)
// Streaming GEMM blocks resident per SM: caps them at 128 registers (two chunks of weights,
// scales and activations per lane fit without spilling in the loop).
constexpr int kStreamBlocksPerSm = 4;

// ---- 3/4. grouped GEMMs ---------------------------------------------------------------------
// What one lane streams per 128-wide K chunk: its MX block of rows r and r+8 of every weight
// tile (GEMM1: gate and up) with their scales, and the matching 32 activations of its token in
// each of kNT token tiles (B operands) — all loaded one chunk ahead of use.
// The weights and scales alone are a WeightRegs: the rolling stream (stream_chunks_rolling) keeps
// two of those and one set of activations.
template <int kAcc>
struct WeightRegs {
  uint4 w[kAcc][2];
  std::uint32_t scale[kAcc][2];
};
template <int kAcc, int kNT = 1>
struct ChunkRegs : WeightRegs<kAcc> {
  uint4 x[kNT][4];
};

// The weights of a GEMM block's tiles: each tile's row group (row_groups.h: its 16 rows, chunk-
// major) and the E8M0 scale rows of this lane's rows r and r + 8.
template <int kAcc>
struct TileRows {
  const std::uint8_t* group[kAcc];
  const std::uint8_t* scale[kAcc][2];
};

// One chunk's tensor-core work (acc[a * kNT + n]: weight tile a, token tile n); scales above 2
// (E8M0 129..254) take the two-multiply decode.
template <int kAcc, int kNT, class AfterWord = NoWordHook>
__device__ __forceinline__ void mma_chunk(const WeightRegs<kAcc>& weights, const uint4 (&x)[kNT][4],
                                          float (&acc)[kAcc * kNT][4], AfterWord after_word = {}) {
  if (warp_any_wide_scale(weights.scale)) {
    mma_mx_chunk<kAcc, true, kNT>(weights.w, weights.scale, x, acc, after_word);
  } else {
    mma_mx_chunk<kAcc, false, kNT>(weights.w, weights.scale, x, acc, after_word);
  }
}
template <int kAcc, int kNT>
__device__ __forceinline__ void mma_chunk(const ChunkRegs<kAcc, kNT>& regs,
                                          float (&acc)[kAcc * kNT][4]) {
  mma_chunk<kAcc, kNT>(regs, regs.x, acc);
}

// What a W4A16 lane streams (for stream_chunks): 128-wide chunks of K = k_total, MX block c of
// rows r and r + 8 of every tile with their scales, and the matching 32 activations of its token.
// The last chunk is short when k_total is not a multiple of 128: its blocks past K read as zero
// weights and activations and scale 1.0, and its rows lie short_row_bytes apart in the group (the
// weight rows' K, for GEMM2 the padded P, decides how many blocks the stored chunk holds).
template <int kAcc, int kNT = 1>
struct Bf16Stream {
  using Regs = ChunkRegs<kAcc, kNT>;
  TileRows<kAcc> tiles;
  const std::uint16_t* brow;  // this lane's token's activations (token tile 0)
  int k_total;
  int short_row_bytes;
  int r;
  int c;                                 // lane % 4: the MX block of each chunk this lane takes
  const std::uint16_t* brow2 = nullptr;  // its token's in token tile 1 (kNT == 2)

  __device__ __forceinline__ int full_chunks() const { return k_total / kChunk; }
  __device__ __forceinline__ bool has_short_chunk() const { return k_total % kChunk != 0; }
  template <bool kInside>
  __device__ __forceinline__ void load_weights(int chunk, WeightRegs<kAcc>& regs) const {
    const int k0 = chunk * kChunk + 32 * c;
    const bool load = kInside || k0 < k_total;
    const int row_bytes = kInside ? kChunkBytes : short_row_bytes;
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const std::uint8_t* at = tiles.group[a] + chunk * kGroupChunkBytes + r * row_bytes + 16 * c;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        regs.w[a][h] = load ? load_stream_16(at + 8 * h * row_bytes) : make_uint4(0, 0, 0, 0);
        regs.scale[a][h] = load ? __ldg(tiles.scale[a][h] + k0 / 32) : 127U;
      }
    }
  }
  // Activation vector i (elements 8i .. 8i + 7 of the lane's 32) of every token tile.
  template <bool kInside>
  __device__ __forceinline__ void load_x(int chunk, int i, uint4 (&x)[kNT][4]) const {
    const int k0 = chunk * kChunk + 32 * c;
    const bool load = kInside || k0 < k_total;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const std::uint16_t* row = n == 0 ? brow : brow2;
      x[n][i] = load ? __ldg(reinterpret_cast<const uint4*>(row + k0) + i) : make_uint4(0, 0, 0, 0);
    }
  }
  template <bool kInside>
  __device__ __forceinline__ void load(int chunk, Regs& regs) const {
    load_weights<kInside>(chunk, regs);
#pragma unroll
    for (int i = 0; i < 4; ++i) load_x<kInside>(chunk, i, regs.x);
  }
  __device__ __forceinline__ void compute(const Regs& regs, float (&acc)[kAcc * kNT][4]) const {
    mma_chunk(regs, acc);
  }
  // The rolling stream: chunk `regs` with the activations `x`, each vector of x replaced by
  // chunk `next`'s once its word's mma are issued (next < 0: none).
  __device__ __forceinline__ void compute_rolling(const WeightRegs<kAcc>& regs, uint4 (&x)[kNT][4],
                                                  float (&acc)[kAcc * kNT][4], int next) const {
    mma_chunk<kAcc, kNT>(regs, x, acc, [&](int j) {
      if (next >= 0) load_x<true>(next, j, x);
    });
  }
};

// What a W4A8 lane streams: weights and activations in the layouts of w4a8_layout.h (a tile's
// 16 rows are one row group, chunk-major). Every chunk is one activation group; a short last
// chunk (the weight rows' K not a multiple of 128) holds `short_blocks` MX blocks, of which each
// lane loads its words one by one.
template <int kAcc>
struct W4a8Stream {
  using Regs = W4a8ChunkRegs<kAcc>;
  TileRows<kAcc> tiles;
  const std::uint8_t* xrow;  // this lane's token's E4M3 row
  const float* xs_row[2];    // the group scales of accumulator columns 2c and 2c + 1
  int full;                  // chunks of 4 MX blocks
  int short_blocks;          // MX blocks of the short chunk after them (0: none)
  int r;                     // lane / 4: rows r and r + 8 of each tile
  int c;

  __device__ __forceinline__ int full_chunks() const { return full; }
  __device__ __forceinline__ bool has_short_chunk() const { return short_blocks > 0; }
  template <bool kInside>
  __device__ __forceinline__ void load(int chunk, Regs& regs) const {
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::uint8_t* at = tiles.group[a] + chunk * kGroupChunkBytes;
        if constexpr (kInside) {
          regs.w[a][h] = load_stream_16(at + (r + 8 * h) * kChunkBytes + 16 * c);
        } else {
          const auto* words =
              reinterpret_cast<const std::uint32_t*>(at + (r + 8 * h) * short_blocks * 16) +
              c * short_blocks;
          std::uint32_t v[4];
#pragma unroll
          for (int b = 0; b < 4; ++b) v[b] = b < short_blocks ? __ldg(words + b) : 0U;
          regs.w[a][h] = make_uint4(v[0], v[1], v[2], v[3]);
        }
        regs.scale[a][h] = load_chunk_scales(tiles.scale[a][h], chunk);
      }
    }
    const auto* x = reinterpret_cast<const uint4*>(xrow + chunk * kChunk + 32 * c);
    regs.x[0] = __ldg(x);
    regs.x[1] = __ldg(x + 1);
    regs.xs[0] = __ldg(xs_row[0] + chunk);
    regs.xs[1] = __ldg(xs_row[1] + chunk);
  }
  __device__ __forceinline__ void compute(const Regs& regs, float (&acc)[kAcc][4]) const {
    w4a8_mma_chunk(regs, acc);
  }
};

// Streams the chunks of `s` (rows r and r+8 of every tile), this warp taking chunks warp,
// warp + 4, ...; loads run one chunk ahead of the tensor-core work, in two register sets used in
// turn (a plain `cur = next` costs a move per register per chunk). Full chunks load without
// predicates; the short last chunk comes after the loop, by the warp whose turn it is (the order
// of its sum as if it were in the loop).
template <class Stream, int kAcc>
__device__ __forceinline__ void stream_chunks(const Stream& s, int warp, float (&acc)[kAcc][4]) {
  const int full_chunks = s.full_chunks();
  typename Stream::Regs even;
  typename Stream::Regs odd;
  int chunk = warp;
  if (chunk < full_chunks) {
    s.template load<true>(chunk, even);
    for (;; chunk += 2 * kGemmWarps) {
      if (chunk + kGemmWarps < full_chunks) s.template load<true>(chunk + kGemmWarps, odd);
      s.compute(even, acc);
      if (chunk + kGemmWarps >= full_chunks) break;
      if (chunk + 2 * kGemmWarps < full_chunks) s.template load<true>(chunk + 2 * kGemmWarps, even);
      s.compute(odd, acc);
      if (chunk + 2 * kGemmWarps >= full_chunks) break;
    }
  }
  if (s.has_short_chunk() && warp == full_chunks % kGemmWarps) {
    s.template load<false>(full_chunks, even);
    s.compute(even, acc);
  }
}

// stream_chunks for the 16-slot kernels (Bf16Stream with two token tiles): the weights and scales
// run one chunk ahead in two register sets as there, the activations of both token tiles in one
// set, each vector reloaded with the next chunk's as soon as its word is multiplied (as far ahead
// of its use as a second set would load it). Two sets of 32 activation registers did not fit
// 4 blocks an SM (128 registers); at 3 blocks an SM these kernels ran 2-4% slower (H100).
template <int kAcc, int kNT>
__device__ __forceinline__ void stream_chunks_rolling(const Bf16Stream<kAcc, kNT>& s, int warp,
                                                      float (&acc)[kAcc * kNT][4]) {
  const int full_chunks = s.full_chunks();
  WeightRegs<kAcc> even;
  WeightRegs<kAcc> odd;
  uint4 x[kNT][4];
  int chunk = warp;
  if (chunk < full_chunks) {
    s.template load_weights<true>(chunk, even);
#pragma unroll
    for (int i = 0; i < 4; ++i) s.template load_x<true>(chunk, i, x);
    for (;; chunk += 2 * kGemmWarps) {
      const int next = chunk + kGemmWarps < full_chunks ? chunk + kGemmWarps : -1;
      if (next >= 0) s.template load_weights<true>(next, odd);
      s.compute_rolling(even, x, acc, next);
      if (next < 0) break;
      const int after = chunk + 2 * kGemmWarps < full_chunks ? chunk + 2 * kGemmWarps : -1;
      if (after >= 0) s.template load_weights<true>(after, even);
      s.compute_rolling(odd, x, acc, after);
      if (after < 0) break;
    }
  }
  if (s.has_short_chunk() && warp == full_chunks % kGemmWarps) {
    s.template load_weights<false>(full_chunks, even);
#pragma unroll
    for (int i = 0; i < 4; ++i) s.template load_x<false>(full_chunks, i, x);
    s.compute_rolling(even, x, acc, -1);
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

// The W4A8 stream of a GEMM block: its tiles, its token columns' E4M3 rows and group scales.
// `row_of(col)` gives the activation row (token or slot) of tile column col.
template <int kAcc, typename RowOf>
__device__ __forceinline__ W4a8Stream<kAcc> w4a8_stream(const TileRows<kAcc>& tiles,
                                                        const std::uint8_t* fp8,
                                                        const float* scales, int k_act,
                                                        int k_stream, int n, int rows, int r, int c,
                                                        RowOf row_of) {
  W4a8Stream<kAcc> s;
  s.tiles = tiles;
  const std::size_t pitch = w4a8_act_pitch(k_act);
  const std::size_t groups = w4a8_act_groups(k_act);
  s.xrow = fp8 + static_cast<std::size_t>(row_of(n)) * pitch;
  for (int j = 0; j < 2; ++j)
    s.xs_row[j] = scales + static_cast<std::size_t>(row_of(min(2 * c + j, rows - 1))) * groups;
  s.full = k_stream / kChunk;
  s.short_blocks = (k_stream % kChunk) / 32;
  s.r = r;
  s.c = c;
  return s;
}

// GEMM1's tiles at channel ch0 of an expert: its 16 gate rows and the 16 up rows P below them,
// and the scale rows of this lane's rows r and r + 8 of each.
__device__ __forceinline__ TileRows<2> gemm1_tiles(const GemmArgs& args, int expert, int ch0,
                                                   int r) {
  const std::size_t row_bytes = args.w.hidden / 2;
  const std::size_t scale_row = moe_scale_pitch(args.w.hidden);
  const std::size_t gate0 = static_cast<std::size_t>(expert) * 2 * args.w.inter_padded + ch0;
  const std::size_t up0 = gate0 + args.w.inter_padded;
  TileRows<2> tiles;
  tiles.group[0] = args.w.w13 + gate0 * row_bytes;
  tiles.group[1] = args.w.w13 + up0 * row_bytes;
  for (int h = 0; h < 2; ++h) {
    tiles.scale[0][h] = args.w.w13_scale + (gate0 + r + 8 * h) * scale_row;
    tiles.scale[1][h] = args.w.w13_scale + (up0 + r + 8 * h) * scale_row;
  }
  return tiles;
}

// The gate bias of GEMM1's tile at channel ch0 (its up biases lie P further), or null.
__device__ __forceinline__ const std::uint16_t* gemm1_tile_biases(const GemmArgs& args, int expert,
                                                                  int ch0) {
  if (args.w.b13 == nullptr) return nullptr;
  return args.w.b13 + static_cast<std::size_t>(expert) * 2 * args.w.inter_padded + ch0;
}

// kNT token tiles of 8 slots (decode work tiles of 8 * kNT slots, tile_cut_for): the slot of B
// column `col` of the block's tile; columns past the tile's rows repeat its last slot (their sums
// are never stored), so the activation loads need no predicate.
__device__ __forceinline__ int stream_column(int col, int rows) { return min(col, rows - 1); }

template <bool kW4a8, int kNT>
__global__ void __launch_bounds__(kGemmWarps * 32, kStreamBlocksPerSm)
    gemm1_swiglu_kernel(GemmArgs args) {
  static_assert(kNT == 1 || !kW4a8, "W4A8's decode GEMMs take 8-slot tiles");
  trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kStart);
  ptx::wait_for_predecessor();
  trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kReleased);
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  __shared__ float red[(kGemmWarps - 1) * 2 * kNT * 4 * 32];
  const auto [expert, slot0, rows] = read_work_tile(args.ws, tile);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int n = stream_column(lane / 4, rows);  // this lane's B column of token tile 0
  const int hidden = args.w.hidden;
  const auto token_of = [&](int col) { return args.ws.slot_pair[slot0 + col] / args.top_k; };

  const int ch0 = blockIdx.x * kTileRows;
  const int r = lane / 4;
  const int c = lane % 4;
  const TileRows<2> tiles = gemm1_tiles(args, expert, ch0, r);
  __shared__ BlockBiases biases;
  if (warp == 0) biases.start(gemm1_tile_biases(args, expert, ch0), args.w.inter_padded, lane);
  float acc[2 * kNT][4] = {};  // [gate, up][token tile]
  if constexpr (kW4a8) {
    stream_chunks(w4a8_stream<2>(tiles, args.ws.x_fp8, args.ws.x_scale, hidden, hidden, n, rows, r,
                                 c, token_of),
                  warp, acc);
  } else {
    Bf16Stream<2, kNT> s{tiles,  args.x + static_cast<std::size_t>(token_of(n)) * hidden,
                         hidden, 16 * chunk_blocks(hidden, hidden / kChunk),
                         r,      c};
    if constexpr (kNT == 2) {
      s.brow2 = args.x + static_cast<std::size_t>(token_of(stream_column(8 + r, rows))) * hidden;
      stream_chunks_rolling(s, warp, acc);
    } else {
      stream_chunks(s, warp, acc);
    }
  }
  trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kMid);
  ptx::allow_dependents();
  BlockBiases::finish();
  reduce_warps<2 * kNT>(acc, red, warp, lane);
  if (warp != 0) return;

#pragma unroll
  for (int t = 0; t < kNT; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 8 * t + 2 * c + (i & 1);
      const int m = r + (i >= 2 ? 8 : 0);  // the channel in the block
      if (col < rows)
        store_gemm1(args, {biases.at(m), biases.at(16 + m)}, ch0 + m, slot0 + col, acc[t][i],
                    acc[kNT + t][i]);
    }
  }
  trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kEnd);
}

// GEMM2 takes 32 rows of w2 per block, as two m16 tiles sharing the activations each lane loads
// and pairs (the B operand): half the activation loads and pairings per weight byte of one tile.
constexpr int kGemm2Tiles = 2;
static_assert(BlockBiases::kRows == kGemm2Tiles * kTileRows, "GEMM2: a block's rows");

template <bool kW4a8, int kNT>
__global__ void __launch_bounds__(kGemmWarps * 32, kStreamBlocksPerSm) gemm2_kernel(GemmArgs args) {
  static_assert(kNT == 1 || !kW4a8, "W4A8's decode GEMMs take 8-slot tiles");
  trace_block(MoeTraceKernel::kGemm2, MoeTracePoint::kStart);
  ptx::wait_for_predecessor();
  trace_block(MoeTraceKernel::kGemm2, MoeTracePoint::kReleased);
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  __shared__ float red[(kGemmWarps - 1) * kGemm2Tiles * kNT * 4 * 32];
  const auto [expert, slot0, rows] = read_work_tile(args.ws, tile);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int n = stream_column(lane / 4, rows);  // this lane's B column of token tile 0
  const int inter = args.w.inter;

  const int h0 = blockIdx.x * kTileRows * kGemm2Tiles;
  const int r = lane / 4;
  const int c = lane % 4;
  const int padded = args.w.inter_padded;
  const std::size_t row_bytes = padded / 2;
  const std::size_t scale_row = moe_scale_pitch(padded);
  const std::size_t base_row = static_cast<std::size_t>(expert) * args.w.hidden;
  TileRows<kGemm2Tiles> tiles;
  for (int a = 0; a < kGemm2Tiles; ++a) {
    const std::size_t first = base_row + h0 + kTileRows * a;
    tiles.group[a] = args.w.w2 + first * row_bytes;
    for (int h = 0; h < 2; ++h)
      tiles.scale[a][h] = args.w.w2_scale + (first + r + 8 * h) * scale_row;
  }
  __shared__ BlockBiases biases;
  if (warp == 0) {
    const bool add_bias = args.w.b2 != nullptr && args.p.add_down_bias;
    biases.start(add_bias ? args.w.b2 + base_row + h0 : nullptr, kTileRows, lane);
  }
  float acc[kGemm2Tiles * kNT][4] = {};  // [weight tile][token tile]
  if constexpr (kW4a8) {
    // The chunks that hold valid channels, as the padded rows store them (a chunk of padding
    // reads zero activations).
    const int k_stream = min(padded, w4a8_act_pitch(inter));
    stream_chunks(
        w4a8_stream<kGemm2Tiles>(tiles, args.ws.act_fp8, args.ws.act_scale, inter, k_stream, n,
                                 rows, r, c, [&](int col) { return slot0 + col; }),
        warp, acc);
  } else {
    // The rows hold P values: a short chunk of the I streamed may be a full one as stored.
    const auto* act = reinterpret_cast<const std::uint16_t*>(args.ws.act);
    Bf16Stream<kGemm2Tiles, kNT> s{tiles, act + static_cast<std::size_t>(slot0 + n) * inter,
                                   inter, 16 * chunk_blocks(padded, inter / kChunk),
                                   r,     c};
    if constexpr (kNT == 2) {
      s.brow2 = act + static_cast<std::size_t>(slot0 + stream_column(8 + r, rows)) * inter;
      stream_chunks_rolling(s, warp, acc);
    } else {
      stream_chunks(s, warp, acc);
    }
  }
  trace_block(MoeTraceKernel::kGemm2, MoeTracePoint::kMid);
  ptx::allow_dependents();
  BlockBiases::finish();
  reduce_warps<kGemm2Tiles * kNT>(acc, red, warp, lane);
  if (warp != 0) return;

#pragma unroll
  for (int a = 0; a < kGemm2Tiles; ++a) {
#pragma unroll
    for (int t = 0; t < kNT; ++t) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = 8 * t + 2 * c + (i & 1);
        const int m = kTileRows * a + r + (i >= 2 ? 8 : 0);  // the row in the block
        if (col < rows) store_gemm2(args, biases.at(m), h0 + m, slot0 + col, acc[a * kNT + t][i]);
      }
    }
  }
  trace_block(MoeTraceKernel::kGemm2, MoeTracePoint::kEnd);
}

}  // namespace mxq::moe::gpu::detail
