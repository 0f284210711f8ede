// The wide-tile grouped GEMMs of the MoE forward (GemmVariant::kWideTile), for prefill.
//
// Why: the decode GEMMs decode each weight for one 8-slot tile, so at many slots per expert they
// decode every weight count/8 times and are bound by that integer work. Here one block takes a
// 64-slot tile: each decoded A fragment feeds 8 mma token tiles.
//
// Block = 4 warps over the whole K, each warp on its own weight rows (no split-K, no reduction):
//   GEMM1: 16 channels per warp (gate rows and up rows as two mma tiles), 64 per block;
//   GEMM2: 32 rows of w2 per warp (two mma tiles), 128 per block.
// Per 128-wide K chunk a block needs 16 KB of activations (64 slots) and 8 KB of packed weights
// (128 rows x 4 MX blocks) + 512 B of scales; all of it arrives in a 3-stage ring of shared memory
// two chunks ahead of use, so ~50 KB per block is in flight without registers (Nsight Compute on
// the first version, which loaded weights into registers one chunk ahead: long-scoreboard stalls
// were the largest share). Activations and weights come by cp.async (slot rows past the tile's
// count, the K tail and the rows of a warp past the matrix are zero-filled by the copy); the
// scales, whose rows are not 4-byte aligned, by byte loads held one iteration in a register.
// Lane (r = lane/4, c = lane%4) then reads MX block c of rows r and r+8 of its warp's tiles and
// decodes it a word at a time (mxfp4_mma.cuh). (The weights' row groups, row_groups.h, only
// change where each 16-byte copy reads from.)
//
// Activation layout of a stage: slot row n is 256 bytes = 16 units of 8 bf16 (16 bytes). Lane
// (r, c) reads unit u = 4c + j (the elements of word j of its MX block; its 4 bf16x2 words are
// the B registers of the word's two k-steps as they lie) of rows n = 8*nt + r. In one 8-lane
// phase of a 16-byte load, rows 2q and 2q+1 are read with c = 0..3: unswizzled, units 4c+j hit
// only 2 of the 8 16-byte bank groups. Stored at unit u ^ (bit 3 of u moved to bit 1) ^ (n & 1),
// the 8 lanes hit 8 distinct groups. Weight layout: stage row s = 32 warp + 16 tile + 8 half + r
// holds 64 bytes, so a phase (rows s, s+1, blocks 0..3) reads 128 contiguous bytes.
#pragma once

#include <cstdint>

#include "cuda/linear/device_ptx.cuh"
#include "gemm_common.cuh"
#include "mxfp4_mma.cuh"
#include "pdl.cuh"
#include "row_groups.h"

namespace mxq::moe::cuda::detail {

constexpr int kWideWarps = 4;
constexpr int kWideStages = 3;
constexpr int kWideChunk = 128;                   // K values per stage
constexpr int kWideRowBytes = kWideChunk * 2;     // one slot's bf16 activations per stage
constexpr int kWideNTiles = kWideTileTokens / 8;  // mma token tiles per slot tile
constexpr int kWideWeightRows = 32 * kWideWarps;  // stage rows: 2 tiles x 16 rows per warp
constexpr int kWideXBytes = kWideTileTokens * kWideRowBytes;          // 16 KB
constexpr int kWideWBytes = kWideWeightRows * (kWideChunk / 2);       // 8 KB
constexpr int kWideScaleBytes = kWideWeightRows * (kWideChunk / 32);  // 512 B
constexpr int kWideStageBytes = kWideXBytes + kWideWBytes + kWideScaleBytes;
constexpr int kWideSmemBytes = kWideStages * kWideStageBytes;  // 73.5 KB (+ 512 B static)
constexpr int kWideBlocksPerSm = 3;  // <= 168 registers per thread; 222 KB of shared memory
constexpr int kWideGemm1Channels = 16 * kWideWarps;  // channels per GEMM1 block
constexpr int kWideGemm2Rows = 32 * kWideWarps;      // w2 rows per GEMM2 block
static_assert(kWideWeightRows == kWideWarps * 32, "one scale row per thread");

__device__ __forceinline__ int wide_unit(int n, int u) {
  return u ^ (((u >> 3) & 1) << 1) ^ (n & 1);
}

// The block-FP8 kernels' cp.async wrappers and shared-address conversion. A cp_async_16 of 0
// source bytes writes 16 zero bytes and reads nothing: copy_stage zero-fills the slot rows past
// the tile's count, the K tail and the rows past the matrix that way.
using linear::device::cp_async_16;
using linear::device::cp_async_commit;
using linear::device::cp_async_wait;
using linear::device::smem_addr;

// One lane's weights of one chunk: MX block c of rows r and r+8 of both mma tiles.
struct WideWeightRegs {
  uint4 w[2][2];
  std::uint32_t scale[2][2];
};

// acc[a][nt] += tile a of the stage's weights (this warp's rows) x token tile nt of its
// activations.
template <bool kWideScales>
__device__ __forceinline__ void wide_mma_chunk(const WideWeightRegs& regs,
                                               const std::uint8_t* stage_x, int lane,
                                               float (&acc)[2][kWideNTiles][4]) {
  const int r = lane / 4;
  const int c = lane % 4;
  ScaleFactors f[2][2];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) f[a][h] = scale_factors<kWideScales>(regs.scale[a][h]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    std::uint32_t frag[2][2][4];  // [tile][k-step][A registers]
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const std::uint32_t w0[4] = {regs.w[a][0].x, regs.w[a][0].y, regs.w[a][0].z, regs.w[a][0].w};
      const std::uint32_t w1[4] = {regs.w[a][1].x, regs.w[a][1].y, regs.w[a][1].z, regs.w[a][1].w};
      decode_word_pair_fragments<kWideScales>(w0[j], w1[j], f[a][0], f[a][1], frag[a][0],
                                              frag[a][1]);
    }
    const int unit = 4 * c + j;
#pragma unroll
    for (int nt = 0; nt < kWideNTiles; ++nt) {
      const int n = 8 * nt + r;
      const uint4 xv =
          *reinterpret_cast<const uint4*>(stage_x + n * kWideRowBytes + wide_unit(n, unit) * 16);
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        mma_bf16_16816(acc[a][nt], frag[a][0], xv.x, xv.y);
        mma_bf16_16816(acc[a][nt], frag[a][1], xv.z, xv.w);
      }
    }
  }
}

template <bool kGemm1>
__global__ void __launch_bounds__(kWideWarps * 32, kWideBlocksPerSm)
    gemm_wide_kernel(GemmArgs args) {
  wait_for_predecessor();
  const int tile = blockIdx.y;
  if (tile >= *args.ws.num_tiles) return;
  extern __shared__ __align__(128) std::uint8_t wide_smem[];
  __shared__ const std::uint16_t* slot_row[kWideTileTokens];  // activations of each tile slot
  const auto [expert, slot0, rows] = read_work_tile(args.ws, tile);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int r = lane / 4;
  const int c = lane % 4;
  const int k_total = streamed_k(args.w, kGemm1);
  const int P = args.w.inter_padded;

  for (int n = threadIdx.x; n < kWideTileTokens; n += blockDim.x) {
    const std::uint16_t* row = nullptr;
    if (n < rows) {
      row = kGemm1 ? args.x + static_cast<std::size_t>(args.ws.slot_pair[slot0 + n] / args.top_k) *
                                  args.w.hidden
                   : reinterpret_cast<const std::uint16_t*>(args.ws.act) +
                         static_cast<std::size_t>(slot0 + n) * args.w.inter;
    }
    slot_row[n] = row;
  }

  // Rows: stage row s = 32 w + 16 a + 8 h + r' is row r' + 8h of tile a of warp w. GEMM1: warp w
  // takes channels first + 16 w .. +15, tile 0 their gate rows, tile 1 their up rows (P further);
  // GEMM2: warp w takes rows first + 32 w .. +31 as two tiles of 16. A warp past the matrix's
  // last row (I or H not a multiple of the block's rows) computes on zeros and stores nothing.
  const int warp_rows = kGemm1 ? 16 : 32;
  const int matrix_rows = kGemm1 ? args.w.inter : args.w.hidden;
  const int block_first = blockIdx.x * warp_rows * kWideWarps;
  const int first = block_first + warp * warp_rows;  // GEMM1: channel; GEMM2: w2 row
  const bool warp_stores = first < matrix_rows;
  const int tile_step = kGemm1 ? P : 16;
  const std::size_t expert_row =
      static_cast<std::size_t>(expert) * (kGemm1 ? 2 * P : args.w.hidden);
  const int stored_k = stored_row_k(args.w, kGemm1);
  const int scale_pitch = moe_scale_pitch(stored_k);
  const std::uint8_t* weights = kGemm1 ? args.w.w13 : args.w.w2;
  const std::uint8_t* scales = kGemm1 ? args.w.w13_scale : args.w.w2_scale;
  // Global row of stage row s, or -1 past the matrix.
  const auto stage_row_global = [&](int s) -> std::int64_t {
    const int w = s / 32;
    if (block_first + w * warp_rows >= matrix_rows) return -1;
    return static_cast<std::int64_t>(expert_row) + block_first + w * warp_rows +
           ((s / 16) % 2) * tile_step + (s % 16);
  };
  // This thread's scale row (one stage row per thread).
  const std::int64_t my_scale_row = stage_row_global(threadIdx.x);
  const std::uint8_t* my_scales =
      my_scale_row >= 0 ? scales + static_cast<std::size_t>(my_scale_row) * scale_pitch : nullptr;
  __syncthreads();  // slot_row

  const std::uint32_t smem_base = smem_addr(wide_smem);
  const int chunks = (k_total + kWideChunk - 1) / kWideChunk;
  // Activations and weights of `chunk` by cp.async: 64 x 16 + 128 x 4 units, 12 per thread.
  const auto copy_stage = [&](int chunk) {
    const std::uint32_t stage = smem_base + (chunk % kWideStages) * kWideStageBytes;
    for (int q = threadIdx.x; q < kWideTileTokens * 16; q += blockDim.x) {
      const int n = q / 16;
      const int u = q % 16;
      const int k = chunk * kWideChunk + u * 8;
      const std::uint16_t* src = slot_row[n];
      const bool valid = src != nullptr && k < k_total;
      cp_async_16(stage + n * kWideRowBytes + wide_unit(n, u) * 16, valid ? src + k : args.x,
                  valid ? 16 : 0);
    }
    for (int q = threadIdx.x; q < kWideWeightRows * 4; q += blockDim.x) {
      const int s = q / 4;
      const int u = q % 4;  // MX block
      const std::int64_t row = stage_row_global(s);
      const int k = chunk * kWideChunk + 32 * u;
      const bool valid = row >= 0 && k < k_total;
      cp_async_16(stage + kWideXBytes + s * (kWideChunk / 2) + u * 16,
                  valid ? weights + grouped_block_offset(static_cast<std::size_t>(row), stored_k, k)
                        : weights,
                  valid ? 16 : 0);
    }
  };
  // The 4 scales of this thread's row for `chunk` (zero past the matrix or K: zero weights
  // there, and 2^-127 * 0 is 0), packed little-endian, and their store into the stage.
  const auto load_scales = [&](int chunk) -> std::uint32_t {
    if (my_scales == nullptr || chunk >= chunks) return 0U;
    return load_chunk_scales(my_scales, chunk);
  };
  const auto store_scales = [&](int chunk, std::uint32_t packed) {
    *reinterpret_cast<std::uint32_t*>(wide_smem + (chunk % kWideStages) * kWideStageBytes +
                                      kWideXBytes + kWideWBytes + threadIdx.x * 4) = packed;
  };
#pragma unroll
  for (int s = 0; s < kWideStages - 1; ++s) {
    if (s < chunks) {
      copy_stage(s);
      store_scales(s, load_scales(s));
    }
    cp_async_commit();
  }
  // Scales of chunk i + 2 are loaded in iteration i and stored in iteration i + 1 (their stage is
  // free then: its last readers finished iteration i - 1 before that iteration's barrier), so
  // the barrier of iteration i + 2 publishes them.
  std::uint32_t pending_scales = 0;

  float acc[2][kWideNTiles][4] = {};
  const int row0 = warp * 32 + r;  // stage row of (tile 0, half 0) of this lane
  for (int chunk = 0; chunk < chunks; ++chunk) {
    cp_async_wait<kWideStages - 2>();  // this thread's copies of `chunk` have landed
    __syncthreads();  // everyone's have, and nobody still reads the stage refilled below
    if (chunk + kWideStages - 1 < chunks) copy_stage(chunk + kWideStages - 1);
    cp_async_commit();  // possibly empty: keeps one group per chunk for the wait above
    if (chunk >= 1 && chunk + 1 < chunks) store_scales(chunk + 1, pending_scales);
    pending_scales = load_scales(chunk + 2);

    const std::uint8_t* stage = wide_smem + (chunk % kWideStages) * kWideStageBytes;
    WideWeightRegs cur;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = row0 + 16 * a + 8 * h;
        cur.w[a][h] =
            *reinterpret_cast<const uint4*>(stage + kWideXBytes + s * (kWideChunk / 2) + c * 16);
        cur.scale[a][h] = stage[kWideXBytes + kWideWBytes + s * 4 + c];
      }
    if (warp_any_wide_scale(cur.scale)) {
      wide_mma_chunk<true>(cur, stage, lane, acc);
    } else {
      wide_mma_chunk<false>(cur, stage, lane, acc);
    }
  }
  allow_dependents();
  if (!warp_stores) return;

    // acc[a][nt][i]: mma row r + 8 (i >= 2) of tile a, slot column 8 nt + 2c + (i & 1).
#pragma unroll
  for (int nt = 0; nt < kWideNTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 8 * nt + 2 * c + (i & 1);
      if (col >= rows) continue;
      const int m = r + (i >= 2 ? 8 : 0);
      if constexpr (kGemm1) {
        store_gemm1(args, load_gemm1_bias(args, expert, first + m), first + m, slot0 + col,
                    acc[0][nt][i], acc[1][nt][i]);
      } else {
        store_gemm2(args, load_gemm2_bias(args, expert, first + m), first + m, slot0 + col,
                    acc[0][nt][i]);
        store_gemm2(args, load_gemm2_bias(args, expert, first + 16 + m), first + 16 + m,
                    slot0 + col, acc[1][nt][i]);
      }
    }
}

// Row blocks of a wide GEMM launch.
inline int wide_row_blocks(const MoeDeviceWeights& w, bool gemm1) {
  return gemm1 ? (w.inter + kWideGemm1Channels - 1) / kWideGemm1Channels
               : (w.hidden + kWideGemm2Rows - 1) / kWideGemm2Rows;
}

}  // namespace mxq::moe::cuda::detail
