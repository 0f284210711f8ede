// The wide-tile grouped GEMMs of the MoE forward (GemmVariant::kWideTile), for prefill.
//
// Why: the decode GEMMs decode each weight for one 8-slot tile, so at many slots per expert they
// decode every weight count/8 times and are bound by that integer work (77 TFLOPS at T = 4096 on
// the gpt-oss-120b layer). Here one block takes a 64-slot tile: each decoded A fragment feeds
// 8 mma token tiles, and the activations are read once per block into shared memory.
//
// Block = 4 warps over the whole K, each warp on its own weight rows (no split-K, no reduction):
//   GEMM1: 16 channels per warp (gate rows and up rows as two mma tiles), 64 per block;
//   GEMM2: 32 rows of w2 per warp (two mma tiles), 128 per block.
// Lane (r = lane/4, c = lane%4) streams its MX block c of rows r and r+8 of each tile from global
// memory into registers one 128-wide K chunk ahead (as the decode kernels do) and decodes it a
// word at a time (mxfp4_mma.cuh). The tile's activations, 64 slots x 128 K (16 KB of bf16) per
// chunk, arrive in a 3-stage ring of shared memory by cp.async issued by all 128 threads; the
// slot rows past the tile's count and the K tail are zero-filled by the copy itself.
//
// Shared-memory layout of one stage: slot row n is 256 bytes = 16 units of 8 bf16 (16 bytes).
// Lane (r, c) reads unit u = 4c + j (the elements of word j of its MX block; its 4 bf16x2 words
// are the B registers of the word's two k-steps as they lie) of rows n = 8*nt + r. In one 8-lane
// phase of a 16-byte load, rows 2q and 2q+1 are read with c = 0..3: unswizzled, units 4c+j hit only
// 2 of the 8 16-byte bank groups. Stored at unit u ^ (bit 3 of u moved to bit 1) ^ (n & 1), the 8
// lanes hit 8 distinct groups.
#pragma once

#include <cstdint>

#include "gemm_common.cuh"
#include "mxfp4_mma.cuh"
#include "pdl.cuh"

namespace mxq::moe::cuda::detail {

constexpr int kWideWarps = 4;
constexpr int kWideStages = 3;
constexpr int kWideChunk = 128;                   // K values per stage and per weight load
constexpr int kWideRowBytes = kWideChunk * 2;     // one slot's bf16 activations per stage
constexpr int kWideNTiles = kWideTileTokens / 8;  // mma token tiles per slot tile
constexpr int kWideStageBytes = kWideTileTokens * kWideRowBytes;
constexpr int kWideSmemBytes = kWideStages * kWideStageBytes;  // 48 KB (+ 512 B static)
constexpr int kWideBlocksPerSm = 3;  // <= 168 registers per thread; 144 KB of shared memory
constexpr int kWideGemm1Channels = 16 * kWideWarps;  // channels per GEMM1 block
constexpr int kWideGemm2Rows = 32 * kWideWarps;      // w2 rows per GEMM2 block

__device__ __forceinline__ int wide_unit(int n, int u) {
  return u ^ (((u >> 3) & 1) << 1) ^ (n & 1);
}

__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  // src-size 0 writes 16 zero bytes and reads nothing.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// One lane's weights of one chunk: MX block c of rows r and r+8 of both mma tiles.
struct WideWeightRegs {
  uint4 w[2][2];
  std::uint32_t scale[2][2];
};

// Where a lane's 4 weight rows start: row (a, h) = first + a * tile_step + 8 h (in rows), so the
// loop keeps two pointers and two strides instead of eight pointers.
struct WideRows {
  const std::uint8_t* w;      // row (0, 0) of the packed FP4 weights
  const std::uint8_t* scale;  // its E8M0 scales
  int tile_step;              // rows from tile 0 to tile 1 (GEMM1: P, up rows; GEMM2: 16)
  int pitch;                  // bytes per weight row (K / 2)
};

__device__ __forceinline__ void load_wide_weights(const WideRows& rows, int k0, bool has_block,
                                                  WideWeightRegs& regs) {
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::size_t row = static_cast<std::size_t>(a * rows.tile_step + 8 * h);
      regs.w[a][h] =
          has_block ? load_stream_16(rows.w + row * rows.pitch + k0 / 2) : make_uint4(0, 0, 0, 0);
      regs.scale[a][h] = has_block ? __ldg(rows.scale + row * (rows.pitch / 16) + k0 / 32) : 127U;
    }
}

// acc[a][nt] += tile a of this chunk's weights x token tile nt of the staged activations.
template <bool kWideScales>
__device__ __forceinline__ void wide_mma_chunk(const WideWeightRegs& regs,
                                               const std::uint8_t* stage, int lane,
                                               float (&acc)[2][kWideNTiles][4]) {
  const int r = lane / 4;
  const int c = lane % 4;
  ScaleFactors f[2][2];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int h = 0; h < 2; ++h) f[a][h] = e8m0_scale_factors(regs.scale[a][h]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    std::uint32_t frag[2][2][4];  // [tile][k-step][A registers]
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const std::uint32_t w0[4] = {regs.w[a][0].x, regs.w[a][0].y, regs.w[a][0].z, regs.w[a][0].w};
      const std::uint32_t w1[4] = {regs.w[a][1].x, regs.w[a][1].y, regs.w[a][1].z, regs.w[a][1].w};
      std::uint32_t lo[4];  // row r
      std::uint32_t hi[4];  // row r + 8
      decode_e2m1x8<kWideScales>(w0[j], f[a][0], lo);
      decode_e2m1x8<kWideScales>(w1[j], f[a][1], hi);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        frag[a][h][0] = lo[2 * h];
        frag[a][h][1] = hi[2 * h];
        frag[a][h][2] = lo[2 * h + 1];
        frag[a][h][3] = hi[2 * h + 1];
      }
    }
    const int unit = 4 * c + j;
#pragma unroll
    for (int nt = 0; nt < kWideNTiles; ++nt) {
      const int n = 8 * nt + r;
      const uint4 xv =
          *reinterpret_cast<const uint4*>(stage + n * kWideRowBytes + wide_unit(n, unit) * 16);
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
  const int expert = args.ws.tile_expert[tile];
  const int slot0 = args.ws.tile_slot0[tile];
  const int rows = args.ws.tile_rows[tile];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int r = lane / 4;
  const int c = lane % 4;
  const int k_total = kGemm1 ? args.w.hidden : args.w.inter;
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

  // This warp's rows. A warp past the matrix's last row (I or H not a multiple of the block's
  // rows) computes on the block's first rows and stores nothing; it still copies activations.
  int first;  // GEMM1: first channel; GEMM2: first w2 row
  bool warp_stores;
  WideRows wrows;
  if constexpr (kGemm1) {
    first = blockIdx.x * kWideGemm1Channels + warp * 16;
    warp_stores = first < args.w.inter;
    const int valid_first = warp_stores ? first : blockIdx.x * kWideGemm1Channels;
    const std::size_t gate = static_cast<std::size_t>(expert) * 2 * P + valid_first + r;
    wrows = {args.w.w13 + gate * (args.w.hidden / 2),
             args.w.w13_scale + gate * (args.w.hidden / 32), P, args.w.hidden / 2};
  } else {
    first = blockIdx.x * kWideGemm2Rows + warp * 32;
    warp_stores = first < args.w.hidden;
    const int valid_first = warp_stores ? first : blockIdx.x * kWideGemm2Rows;
    const std::size_t w2_row = static_cast<std::size_t>(expert) * args.w.hidden + valid_first + r;
    wrows = {args.w.w2 + w2_row * (P / 2), args.w.w2_scale + w2_row * (P / 32), 16, P / 2};
  }
  __syncthreads();  // slot_row

  const std::uint32_t smem_base = shared_address(wide_smem);
  const int chunks = (k_total + kWideChunk - 1) / kWideChunk;
  // Stage `chunk` of the activations: 64 rows x 16 units, 8 units per thread.
  const auto copy_stage = [&](int chunk) {
    const std::uint32_t stage = smem_base + (chunk % kWideStages) * kWideStageBytes;
    for (int q = threadIdx.x; q < kWideTileTokens * 16; q += blockDim.x) {
      const int n = q / 16;
      const int u = q % 16;
      const int k = chunk * kWideChunk + u * 8;
      const std::uint16_t* src = slot_row[n];
      const bool valid = src != nullptr && k < k_total;
      cp_async_16(stage + n * kWideRowBytes + wide_unit(n, u) * 16, valid ? src + k : args.x,
                  valid);
    }
  };
#pragma unroll
  for (int s = 0; s < kWideStages - 1; ++s) {
    if (s < chunks) copy_stage(s);
    cp_async_commit();
  }

  float acc[2][kWideNTiles][4] = {};
  WideWeightRegs next;
  load_wide_weights(wrows, 32 * c, 32 * c < k_total, next);
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const WideWeightRegs cur = next;
    const int k_next = (chunk + 1) * kWideChunk + 32 * c;
    load_wide_weights(wrows, k_next, chunk + 1 < chunks && k_next < k_total, next);
    cp_async_wait<kWideStages - 2>();  // this thread's copies of `chunk` have landed
    __syncthreads();  // everyone's have, and nobody still reads the stage refilled below
    if (chunk + kWideStages - 1 < chunks) copy_stage(chunk + kWideStages - 1);
    cp_async_commit();  // possibly empty: keeps one group per chunk for the wait above
    const std::uint8_t* stage = wide_smem + (chunk % kWideStages) * kWideStageBytes;
    bool wide = false;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h) wide = wide || (cur.scale[a][h] - 129U < 126U);
    if (__any_sync(0xFFFFFFFFU, wide)) {
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
        store_gemm1(args, expert, first + m, slot0 + col, acc[0][nt][i], acc[1][nt][i]);
      } else {
        store_gemm2(args, expert, first + m, slot0 + col, acc[0][nt][i]);
        store_gemm2(args, expert, first + 16 + m, slot0 + col, acc[1][nt][i]);
      }
    }
}

// Row blocks of a wide GEMM launch.
inline int wide_row_blocks(const MoeDeviceWeights& w, bool gemm1) {
  return gemm1 ? (w.inter + kWideGemm1Channels - 1) / kWideGemm1Channels
               : (w.hidden + kWideGemm2Rows - 1) / kWideGemm2Rows;
}

}  // namespace mxq::moe::cuda::detail
