// The decode-regime MXFP4 MoE forward: see include/mxq/moe/cuda_moe.h for the pipeline.
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
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <vector>

#include "block_trace.cuh"
#include "bulk_copy.cuh"
#include "cuda/tensor_map.h"
#include "gemm_common.cuh"
#include "gemm_wgmma.cuh"
#include "gemm_wide.cuh"
#include "mxfp4_mma.cuh"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/formats/fp8_block_scale.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "pdl.cuh"
#include "routing.cuh"
#include "row_groups.h"
#include "w4a8_layout.h"
#include "w4a8_mma.cuh"
#include "workspace.cuh"

namespace mxq::moe::cuda {
namespace {

constexpr int kTileRows = 16;  // mma m
constexpr int kGemmWarps = 4;  // split-K warps per block
constexpr int kChunk = 128;    // K elements per lane-quad per iteration (4 MX blocks)
// Streaming GEMM blocks resident per SM: caps them at 128 registers (two chunks of weights,
// scales and activations per lane fit without spilling in the loop).
constexpr int kStreamBlocksPerSm = 4;

bool w4a8(const MoeParams& p) { return p.activation_quant == GpuActivationQuant::kFp8Group128; }

using detail::allow_dependents;
using detail::GemmArgs;
using detail::launch;
using detail::wait_for_predecessor;
using detail::Workspace;

// ---- 3/4. grouped GEMMs ---------------------------------------------------------------------
// What one lane streams per 128-wide K chunk: its MX block of rows r and r+8 of every
// accumulator set (GEMM1: gate and up) with their scales, and the matching 32 activations of its
// token (B operand) — all loaded one chunk ahead of use.
template <int kAcc>
struct ChunkRegs {
  uint4 w[kAcc][2];
  std::uint32_t scale[kAcc][2];
  uint4 x[4];
};

// The weights of a GEMM block's tiles: each tile's row group (row_groups.h: its 16 rows, chunk-
// major) and the E8M0 scale rows of this lane's rows r and r + 8.
template <int kAcc>
struct TileRows {
  const std::uint8_t* group[kAcc];
  const std::uint8_t* scale[kAcc][2];
};

// One chunk's tensor-core work; scales above 2 (E8M0 129..254) take the two-multiply decode.
template <int kAcc>
__device__ __forceinline__ void mma_chunk(const ChunkRegs<kAcc>& regs, float (&acc)[kAcc][4]) {
  if (detail::warp_any_wide_scale(regs.scale)) {
    detail::mma_mx_chunk<kAcc, true>(regs.w, regs.scale, regs.x, acc);
  } else {
    detail::mma_mx_chunk<kAcc, false>(regs.w, regs.scale, regs.x, acc);
  }
}

// What a W4A16 lane streams (for stream_chunks): 128-wide chunks of K = k_total, MX block c of
// rows r and r + 8 of every tile with their scales, and the matching 32 activations of its token.
// The last chunk is short when k_total is not a multiple of 128: its blocks past K read as zero
// weights and activations and scale 1.0, and its rows lie short_row_bytes apart in the group (the
// weight rows' K, for GEMM2 the padded P, decides how many blocks the stored chunk holds).
template <int kAcc>
struct Bf16Stream {
  using Regs = ChunkRegs<kAcc>;
  TileRows<kAcc> tiles;
  const std::uint16_t* brow;  // this lane's token's activations
  int k_total;
  int short_row_bytes;
  int r;
  int c;  // lane % 4: the MX block of each chunk this lane takes

  __device__ __forceinline__ int full_chunks() const { return k_total / kChunk; }
  __device__ __forceinline__ bool has_short_chunk() const { return k_total % kChunk != 0; }
  template <bool kInside>
  __device__ __forceinline__ void load(int chunk, Regs& regs) const {
    const int k0 = chunk * kChunk + 32 * c;
    const bool load = kInside || k0 < k_total;
    const int row_bytes = kInside ? detail::kChunkBytes : short_row_bytes;
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const std::uint8_t* at =
          tiles.group[a] + chunk * detail::kGroupChunkBytes + r * row_bytes + 16 * c;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        regs.w[a][h] =
            load ? detail::load_stream_16(at + 8 * h * row_bytes) : make_uint4(0, 0, 0, 0);
        regs.scale[a][h] = load ? __ldg(tiles.scale[a][h] + k0 / 32) : 127U;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      regs.x[i] =
          load ? __ldg(reinterpret_cast<const uint4*>(brow + k0) + i) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ __forceinline__ void compute(const Regs& regs, float (&acc)[kAcc][4]) const {
    mma_chunk(regs, acc);
  }
};

// What a W4A8 lane streams: weights and activations in the layouts of w4a8_layout.h (a tile's
// 16 rows are one row group, chunk-major). Every chunk is one activation group; a short last
// chunk (the weight rows' K not a multiple of 128) holds `short_blocks` MX blocks, of which each
// lane loads its words one by one.
template <int kAcc>
struct W4a8Stream {
  using Regs = detail::W4a8ChunkRegs<kAcc>;
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
        const std::uint8_t* at = tiles.group[a] + chunk * detail::kGroupChunkBytes;
        if constexpr (kInside) {
          regs.w[a][h] = detail::load_stream_16(at + (r + 8 * h) * detail::kChunkBytes + 16 * c);
        } else {
          const auto* words =
              reinterpret_cast<const std::uint32_t*>(at + (r + 8 * h) * short_blocks * 16) +
              c * short_blocks;
          std::uint32_t v[4];
#pragma unroll
          for (int b = 0; b < 4; ++b) v[b] = b < short_blocks ? __ldg(words + b) : 0U;
          regs.w[a][h] = make_uint4(v[0], v[1], v[2], v[3]);
        }
        regs.scale[a][h] = detail::load_chunk_scales(tiles.scale[a][h], chunk);
      }
    }
    const auto* x = reinterpret_cast<const uint4*>(xrow + chunk * kChunk + 32 * c);
    regs.x[0] = __ldg(x);
    regs.x[1] = __ldg(x + 1);
    regs.xs[0] = __ldg(xs_row[0] + chunk);
    regs.xs[1] = __ldg(xs_row[1] + chunk);
  }
  __device__ __forceinline__ void compute(const Regs& regs, float (&acc)[kAcc][4]) const {
    detail::w4a8_mma_chunk(regs, acc);
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
  const std::size_t pitch = detail::w4a8_act_pitch(k_act);
  const std::size_t groups = detail::w4a8_act_groups(k_act);
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

template <bool kW4a8>
__global__ void __launch_bounds__(kGemmWarps * 32, kStreamBlocksPerSm)
    gemm1_swiglu_kernel(GemmArgs args) {
  detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kStart);
  wait_for_predecessor();
  detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kReleased);
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  __shared__ float red[(kGemmWarps - 1) * 2 * 4 * 32];
  const auto [expert, slot0, rows] = detail::read_work_tile(args.ws, tile);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // This lane's token column of the B operand; columns past the tile's rows repeat its last row
  // (their accumulators are never stored), so the activation loads need no predicate.
  const int n = min(lane / 4, rows - 1);
  const int hidden = args.w.hidden;
  const auto token_of = [&](int col) { return args.ws.slot_pair[slot0 + col] / args.top_k; };

  const int ch0 = blockIdx.x * kTileRows;
  const int r = lane / 4;
  const int c = lane % 4;
  const TileRows<2> tiles = gemm1_tiles(args, expert, ch0, r);
  __shared__ detail::BlockBiases biases;
  if (warp == 0) biases.start(gemm1_tile_biases(args, expert, ch0), args.w.inter_padded, lane);
  float acc[2][4] = {};
  if constexpr (kW4a8) {
    stream_chunks(w4a8_stream<2>(tiles, args.ws.x_fp8, args.ws.x_scale, hidden, hidden, n, rows, r,
                                 c, token_of),
                  warp, acc);
  } else {
    const Bf16Stream<2> s{tiles,  args.x + static_cast<std::size_t>(token_of(n)) * hidden,
                          hidden, 16 * detail::chunk_blocks(hidden, hidden / kChunk),
                          r,      c};
    stream_chunks(s, warp, acc);
  }
  detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kMid);
  allow_dependents();
  detail::BlockBiases::finish();
  reduce_warps<2>(acc, red, warp, lane);
  if (warp != 0) return;

  for (int i = 0; i < 4; ++i) {
    const int col = 2 * c + (i & 1);
    const int m = r + (i >= 2 ? 8 : 0);  // the channel in the block
    if (col < rows)
      detail::store_gemm1(args, {biases.at(m), biases.at(16 + m)}, ch0 + m, slot0 + col, acc[0][i],
                          acc[1][i]);
  }
  detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kEnd);
}

// ---- 3 (one token). GEMM1 with the token's top-k, the work split evenly over one wave --------
// One token routed on the device (GemmArgs::single_token, W4A16): the routing kernel wrote only
// the logits, and every GEMM1 block takes the token's top-k itself, in its first warp. (The
// routing kernel's ticket and its last block's top-k and lists were ~4 µs of serial work before
// any weight moved at T = 1; docs/PERF.md.) The tiles are the chosen local experts in increasing
// id order, one slot each — the lists the routing kernel would have built —, here in shared
// memory; block 0 also writes them, the ids and the weights to the workspace for GEMM2, the
// combine kernel and moe_routing_view. Returns the number of tiles. One key width for every
// router up to 256 experts (moe_forward checks it): keys past the width are out of the choice, and
// one copy of the top-k keeps the kernel small.
constexpr int kSingleTokenKeysPerLane = 8;
constexpr int kSingleTokenMaxRouterExperts = 32 * kSingleTokenKeysPerLane;
__device__ __forceinline__ int route_single_token(const GemmArgs& args, int* tile_expert) {
  __shared__ int tiles;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int k = args.top_k;
    int id = -1;
    float weight = 0.0F;
    detail::warp_row_topk<kSingleTokenKeysPerLane>(args.ws.logits, args.w.num_global_experts, k,
                                                   lane, id, weight);
    const int e = id - args.w.first_local_expert;
    const bool local = lane < k && e >= 0 && e < args.w.num_local_experts;
    const unsigned local_lanes = __ballot_sync(0xFFFFFFFFU, local);
    int tile = 0;  // local choices with a lower expert id (the ids are distinct)
    for (int j = 0; j < k; ++j) {
      const int other = __shfl_sync(0xFFFFFFFFU, e, j);
      tile += ((local_lanes >> j) & 1U) != 0U && other < e ? 1 : 0;
    }
    if (local) tile_expert[tile] = e;
    if (lane == 0) tiles = __popc(local_lanes);
    if (blockIdx.x == 0 && lane < k) {
      const Workspace& ws = args.ws;
      ws.topk_ids[lane] = id;
      ws.topk_w[lane] = weight;
      ws.pair_slot[lane] = local ? tile : -1;
      if (local) {
        ws.slot_pair[tile] = lane;
        ws.tile_expert[tile] = e;
        ws.tile_slot0[tile] = tile;
        ws.tile_rows[tile] = 1;
      }
      if (lane == 0) *ws.num_tiles = __popc(local_lanes);
    }
  }
  __syncthreads();
  return tiles;
}

// At T = 1 the 16-channel tiles of the chosen experts (gpt-oss-120b: 4 x 180) do not fill whole
// waves of resident blocks (528 on 132 SMs), and a partial second wave streams at a fraction of
// the bandwidth (docs/PERF.md). Here the grid is one wave (more when the tiles exceed two), and
// the tiles' 128-wide K chunks, in (tile, chunk) order, are cut into one contiguous range per
// block (stream-K): ranges differ by at most one chunk, each is at least one tile long (no more
// blocks than tiles) and at most two (no fewer than half the tiles), so a range meets at most
// three tiles (its pieces) and a tile is shared by at most two blocks — one ending in it (part
// 0), the next starting in it (part 1).
//
// A block's warps stream its range as one sequence (warp w takes positions w, w + 4, ..., its
// loads one position ahead across the pieces' borders: a border costs no refill), writing their
// sums to shared memory as they leave a piece; then warp p sums piece p in warp order and runs
// its epilogue. The two parts of a shared tile write their 32 sums to the workspace; the second to
// arrive at the boundary's counter adds them, part 0 first (the same sum in every replay), returns
// the counter to zero and runs the epilogue.
constexpr int kMaxPieces = 3;
static_assert(kMaxPieces <= kGemmWarps, "one warp per piece's epilogue");

// A piece of a block's range: its tile's row groups (gate, up), the scale rows of the tile's
// first gate and up rows, and which of the block's positions it holds.
struct SingleTokenPiece {
  const std::uint8_t* group[2];
  const std::uint8_t* scale[2];
  int tile;
  int chunk_offset;  // K chunk of position q: q + chunk_offset
  int end;           // positions [the previous piece's end, end)
};

// What a lane of the single-token GEMM1 streams: position q of its block's range, from the piece
// that holds it (in shared memory; three pieces at most).
struct SingleTokenStream {
  using Regs = ChunkRegs<2>;
  const SingleTokenPiece* pieces;
  const std::uint16_t* x;  // the token's activations
  int hidden;
  int scale_row;
  int short_row_bytes;
  int r;
  int c;

  __device__ __forceinline__ int piece_of(int q) const {
    return (q >= pieces[0].end ? 1 : 0) + (q >= pieces[1].end ? 1 : 0);
  }
  __device__ __forceinline__ void load(int q, Regs& regs) const {
    const SingleTokenPiece& piece = pieces[piece_of(q)];
    const int chunk = q + piece.chunk_offset;
    Bf16Stream<2> s;
    for (int a = 0; a < 2; ++a) {
      s.tiles.group[a] = piece.group[a];
      for (int h = 0; h < 2; ++h)
        s.tiles.scale[a][h] = piece.scale[a] + static_cast<std::size_t>(r + 8 * h) * scale_row;
    }
    s.brow = x;
    s.k_total = hidden;
    s.short_row_bytes = short_row_bytes;
    s.r = r;
    s.c = c;
    if (chunk < hidden / kChunk) {
      s.template load<true>(chunk, regs);
    } else {
      s.template load<false>(chunk, regs);
    }
  }
};

// The 4 sums of a lane that hold the token's column (lanes c == 0: gate and up of channels r and
// r + 8), per piece and warp, in shared memory.
constexpr int kPieceSums = 4;
using PieceSums = float[kMaxPieces][kGemmWarps][kPieceSums][32];

// Streams this warp's positions of the block's `len`; as it leaves a piece, it stores its sums.
__device__ __forceinline__ void stream_pieces(const SingleTokenStream& s, int len, int warp,
                                              int lane, PieceSums& sums) {
  float acc[2][4] = {};
  int piece = s.piece_of(warp);
  const auto after = [&](int q) {  // the chunk at q is in acc
    const int next = q + kGemmWarps;
    if (next < s.pieces[piece].end) return;
    const float out[kPieceSums] = {acc[0][0], acc[0][2], acc[1][0], acc[1][2]};
    for (int i = 0; i < kPieceSums; ++i) sums[piece][warp][i][lane] = out[i];
    for (auto& row : acc)
      for (float& v : row) v = 0.0F;
    if (next < len) piece = s.piece_of(next);
  };
  SingleTokenStream::Regs even;
  SingleTokenStream::Regs odd;
  int q = warp;
  if (q >= len) return;
  s.load(q, even);
  for (;; q += 2 * kGemmWarps) {
    if (q + kGemmWarps < len) s.load(q + kGemmWarps, odd);
    mma_chunk(even, acc);
    after(q);
    if (q + kGemmWarps >= len) break;
    if (q + 2 * kGemmWarps < len) s.load(q + 2 * kGemmWarps, even);
    mma_chunk(odd, acc);
    after(q + kGemmWarps);
    if (q + 2 * kGemmWarps >= len) break;
  }
}

__global__ void __launch_bounds__(kGemmWarps * 32, kStreamBlocksPerSm)
    gemm1_single_token_kernel(GemmArgs args) {
  detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kStart);
  wait_for_predecessor();
  detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kReleased);
  __shared__ int chosen[detail::kMaxTopK];
  __shared__ SingleTokenPiece pieces[kMaxPieces];
  __shared__ int num_pieces;
  __shared__ PieceSums sums;  // zero where a warp has no position in a piece
  __shared__ detail::BlockBiases biases[kMaxPieces];
  const int row_blocks = args.w.inter / kTileRows;
  const int hidden = args.w.hidden;
  const int chunks = (hidden + kChunk - 1) / kChunk;
  const int tiles = route_single_token(args, chosen) * row_blocks;
  const int blocks = min(static_cast<int>(gridDim.x), tiles);
  // The grid has at least half as many blocks as the tiles of its largest choice
  // (single_token_gemm1_blocks), so a range is at most two tiles long: three pieces at most.
  if (2 * blocks < tiles) __trap();
  if (static_cast<int>(blockIdx.x) >= blocks) return;
  const long long total = static_cast<long long>(tiles) * chunks;
  const int begin = static_cast<int>(total * blockIdx.x / blocks);
  const int len = static_cast<int>(total * (blockIdx.x + 1) / blocks) - begin;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int q = 0; q < len; ++n) {
      const int tile = (begin + q) / chunks;
      const int first = (begin + q) % chunks;
      const int last = min(chunks, first + (len - q));
      const int ch0 = (tile % row_blocks) * kTileRows;
      const TileRows<2> rows = gemm1_tiles(args, chosen[tile / row_blocks], ch0, 0);
      SingleTokenPiece& piece = pieces[n];
      for (int a = 0; a < 2; ++a) {
        piece.group[a] = rows.group[a];
        piece.scale[a] = rows.scale[a][0];
      }
      piece.tile = tile;
      piece.chunk_offset = first - q;
      q += last - first;
      piece.end = q;
    }
    for (int i = n; i < kMaxPieces; ++i) pieces[i].end = len;
    num_pieces = n;
  }
  for (int i = threadIdx.x; i < static_cast<int>(sizeof(sums) / sizeof(float)); i += blockDim.x)
    (&sums[0][0][0][0])[i] = 0.0F;
  __syncthreads();
  if (warp < num_pieces) {
    const int tile = pieces[warp].tile;
    biases[warp].start(
        gemm1_tile_biases(args, chosen[tile / row_blocks], (tile % row_blocks) * kTileRows),
        args.w.inter_padded, lane);
  }
  const SingleTokenStream s{pieces,
                            args.x,
                            hidden,
                            moe_scale_pitch(hidden),
                            16 * detail::chunk_blocks(hidden, hidden / kChunk),
                            lane / 4,
                            lane % 4};
  stream_pieces(s, len, warp, lane, sums);
  detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kMid);
  allow_dependents();
  detail::BlockBiases::finish();
  __syncthreads();
  if (warp >= num_pieces) return;

  // Warp p: piece p. Lanes c == 0 hold the token's column.
  const int piece = warp;
  const int r = lane / 4;
  const int c = lane % 4;
  float out[kPieceSums];
  for (int i = 0; i < kPieceSums; ++i) {
    out[i] = sums[piece][0][i][lane];
    for (int w = 1; w < kGemmWarps; ++w) out[i] += sums[piece][w][i][lane];
  }
  const int tile = pieces[piece].tile;
  const int first = pieces[piece].chunk_offset + (piece == 0 ? 0 : pieces[piece - 1].end);
  const int last = pieces[piece].chunk_offset + pieces[piece].end;
  if (first != 0 || last != chunks) {
    const int part = first == 0 ? 0 : 1;
    const int boundary = static_cast<int>(blockIdx.x) + 1 - part;
    float* partial = args.ws.split_partial + boundary * 2 * detail::kSplitTileSums;
    if (c == 0) {
      for (int i = 0; i < kPieceSums; ++i)
        partial[part * detail::kSplitTileSums + 8 * i + r] = out[i];
    }
    __threadfence();
    __syncwarp();
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(args.ws.split_count + boundary, 1);
    if (__shfl_sync(0xFFFFFFFFU, arrived, 0) == 0) {  // the other part finishes the tile
      detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kEnd);
      return;
    }
    __threadfence();
    if (c == 0) {
      for (int i = 0; i < kPieceSums; ++i) {
        const float other = __ldcg(partial + (1 - part) * detail::kSplitTileSums + 8 * i + r);
        out[i] = part == 0 ? out[i] + other : other + out[i];
      }
    }
    if (lane == 0) args.ws.split_count[boundary] = 0;
  }
  if (c == 0) {
    const int ch0 = (tile % row_blocks) * kTileRows;
    for (int h = 0; h < 2; ++h) {
      const int m = r + 8 * h;  // the channel in the tile
      detail::store_gemm1(args, {biases[piece].at(m), biases[piece].at(16 + m)}, ch0 + m,
                          tile / row_blocks, out[h], out[2 + h]);
    }
  }
  detail::trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kEnd);
}

// GEMM2 takes 32 rows of w2 per block, as two m16 tiles sharing the activations each lane loads
// and pairs (the B operand): half the activation loads and pairings per weight byte of one tile.
constexpr int kGemm2Tiles = 2;
static_assert(detail::BlockBiases::kRows == kGemm2Tiles * kTileRows, "GEMM2: a block's rows");

template <bool kW4a8>
__global__ void __launch_bounds__(kGemmWarps * 32, kStreamBlocksPerSm) gemm2_kernel(GemmArgs args) {
  detail::trace_block(MoeTraceKernel::kGemm2, MoeTracePoint::kStart);
  wait_for_predecessor();
  detail::trace_block(MoeTraceKernel::kGemm2, MoeTracePoint::kReleased);
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  __shared__ float red[(kGemmWarps - 1) * kGemm2Tiles * 4 * 32];
  const auto [expert, slot0, rows] = detail::read_work_tile(args.ws, tile);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int n = min(lane / 4, rows - 1);  // as in GEMM1: past the rows, a repeat of the last
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
  __shared__ detail::BlockBiases biases;
  if (warp == 0) {
    const bool add_bias = args.w.b2 != nullptr && args.p.add_down_bias;
    biases.start(add_bias ? args.w.b2 + base_row + h0 : nullptr, kTileRows, lane);
  }
  float acc[kGemm2Tiles][4] = {};
  if constexpr (kW4a8) {
    // The chunks that hold valid channels, as the padded rows store them (a chunk of padding
    // reads zero activations).
    const int k_stream = min(padded, detail::w4a8_act_pitch(inter));
    stream_chunks(
        w4a8_stream<kGemm2Tiles>(tiles, args.ws.act_fp8, args.ws.act_scale, inter, k_stream, n,
                                 rows, r, c, [&](int col) { return slot0 + col; }),
        warp, acc);
  } else {
    // The rows hold P values: a short chunk of the I streamed may be a full one as stored.
    const Bf16Stream<kGemm2Tiles> s{tiles,
                                    reinterpret_cast<const std::uint16_t*>(args.ws.act) +
                                        static_cast<std::size_t>(slot0 + n) * inter,
                                    inter,
                                    16 * detail::chunk_blocks(padded, inter / kChunk),
                                    r,
                                    c};
    stream_chunks(s, warp, acc);
  }
  detail::trace_block(MoeTraceKernel::kGemm2, MoeTracePoint::kMid);
  allow_dependents();
  detail::BlockBiases::finish();
  reduce_warps<kGemm2Tiles>(acc, red, warp, lane);
  if (warp != 0) return;

  for (int a = 0; a < kGemm2Tiles; ++a) {
    for (int i = 0; i < 4; ++i) {
      const int col = 2 * c + (i & 1);
      const int m = kTileRows * a + r + (i >= 2 ? 8 : 0);  // the row in the block
      if (col < rows) detail::store_gemm2(args, biases.at(m), h0 + m, slot0 + col, acc[a][i]);
    }
  }
  detail::trace_block(MoeTraceKernel::kGemm2, MoeTracePoint::kEnd);
}

// ---- 3/4 (v3). grouped GEMMs on weight tiles staged in shared memory ----------------------
// One block = 16 weight rows x the whole K x one tile of <= 8 tokens. The 16 rows are fetched
// with bulk asynchronous copies, each K stage of 8 chunks completing on its own mbarrier, so a
// block has its whole tile (23 KB at K = 2880) in flight without registers and starts computing
// as soon as the first stage lands; 8 blocks per SM keep ~180 KB in flight. GEMM1 takes 8
// channels per block: mma rows 0..7 are their gate rows, 8..15 their up rows, so each lane holds
// gate and up of the same (channel, token) and SwiGLU needs no exchange. Shared memory holds the
// rows as their row groups do (row_groups.h: chunk q at q * 1024, row i of a chunk of nb blocks
// at i * nb * 16), so each half tile (8 rows, a half group) of a chunk is one contiguous copy,
// and lane (r, c), reading MX block c of rows r and r + 8, meets the other lanes of its
// quarter-warp (rows 2q, 2q + 1, blocks 0..3) in 128 contiguous bytes: no bank conflicts. Words
// are decoded into natural bf16x2 pairs, which meet the activations' words as they lie.
constexpr int kStageK = 1024;  // K values per bulk-copy stage (a multiple of kChunk)
constexpr int kMaxStages = 16;
constexpr int kTileMaxK = kStageK * kMaxStages;
constexpr int kTileBlocksPerSm = 8;

// GEMM1 (w13, K = H) or GEMM2 (w2, K = I) geometry, the same on host and device.
struct TileShape {
  int k;           // K values
  int stored_k;    // values per stored weight row (GEMM2: the padded P)
  int chunks;      // 128-wide chunks of K
  int scale_row;   // global (and smem) bytes per scale row: moe_scale_pitch
  int smem_bytes;  // dynamic shared memory: the weights' chunks, then the scales
};

__host__ __device__ inline TileShape tile_shape(const MoeDeviceWeights& w, bool gemm1) {
  TileShape t{};
  t.k = detail::streamed_k(w, gemm1);
  t.stored_k = detail::stored_row_k(w, gemm1);
  t.chunks = (t.k + kChunk - 1) / kChunk;
  t.scale_row = moe_scale_pitch(t.stored_k);
  t.smem_bytes = t.chunks * detail::kGroupChunkBytes + (kTileRows * t.scale_row + 15) / 16 * 16;
  return t;
}

template <bool kGemm1>
__global__ void __launch_bounds__(kGemmWarps * 32, kTileBlocksPerSm)
    gemm_tile_kernel(GemmArgs args) {
  wait_for_predecessor();
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  extern __shared__ __align__(128) std::uint8_t tile_smem[];
  __shared__ __align__(8) std::uint64_t stage_bar[kMaxStages];
  __shared__ float red[(kGemmWarps - 1) * 4 * 32];
  const TileShape shape = tile_shape(args.w, kGemm1);
  std::uint8_t* sw = tile_smem;
  std::uint8_t* ss = tile_smem + shape.chunks * detail::kGroupChunkBytes;
  const auto [expert, slot0, rows] = detail::read_work_tile(args.ws, tile);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  // Global row of smem row i: GEMM1 gate rows ch0..ch0+7 then their up rows; GEMM2 h0..h0+15.
  const int P = args.w.inter_padded;
  const std::size_t first_row =
      kGemm1 ? static_cast<std::size_t>(expert) * 2 * P + blockIdx.x * (kTileRows / 2)
             : static_cast<std::size_t>(expert) * args.w.hidden + blockIdx.x * kTileRows;
  const auto global_row = [&](int i) -> std::size_t {
    if (kGemm1) return first_row + (i < 8 ? i : P + i - 8);
    return first_row + i;
  };
  const std::uint8_t* weights = kGemm1 ? args.w.w13 : args.w.w2;
  const std::uint8_t* scales = kGemm1 ? args.w.w13_scale : args.w.w2_scale;
  const int stages = (shape.k + kStageK - 1) / kStageK;
  // Bytes of 8 rows of chunk q as stored (a full chunk of the stored rows even where K ends
  // inside it: GEMM2's padding, zeros).
  const auto half_chunk_bytes = [&](int q) {
    return 8 * 16 * detail::chunk_blocks(shape.stored_k, q);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) detail::mbarrier_init(&stage_bar[s], 1);
    detail::fence_barrier_init();
    for (int s = 0; s < stages; ++s) {
      std::uint32_t bytes = 0;
      for (int q = s * (kStageK / kChunk); q < min((s + 1) * (kStageK / kChunk), shape.chunks); ++q)
        bytes += 2 * half_chunk_bytes(q);
      detail::mbarrier_arrive_expect_tx(&stage_bar[s], bytes);
    }
  }
  __syncthreads();
  for (int item = threadIdx.x; item < 2 * shape.chunks; item += blockDim.x) {
    const int half = item % 2;
    const int q = item / 2;
    const std::uint32_t bytes = half_chunk_bytes(q);
    detail::bulk_copy_g2s(
        detail::smem_addr(sw + q * detail::kGroupChunkBytes + half * bytes),
        weights + detail::grouped_block_offset(global_row(8 * half), shape.stored_k, q * kChunk),
        bytes, detail::smem_addr(&stage_bar[q * kChunk / kStageK]));
  }
  // Scales (1/16 of the bytes) by ordinary 8-byte loads: rows of 8 consecutive channels are
  // contiguous and 8-byte aligned (GEMM1: two such regions; GEMM2: one of 16 rows).
  {
    constexpr int kRegions = kGemm1 ? 2 : 1;
    const int region_words = (kTileRows / kRegions) * shape.scale_row / 8;
    for (int q = threadIdx.x; q < kRegions * region_words; q += blockDim.x) {
      const int g = q / region_words;
      const int j = q % region_words;
      const std::uint8_t* src = scales + global_row(g * 8) * shape.scale_row;
      reinterpret_cast<uint2*>(ss + g * (kTileRows / kRegions) * shape.scale_row)[j] =
          __ldg(reinterpret_cast<const uint2*>(src) + j);
    }
  }
  __syncthreads();

  const int r = lane / 4;
  const int c = lane % 4;
  const int n = lane / 4;  // this lane's token column of the B operand
  const std::uint16_t* brow = nullptr;
  if (n < rows) {
    brow = kGemm1 ? args.x + static_cast<std::size_t>(args.ws.slot_pair[slot0 + n] / args.top_k) *
                                 args.w.hidden
                  : reinterpret_cast<const std::uint16_t*>(args.ws.act) +
                        static_cast<std::size_t>(slot0 + n) * args.w.inter;
  }
  float acc[1][4] = {};
  for (int ch = warp; ch < shape.chunks; ch += kGemmWarps) {
    const int k0 = ch * kChunk + 32 * c;
    const bool has_block = k0 < shape.k;
    const int chunk_row_bytes = 16 * detail::chunk_blocks(shape.stored_k, ch);
    uint4 xv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      xv[i] = has_block && brow != nullptr ? __ldg(reinterpret_cast<const uint4*>(brow + k0) + i)
                                           : make_uint4(0, 0, 0, 0);
    }
    detail::mbarrier_wait_parity(detail::smem_addr(&stage_bar[ch * kChunk / kStageK]), 0);
    uint4 wv[1][2];
    std::uint32_t sc[1][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wv[0][h] = has_block ? *reinterpret_cast<const uint4*>(sw + ch * detail::kGroupChunkBytes +
                                                             (r + 8 * h) * chunk_row_bytes + 16 * c)
                           : make_uint4(0, 0, 0, 0);
      sc[0][h] = has_block ? ss[(r + 8 * h) * shape.scale_row + k0 / 32] : 127U;
    }
    if (detail::warp_any_wide_scale(sc)) {
      detail::mma_mx_chunk<1, true>(wv, sc, xv, acc);
    } else {
      detail::mma_mx_chunk<1, false>(wv, sc, xv, acc);
    }
  }
  allow_dependents();
  // Split-K sum in warp order (deterministic).
  if (warp != 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) red[((warp - 1) * 4 + i) * 32 + lane] = acc[0][i];
  }
  __syncthreads();
  if (warp != 0) return;
  for (int w = 1; w < kGemmWarps; ++w)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[0][i] += red[((w - 1) * 4 + i) * 32 + lane];

  if constexpr (kGemm1) {
    const int channel = blockIdx.x * (kTileRows / 2) + r;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int col = 2 * c + q;
      if (col < rows)
        detail::store_gemm1(args, detail::load_gemm1_bias(args, expert, channel), channel,
                            slot0 + col, acc[0][q], acc[0][2 + q]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 2 * c + (i & 1);
      const int row = blockIdx.x * kTileRows + r + (i >= 2 ? 8 : 0);
      if (col < rows)
        detail::store_gemm2(args, detail::load_gemm2_bias(args, expert, row), row, slot0 + col,
                            acc[0][i]);
    }
  }
}

// The TMA views of the wgmma GEMMs' operands (WgmmaMaps): the activations by slot ([T * k, H] for
// GEMM1, [T * k, I] for GEMM2) in boxes of 64 slots x 64 values, the packed weights (w13 E * 2P
// rows of H values, w2 E * H rows of P values) in their row groups.
detail::WgmmaMaps wgmma_maps(const GemmArgs& args, bool gemm1, int tokens) {
  const MoeDeviceWeights& w = args.w;
  const auto experts = static_cast<std::uint64_t>(w.num_local_experts);
  const std::uint64_t slots = static_cast<std::uint64_t>(tokens) * args.top_k;
  const std::uint64_t k = detail::streamed_k(w, gemm1);
  detail::WgmmaMaps maps;
  maps.x = tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                        gemm1 ? static_cast<const void*>(args.ws.x_wgmma) : args.ws.act, slots, k,
                        k * 2, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B, "MoE wgmma activations");
  // The weights' row groups (row_groups.h): full chunks as [groups][16 * chunks][64 B], the short
  // last chunk as [groups][16][nb * 16 B] from its offset in every group.
  const std::uint64_t groups =
      (gemm1 ? experts * 2 * w.inter_padded : experts * w.hidden) / detail::kGroupRows;
  const int stored_k = detail::stored_row_k(w, gemm1);
  const std::uint64_t group_bytes = detail::kGroupRows * static_cast<std::uint64_t>(stored_k / 2);
  const std::uint64_t full_chunks = stored_k / detail::kLayoutChunk;
  const int short_blocks = detail::chunk_blocks(stored_k, static_cast<int>(full_chunks));
  const std::uint8_t* weights = gemm1 ? w.w13 : w.w2;
  constexpr std::uint32_t kBoxGroups = detail::kWgmmaWBoxGroups;
  // With no full chunk (K < 128) the map is never read; it still needs a valid shape.
  maps.w = tma::make_3d(
      CU_TENSOR_MAP_DATA_TYPE_UINT8, weights,
      {detail::kChunkBytes, detail::kGroupRows * std::max<std::uint64_t>(full_chunks, 1), groups},
      {detail::kChunkBytes, group_bytes}, {detail::kChunkBytes, detail::kGroupRows, kBoxGroups},
      CU_TENSOR_MAP_SWIZZLE_64B, "MoE wgmma weights");
  if (short_blocks > 0) {
    const auto row_bytes = static_cast<std::uint32_t>(16 * short_blocks);
    maps.w_short = tma::make_3d(CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                weights + full_chunks * detail::kGroupChunkBytes,
                                {row_bytes, detail::kGroupRows, groups}, {row_bytes, group_bytes},
                                {row_bytes, detail::kGroupRows, kBoxGroups},
                                CU_TENSOR_MAP_SWIZZLE_NONE, "MoE wgmma weights (short last chunk)");
  }
  return maps;
}

// SMs of the current device (a cached attribute: cheap, and legal while a graph is captured).
int sm_count() {
  int device = 0;
  int sms = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// The single-token GEMM1's grid for up to max_tiles chosen experts: one wave of `resident`
// blocks, but no more blocks than tiles (a range is at least a tile long: a tile has two parts at
// most) and no fewer than half the tiles (a range is at most two tiles long: three pieces at
// most); 0 when that needs more than kSplitMaxBlocks (the boundary counters).
int single_token_gemm1_blocks(const MoeDeviceWeights& w, int max_tiles, int resident) {
  const int tiles = max_tiles * (w.inter / kTileRows);
  const int blocks = std::max(std::min(resident, tiles), (tiles + 1) / 2);
  return blocks <= detail::kSplitMaxBlocks ? blocks : 0;
}

// Launches the variant's GEMM; shared_tile falls back to the register-streaming one when K does
// not fit a tile.
template <bool kGemm1>
void launch_gemm(const GemmArgs& args, int tokens, int max_tiles, cudaStream_t stream) {
  const int row_blocks = kGemm1 ? args.w.inter / (kTileRows / 2) : args.w.hidden / kTileRows;
  const TileShape shape = tile_shape(args.w, kGemm1);
  if (args.p.gemm == GemmVariant::kWgmmaTile) {
    MXQ_CUDA_CHECK(cudaFuncSetAttribute(detail::gemm_wgmma_kernel<kGemm1>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        detail::kWgmmaSmemBytes));
    launch(detail::gemm_wgmma_kernel<kGemm1>,
           dim3(detail::wgmma_row_blocks(args.w, kGemm1), max_tiles), dim3(detail::kWgmmaThreads),
           static_cast<std::size_t>(detail::kWgmmaSmemBytes), stream, args.p.programmatic_launch,
           args, wgmma_maps(args, kGemm1, tokens));
  } else if (args.p.gemm == GemmVariant::kWideTile) {
    // 3 blocks of 48.5 KB per SM need more than the default carveout may give.
    MXQ_CUDA_CHECK(cudaFuncSetAttribute(detail::gemm_wide_kernel<kGemm1>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    MXQ_CUDA_CHECK(cudaFuncSetAttribute(detail::gemm_wide_kernel<kGemm1>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        detail::kWideSmemBytes));
    launch(detail::gemm_wide_kernel<kGemm1>,
           dim3(detail::wide_row_blocks(args.w, kGemm1), max_tiles), dim3(detail::kWideWarps * 32),
           static_cast<std::size_t>(detail::kWideSmemBytes), stream, args.p.programmatic_launch,
           args);
  } else if (args.p.gemm == GemmVariant::kSharedTile && shape.k <= kTileMaxK) {
    // All of the unified L1/shared memory as shared, so 8 tiles fit per SM (the default carveout
    // may leave room for fewer); more than 48 KB of dynamic smem needs the explicit limit.
    MXQ_CUDA_CHECK(cudaFuncSetAttribute(gemm_tile_kernel<kGemm1>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    if (shape.smem_bytes > 48 * 1024) {
      MXQ_CUDA_CHECK(cudaFuncSetAttribute(
          gemm_tile_kernel<kGemm1>, cudaFuncAttributeMaxDynamicSharedMemorySize, shape.smem_bytes));
    }
    launch(gemm_tile_kernel<kGemm1>, dim3(row_blocks, max_tiles), dim3(kGemmWarps * 32),
           static_cast<std::size_t>(shape.smem_bytes), stream, args.p.programmatic_launch, args);
  } else if (kGemm1 && args.single_token) {
    launch(gemm1_single_token_kernel,
           dim3(single_token_gemm1_blocks(args.w, max_tiles, kStreamBlocksPerSm * sm_count())),
           dim3(kGemmWarps * 32), 0, stream, args.p.programmatic_launch, args);
  } else if (kGemm1) {
    const auto kernel = w4a8(args.p) ? gemm1_swiglu_kernel<true> : gemm1_swiglu_kernel<false>;
    launch(kernel, dim3(args.w.inter / kTileRows, max_tiles), dim3(kGemmWarps * 32), 0, stream,
           args.p.programmatic_launch, args);
  } else {
    const auto kernel = w4a8(args.p) ? gemm2_kernel<true> : gemm2_kernel<false>;
    launch(kernel, dim3(args.w.hidden / (kTileRows * kGemm2Tiles), max_tiles),
           dim3(kGemmWarps * 32), 0, stream, args.p.programmatic_launch, args);
  }
  MXQ_CUDA_CHECK_LAUNCH();
}

// ---- weight layout ----------------------------------------------------------------------------
// One block per row group (row_groups.h): the group's rows are read into shared memory, then
// each thread writes row chunks, their words converted (W4A16: device words in order; W4A8: its
// words, lane-contiguous), to their place in the group.
template <bool kW4a8>
__global__ void to_row_groups_kernel(std::uint8_t* packed, int k) {
  extern __shared__ uint4 group_smem[];
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  const std::size_t group_bytes = detail::kGroupRows * row_bytes;
  std::uint8_t* base = packed + blockIdx.x * group_bytes;
  for (std::size_t i = threadIdx.x; i < group_bytes / 16; i += blockDim.x)
    group_smem[i] = reinterpret_cast<const uint4*>(base)[i];
  __syncthreads();
  const auto* group = reinterpret_cast<const std::uint8_t*>(group_smem);
  const int chunks = (k + detail::kLayoutChunk - 1) / detail::kLayoutChunk;
  for (int item = threadIdx.x; item < chunks * detail::kGroupRows; item += blockDim.x) {
    const int q = item / detail::kGroupRows;
    const int i = item % detail::kGroupRows;
    const int nb = detail::chunk_blocks(k, q);
    const auto* in_words = reinterpret_cast<const std::uint32_t*>(
        group + i * row_bytes + static_cast<std::size_t>(q) * detail::kChunkBytes);
    std::uint32_t in[16];
    std::uint32_t out[16];
    for (int j = 0; j < 4 * nb; ++j) in[j] = in_words[j];
    if constexpr (kW4a8) {
      detail::w4a8_convert_chunk(in, nb, out);
    } else {
      detail::device_convert_chunk(in, nb, out);
    }
    auto* out_words = reinterpret_cast<std::uint32_t*>(base + detail::group_offset(k, q, i));
    for (int j = 0; j < 4 * nb; ++j) out_words[j] = out[j];
  }
}

// Rearranges `rows` packed rows of k values into row groups in place (`what` names the caller).
void to_row_groups(bool w4a8, std::uint8_t* packed, std::size_t rows, int k, cudaStream_t stream,
                   const char* what) {
  MXQ_CHECK(k > 0 && k % 32 == 0, ErrorCode::kInvalidArgument, what,
            ": k: expected a positive multiple of 32, found ", k);
  MXQ_CHECK(reinterpret_cast<std::uintptr_t>(packed) % 16 == 0, ErrorCode::kInvalidArgument, what,
            ": expected 16-byte aligned weights");
  MXQ_CHECK(rows % detail::kGroupRows == 0, ErrorCode::kInvalidArgument, what,
            ": rows: expected a multiple of 16, found ", rows);
  MXQ_CHECK(k <= detail::kMaxGroupedK, ErrorCode::kUnsupported, what, ": k: at most ",
            detail::kMaxGroupedK, " values a row (a row group in shared memory), found ", k);
  if (rows == 0) return;
  const int group_bytes = detail::kGroupRows * (k / 2);
  const auto kernel = w4a8 ? to_row_groups_kernel<true> : to_row_groups_kernel<false>;
  MXQ_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, group_bytes));
  kernel<<<static_cast<unsigned>(rows / detail::kGroupRows), 256,
           static_cast<std::size_t>(group_bytes), stream>>>(packed, k);
  MXQ_CUDA_CHECK_LAUNCH();
}

// ---- W4A8 activations -------------------------------------------------------------------------
// One warp per (row, 128-group) of bf16 rows [rows, k]: E4M3 codes of value / scale (saturating,
// round to nearest even) with scale = max(amax, 1e-4) / 448 in fp32 — the CPU reference's
// quantize_dequantize_fp8_groups, with the same codec functions — into the W4A8 activation
// layout (zeros past k), and the scale. A NaN or Inf makes its group's scale NaN.
// kReadsPredecessor: the rows are an earlier kernel's output (GEMM1's activations), so wait
// first; else (the forward's input x) quantize while the routing kernel runs, then wait (so that
// the next kernel's wait covers the routing too).
template <bool kReadsPredecessor>
__global__ void quantize_fp8_groups_kernel(const std::uint16_t* __restrict__ src, int rows, int k,
                                           std::uint8_t* __restrict__ q,
                                           float* __restrict__ scales) {
  if constexpr (kReadsPredecessor) wait_for_predecessor();
  allow_dependents();
  const int groups = detail::w4a8_act_groups(k);
  const int item = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item < rows * groups) {
    const int row = item / groups;
    const int k0 = (item % groups) * detail::kW4a8Chunk + 4 * lane;
    float v[4] = {0.0F, 0.0F, 0.0F, 0.0F};
    std::uint32_t amax_bits = 0;
    if (k0 < k) {
      const uint2 pair =
          __ldg(reinterpret_cast<const uint2*>(src + static_cast<std::size_t>(row) * k + k0));
      const std::uint32_t half[4] = {pair.x & 0xFFFFU, pair.x >> 16, pair.y & 0xFFFFU,
                                     pair.y >> 16};
      for (int i = 0; i < 4; ++i) {
        v[i] = __uint_as_float(half[i] << 16);
        amax_bits = max(amax_bits, (half[i] << 16) & 0x7FFFFFFFU);
      }
    }
    for (int offset = 16; offset > 0; offset /= 2)
      amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFU, amax_bits, offset));
    const float scale = fp8_block_scale(__uint_as_float(amax_bits), ScaleMode::kFp32);
    std::uint32_t codes = 0;
    for (int i = 0; i < 4; ++i)
      codes |= static_cast<std::uint32_t>(float_to_e4m3(v[i] / scale, Fp8Saturation::kSatFinite))
               << (8 * i);
    const std::size_t pitch = detail::w4a8_act_pitch(k);
    *reinterpret_cast<std::uint32_t*>(q + row * pitch + detail::w4a8_act_offset(k0)) = codes;
    if (lane == 0) scales[static_cast<std::size_t>(item)] = scale;
  }
  if constexpr (!kReadsPredecessor) wait_for_predecessor();
}

void launch_quantize_fp8(bool reads_predecessor, const std::uint16_t* src, int rows, int k,
                         std::uint8_t* q, float* scales, bool programmatic, cudaStream_t stream) {
  constexpr int kWarps = 8;
  const int items = rows * detail::w4a8_act_groups(k);
  launch(reads_predecessor ? quantize_fp8_groups_kernel<true> : quantize_fp8_groups_kernel<false>,
         dim3((items + kWarps - 1) / kWarps), dim3(kWarps * 32), 0, stream, programmatic, src, rows,
         k, q, scales);
  MXQ_CUDA_CHECK_LAUNCH();
}

// ---- 5. combine -----------------------------------------------------------------------------
__global__ void combine_kernel(const float* __restrict__ y, const int* __restrict__ pair_slot,
                               const float* __restrict__ topk_w, int top_k, int hidden,
                               float* __restrict__ out_f32, std::uint16_t* __restrict__ out_bf16) {
  detail::trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kStart);
  wait_for_predecessor();
  detail::trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kReleased);
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
  detail::trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kEnd);
}

}  // namespace

const char* moe_decode_unsupported_reason(const MoeDeviceWeights& w, const MoeParams& p) {
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
  if (w4a8(p) && p.gemm != GemmVariant::kRegisterStream && p.gemm != GemmVariant::kAuto)
    return "W4A8 (fp8_g128 activations) runs the register_stream GEMMs only";
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
      // External: under stream capture a plain record only orders work inside the graph; this
      // one becomes an event record node that the caller can synchronize on and time.
      MXQ_CUDA_CHECK(
          cudaEventRecordWithFlags(run.phase_events[phase], stream, cudaEventRecordExternal));
  };
  mark(0);
  MoeParams resolved = p;
  resolved.gemm = resolve_gemm_variant(w, p, run.tokens);
  const Workspace ws = detail::carve_workspace(w, p, max_tokens, workspace, nullptr);
  const int pairs = run.tokens * p.top_k;
  const bool routing = run.topk_ids == nullptr;
  // With precomputed routing the kernel only counts the given ids, even when the layer has a
  // router.
  // One token routed on the device, W4A16 register-streaming GEMMs: GEMM1 takes the top-k
  // (route_single_token).
  const bool single_token =
      routing && run.tokens == 1 && !w4a8(p) && resolved.gemm == GemmVariant::kRegisterStream &&
      w.num_global_experts <= kSingleTokenMaxRouterExperts &&
      single_token_gemm1_blocks(w, detail::max_tiles_for(p.top_k, w.num_local_experts), 1) > 0;
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
                          detail::tile_tokens_for(resolved.gemm),
                          ws};
  route.logits_only = single_token;
  const int route_tiles = routing ? detail::route_tiles_for(run.tokens) : 1;
  const int router_blocks =
      routing ? detail::router_blocks_for(w.num_global_experts, route_tiles) : 1;
  // The first kernel of the forward: plain stream order after whatever the caller enqueued.
  launch(route_tiles == 4 ? detail::route_kernel<4> : detail::route_kernel<1>,
         dim3(router_blocks, detail::token_groups_for(run.tokens)), dim3(detail::kRouteWarps * 32),
         detail::route_smem_bytes(w.num_local_experts), stream, false, route);
  MXQ_CUDA_CHECK_LAUNCH();
  const float* weights = routing ? ws.topk_w : run.topk_weights;
  if (w4a8(p)) {
    launch_quantize_fp8(false, run.x, run.tokens, w.hidden, ws.x_fp8, ws.x_scale,
                        p.programmatic_launch, stream);
  }
  if (resolved.gemm == GemmVariant::kWgmmaTile) {
    // GEMM1's activations by slot, in the wgmma K order (after the routing kernel's slots).
    // Grid-stride over 16-byte units: two waves of 8 resident 256-thread blocks per SM at most.
    const int sms = sm_count();
    const std::size_t units = static_cast<std::size_t>(pairs) * (w.hidden / 8);
    const int blocks = static_cast<int>(
        std::min<std::size_t>((units + 255) / 256, static_cast<std::size_t>(sms) * 16));
    launch(detail::gather_activations_kernel, dim3(blocks), dim3(256), 0, stream,
           p.programmatic_launch, reinterpret_cast<const std::uint32_t*>(run.x),
           static_cast<const int*>(ws.pair_slot), pairs, p.top_k, w.hidden,
           reinterpret_cast<uint4*>(ws.x_wgmma));
    MXQ_CUDA_CHECK_LAUNCH();
  }

  mark(1);
  const int max_tiles =
      detail::max_tiles_for(pairs, w.num_local_experts, detail::tile_tokens_for(resolved.gemm));
  GemmArgs args{w, resolved, run.x, p.top_k, ws};
  args.single_token = single_token;
  launch_gemm<true>(args, run.tokens, max_tiles, stream);
  if (w4a8(p)) {
    launch_quantize_fp8(true, reinterpret_cast<const std::uint16_t*>(ws.act), pairs, w.inter,
                        ws.act_fp8, ws.act_scale, p.programmatic_launch, stream);
  }
  mark(2);
  launch_gemm<false>(args, run.tokens, max_tiles, stream);
  mark(3);
  launch(combine_kernel, dim3((w.hidden + 255) / 256, run.tokens), dim3(256), 0, stream,
         p.programmatic_launch, ws.y, ws.pair_slot, weights, p.top_k, w.hidden, run.out_f32,
         run.out_bf16);
  mark(4);
}

GemmVariant resolve_gemm_variant(const MoeDeviceWeights& w, const MoeParams& p, int tokens) {
  if (p.gemm != GemmVariant::kAuto) return p.gemm;
  if (w4a8(p)) return GemmVariant::kRegisterStream;
  const int experts =
      std::max(w.num_global_experts > 0 ? w.num_global_experts : w.num_local_experts, 1);
  const double slots_per_expert = static_cast<double>(tokens) * p.top_k / experts;
  return slots_per_expert >= kPrefillMinSlotsPerExpert ? GemmVariant::kWgmmaTile
                                                       : GemmVariant::kRegisterStream;
}

void moe_weights_to_device_layout(std::uint8_t* packed, std::size_t rows, int k,
                                  cudaStream_t stream) {
  to_row_groups(false, packed, rows, k, stream, "moe_weights_to_device_layout");
}

void moe_weights_to_w4a8_layout(std::uint8_t* packed, std::size_t rows, int k,
                                cudaStream_t stream) {
  to_row_groups(true, packed, rows, k, stream, "moe_weights_to_w4a8_layout");
}

void moe_scales_to_device_layout(const std::uint8_t* src, std::size_t rows, int k,
                                 std::uint8_t* dst, cudaStream_t stream) {
  MXQ_CHECK(k > 0 && k % 32 == 0, ErrorCode::kInvalidArgument,
            "moe_scales_to_device_layout: k: expected a positive multiple of 32, found ", k);
  if (rows == 0) return;
  const std::size_t pitch = static_cast<std::size_t>(moe_scale_pitch(k));
  const std::size_t width = static_cast<std::size_t>(k / 32);
  MXQ_CUDA_CHECK(cudaMemsetAsync(dst, 0, rows * pitch, stream));
  MXQ_CUDA_CHECK(cudaMemcpy2DAsync(dst, pitch, src, width, width, rows, cudaMemcpyDefault, stream));
}

const char* to_string(GemmVariant variant) {
  switch (variant) {
    case GemmVariant::kSharedTile:
      return "shared_tile";
    case GemmVariant::kWideTile:
      return "wide_tile";
    case GemmVariant::kWgmmaTile:
      return "wgmma_tile";
    case GemmVariant::kAuto:
      return "auto";
    case GemmVariant::kRegisterStream:
    default:
      return "register_stream";
  }
}

MoeRoutingView moe_routing_view(const MoeDeviceWeights& w, const MoeParams& p, int max_tokens,
                                void* workspace) {
  const Workspace ws = detail::carve_workspace(w, p, max_tokens, workspace, nullptr);
  return {ws.topk_ids, ws.topk_w};
}

bool moe_block_trace_enabled() { return MXQ_MOE_BLOCK_TRACE != 0; }

std::array<std::vector<MoeBlockTraceRecord>, kMoeTraceKernels> moe_block_trace_take() {
#if MXQ_MOE_BLOCK_TRACE
  std::vector<MoeBlockTraceRecord> all(static_cast<std::size_t>(kMoeTraceKernels) *
                                       kMoeTraceMaxBlocks);
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  MXQ_CUDA_CHECK(cudaMemcpyFromSymbol(all.data(), detail::g_block_trace,
                                      all.size() * sizeof(MoeBlockTraceRecord)));
  void* records = nullptr;
  MXQ_CUDA_CHECK(cudaGetSymbolAddress(&records, detail::g_block_trace));
  MXQ_CUDA_CHECK(cudaMemset(records, 0, all.size() * sizeof(MoeBlockTraceRecord)));
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

}  // namespace mxq::moe::cuda
