// The single-token GEMM1 of the MoE forward (GemmArgs::single_token): the token's top-k in every
// block, then the chosen experts' GEMM1 as one wave of blocks that split their K chunks evenly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "block_trace.cuh"
#include "cuda_common/pdl.cuh"
#include "gemm_common.cuh"
#include "gemm_register_stream.cuh"
#include "moe/layout/row_groups.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "routing.cuh"
#include "workspace.cuh"

namespace mxq::moe::gpu::detail {

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
    warp_row_topk<kSingleTokenKeysPerLane>(args.ws.logits, args.w.num_global_experts, k, lane, id,
                                           weight);
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
  trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kStart);
  ptx::wait_for_predecessor();
  trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kReleased);
  __shared__ int chosen[kMaxTopK];
  __shared__ SingleTokenPiece pieces[kMaxPieces];
  __shared__ int num_pieces;
  __shared__ PieceSums sums;  // zero where a warp has no position in a piece
  __shared__ BlockBiases biases[kMaxPieces];
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
                            16 * chunk_blocks(hidden, hidden / kChunk),
                            lane / 4,
                            lane % 4};
  stream_pieces(s, len, warp, lane, sums);
  trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kMid);
  ptx::allow_dependents();
  BlockBiases::finish();
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
    float* partial = args.ws.split_partial + boundary * 2 * kSplitTileSums;
    if (c == 0) {
      for (int i = 0; i < kPieceSums; ++i) partial[part * kSplitTileSums + 8 * i + r] = out[i];
    }
    __threadfence();
    __syncwarp();
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(args.ws.split_count + boundary, 1);
    if (__shfl_sync(0xFFFFFFFFU, arrived, 0) == 0) {  // the other part finishes the tile
      trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kEnd);
      return;
    }
    __threadfence();
    if (c == 0) {
      for (int i = 0; i < kPieceSums; ++i) {
        const float other = __ldcg(partial + (1 - part) * kSplitTileSums + 8 * i + r);
        out[i] = part == 0 ? out[i] + other : other + out[i];
      }
    }
    if (lane == 0) args.ws.split_count[boundary] = 0;
  }
  if (c == 0) {
    const int ch0 = (tile % row_blocks) * kTileRows;
    for (int h = 0; h < 2; ++h) {
      const int m = r + 8 * h;  // the channel in the tile
      store_gemm1(args, {biases[piece].at(m), biases[piece].at(16 + m)}, ch0 + m, tile / row_blocks,
                  out[h], out[2 + h]);
    }
  }
  trace_block(MoeTraceKernel::kGemm1, MoeTracePoint::kEnd);
}

}  // namespace mxq::moe::gpu::detail
