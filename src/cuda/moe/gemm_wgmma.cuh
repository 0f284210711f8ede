// The wgmma grouped GEMMs of the MoE forward (GemmVariant::kWgmmaTile), for prefill.
//
// Why: the wide_tile kernels feed each decoded weight fragment to mma.sync, whose issue and
// dependent-latency cost kept the tensor pipe ~36% busy (docs/PERF.md). Here the decoded weights
// are the register A operand of wgmma (m64 x n64/n128 x k16): one instruction per warpgroup and
// k-step does the work of 16-32 mma.sync, and runs asynchronously while the warps decode the
// next chunk.
//
// Block = 2 warpgroups, each on 64 weight rows (A rows), over a 128-slot work tile (B columns):
//   GEMM1: warp w of warpgroup g holds 8 channels: A rows 0..7 their gate rows, 8..15 their up
//          rows, so each lane's accumulators hold gate and up of the same (channel, slot) and the
//          SwiGLU epilogue needs no exchange; 64 channels per block;
//   GEMM2: warpgroup g takes 64 rows of w2; 128 per block.
// Tiles of at most 64 slots run the n64 instruction (half the tensor work and copies).
// Per 128-wide K chunk a stage holds the tile's activations (two 64-wide K atoms of 128 slots x
// 128 bytes, 128-byte swizzled as wgmma's descriptor expects), 128 weight rows x 64 bytes and
// their scales; cp.async fills stage i + 2 while chunk i is decoded and multiplied, 4 stages
// (the stage of chunk i - 1 may still be read by its wgmma until the wait at the end of
// iteration i). The A fragments of consecutive chunks live in two register sets, so decoding
// chunk i + 1 never touches registers a running wgmma reads.
// The activations arrive in the wgmma K order (wgmma_k_order.h): GEMM1 reads a permuted copy of
// x (permute_activations_kernel), GEMM1's epilogue writes the GEMM2 activations permuted.
// Lane (r, c) decodes word c of MX block b of its rows r and r + 8: the A fragments of k-steps 2b
// and 2b + 1 (mxfp4_mma.cuh). Weight rows in a stage keep their 4 MX blocks at unit
// b ^ ((row / 2) % 4), so the 32 lanes' 4-byte reads hit 32 distinct banks.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/linear/device_ptx.cuh"
#include "gemm_common.cuh"
#include "mxfp4_mma.cuh"
#include "pdl.cuh"
#include "wgmma_k_order.h"

namespace mxq::moe::cuda::detail {

constexpr int kWgmmaGroups = 2;  // consumer warpgroups per block
constexpr int kWgmmaThreads = 128 * kWgmmaGroups;
constexpr int kWgmmaStages = 4;
constexpr int kWgmmaLookahead = 2;  // chunks in flight ahead of the one multiplied
constexpr int kWgmmaChunk = 128;    // K values per stage
constexpr int kWgmmaAtomBytes = kWgmmaTileTokens * 128;            // 64 K values of every slot
constexpr int kWgmmaXBytes = 2 * kWgmmaAtomBytes;                  // 32 KB
constexpr int kWgmmaRows = 64 * kWgmmaGroups;                      // weight rows per stage
constexpr int kWgmmaWBytes = kWgmmaRows * (kWgmmaChunk / 2);       // 8 KB
constexpr int kWgmmaScaleBytes = kWgmmaRows * (kWgmmaChunk / 32);  // 512 B
// x stages first (1024-byte aligned atoms), then weights, then scales; + slack to align the base.
constexpr int kWgmmaSmemBytes =
    kWgmmaStages * (kWgmmaXBytes + kWgmmaWBytes + kWgmmaScaleBytes) + 1024;
constexpr int kWgmmaGemm1Channels = 32 * kWgmmaGroups;  // channels per GEMM1 block
constexpr int kWgmmaGemm2Rows = 64 * kWgmmaGroups;      // w2 rows per GEMM2 block
static_assert(kWgmmaRows <= kWgmmaThreads, "one scale row per thread");
constexpr std::uint32_t kNoRow = 0xFFFFFFFFU;  // a tile slot without activations

// acc (64 x kN fp32, warpgroup fragments) += A (64 x 16 bf16, registers) * B (16 x kN bf16,
// K-major in shared memory, 128-byte swizzle).
template <int kN>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[kN / 2], const std::uint32_t (&a)[4],
                                              std::uint64_t desc_b, bool accumulate);

template <>
__device__ __forceinline__ void wgmma_bf16_rs<64>(float (&d)[32], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

template <>
__device__ __forceinline__ void wgmma_bf16_rs<128>(float (&d)[64], const std::uint32_t (&a)[4],
                                                   std::uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// Writes activations permuted into the wgmma K order: xp[t][wgmma_k_position(k)] = x[t][k].
// One thread per 16-byte unit of xp: 4 bf16x2 pairs of one MX block, gathered from 4 places.
__global__ void permute_activations_kernel(const std::uint32_t* __restrict__ x,
                                           uint4* __restrict__ xp, int tokens, int hidden) {
  const int units_per_row = hidden / 8;
  const std::size_t units = static_cast<std::size_t>(tokens) * units_per_row;
  for (std::size_t q = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; q < units;
       q += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t row = q / units_per_row;
    const int unit = static_cast<int>(q % units_per_row);
    // Positions 4v .. 4v + 3 of block b hold pairs with h = v / 2, u = v % 2 and c = 0..3.
    const int block = unit / 4;
    const int v = unit % 4;
    const std::uint32_t* src = x + row * (hidden / 2) + 16 * block;
    const int h = v / 2;
    const int u = v % 2;
    uint4 out;
    out.x = __ldg(src + 0 + 2 * h + u);
    out.y = __ldg(src + 4 + 2 * h + u);
    out.z = __ldg(src + 8 + 2 * h + u);
    out.w = __ldg(src + 12 + 2 * h + u);
    xp[q] = out;
  }
}

// The work of one block on one tile with the n = kN instruction (kN >= the tile's slots).
template <bool kGemm1, int kN>
__device__ __forceinline__ void wgmma_tile_gemm(const GemmArgs& args, const WorkTile& tile,
                                                std::uint8_t* smem, const uint4* x_rows,
                                                const std::uint32_t* slot_vec) {
  using namespace mxq::linear::device;  // cp.async, wgmma, fences
  const int tid = static_cast<int>(threadIdx.x);
  const int group = tid / 128;
  const int warp = (tid / 32) % 4;
  const int lane = tid % 32;
  const int r = lane / 4;
  const int c = lane % 4;
  const int k_total = kGemm1 ? args.w.hidden : args.w.inter;
  const int P = args.w.inter_padded;
  const int matrix_rows = kGemm1 ? args.w.inter : args.w.hidden;
  const int block_first = blockIdx.x * (kGemm1 ? kWgmmaGemm1Channels : kWgmmaGemm2Rows);
  const std::size_t expert_row =
      static_cast<std::size_t>(tile.expert) * (kGemm1 ? 2 * P : args.w.hidden);
  const int pitch = kGemm1 ? args.w.hidden / 2 : P / 2;  // bytes per packed row
  const int scale_pitch = pitch / 16;
  const std::uint8_t* weights = kGemm1 ? args.w.w13 : args.w.w2;
  const std::uint8_t* scales = kGemm1 ? args.w.w13_scale : args.w.w2_scale;
  // Global row of stage row s (64 g + 16 w + i), or -1 past the matrix. GEMM1: rows i < 8 are the
  // gate rows of channels block_first + 32 g + 8 w + i, rows i >= 8 their up rows (P further).
  const auto stage_row_global = [&](int s) -> std::int64_t {
    if constexpr (kGemm1) {
      const int channel = block_first + 32 * (s / 64) + 8 * ((s / 16) % 4) + s % 8;
      if (channel >= matrix_rows) return -1;
      return static_cast<std::int64_t>(expert_row) + channel + (s % 16 >= 8 ? P : 0);
    } else {
      const int row = block_first + s;
      if (row >= matrix_rows) return -1;
      return static_cast<std::int64_t>(expert_row) + row;
    }
  };
  const std::int64_t my_scale_row = tid < kWgmmaRows ? stage_row_global(tid) : -1;
  const std::uint8_t* my_scales =
      my_scale_row >= 0 ? scales + static_cast<std::size_t>(my_scale_row) * scale_pitch : nullptr;

  const std::uint32_t x_base = smem_addr(smem);
  const std::uint32_t w_base = x_base + kWgmmaStages * kWgmmaXBytes;
  std::uint8_t* const w_smem = smem + kWgmmaStages * kWgmmaXBytes;
  std::uint8_t* const scale_smem = w_smem + kWgmmaStages * kWgmmaWBytes;
  const int chunks = (k_total + kWgmmaChunk - 1) / kWgmmaChunk;

  // This thread's copies of every stage, fixed but for the chunk's K offset (the copies are most
  // of a chunk's non-tensor instructions, so their addresses are worked out once):
  //   activations: 16-byte unit x_unit (atom x_unit / 8) of slots n0 + 16 j, j < kN / 16: the
  //   swizzle term n % 8 is n0 % 8 for all of them;
  //   weights: MX block tid % 4 of stage rows tid / 4 + 64 j, j < 2.
  // Slots past the tile's rows are not copied: their B columns only reach accumulator columns
  // that are never stored. Their K tail is zero-filled (stale values times zero weights could be
  // NaN); so are the weights' (stale weights past the matrix only reach rows never stored).
  const int x_unit = tid % 16;
  const int n0 = tid / 16;
  const std::uint32_t x_dst =
      (x_unit / 8) * kWgmmaAtomBytes + n0 * 128 + (((x_unit % 8) ^ (n0 % 8)) * 16);
  constexpr int kXCopies = kN / 16;
  std::uint32_t x_src[kXCopies];  // vector index of the unit at chunk 0, or kNoRow
#pragma unroll
  for (int j = 0; j < kXCopies; ++j) {
    const std::uint32_t row = slot_vec[n0 + 16 * j];
    x_src[j] = row == kNoRow ? kNoRow : row + x_unit;
  }
  constexpr int kWCopies = kWgmmaRows * 4 / kWgmmaThreads;
  const std::uint8_t* w_src[kWCopies];
  std::uint32_t w_dst[kWCopies];
#pragma unroll
  for (int j = 0; j < kWCopies; ++j) {
    const int s = tid / 4 + (kWgmmaThreads / 4) * j;
    const int b = tid % 4;
    const std::int64_t row = stage_row_global(s);
    w_src[j] = row >= 0 ? weights + static_cast<std::size_t>(row) * pitch + 16 * b : nullptr;
    w_dst[j] = s * (kWgmmaChunk / 2) + ((b ^ ((s / 2) % 4)) * 16);
  }
  const auto copy_stage = [&](int chunk) {
    const int stage = chunk % kWgmmaStages;
    const std::uint32_t x_stage = x_base + stage * kWgmmaXBytes + x_dst;
    const bool x_in_k = chunk * kWgmmaChunk + 8 * x_unit < k_total;
#pragma unroll
    for (int j = 0; j < kXCopies; ++j) {
      if (x_src[j] == kNoRow) continue;
      cp_async_16(x_stage + j * 16 * 128,
                  x_in_k ? x_rows + x_src[j] + chunk * (kWgmmaChunk / 8) : x_rows, x_in_k ? 16 : 0);
    }
    const std::uint32_t w_stage = w_base + stage * kWgmmaWBytes;
    const bool w_in_k = chunk * kWgmmaChunk + 32 * (tid % 4) < k_total;
#pragma unroll
    for (int j = 0; j < kWCopies; ++j) {
      if (w_src[j] == nullptr) continue;
      cp_async_16(w_stage + w_dst[j], w_in_k ? w_src[j] + chunk * (kWgmmaChunk / 2) : w_src[j],
                  w_in_k ? 16 : 0);
    }
  };
  // This thread's scale row for `chunk`: 4 bytes packed little-endian (0 past the matrix or K,
  // where the weights are zero too).
  const auto load_scales = [&](int chunk) -> std::uint32_t {
    std::uint32_t packed = 0;
    if (my_scales == nullptr || chunk >= chunks) return 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int k = chunk * kWgmmaChunk + 32 * b;
      if (k < k_total) packed |= static_cast<std::uint32_t>(__ldg(my_scales + k / 32)) << (8 * b);
    }
    return packed;
  };
  const auto store_scales = [&](int chunk, std::uint32_t packed) {
    if (tid < kWgmmaRows)
      *reinterpret_cast<std::uint32_t*>(scale_smem + (chunk % kWgmmaStages) * kWgmmaScaleBytes +
                                        tid * 4) = packed;
  };
#pragma unroll
  for (int s = 0; s < kWgmmaLookahead; ++s) {
    if (s < chunks) {
      copy_stage(s);
      store_scales(s, load_scales(s));
    }
    cp_async_commit();
  }
  // Scales of chunk i + 2 are loaded in iteration i and stored in iteration i + 1, when their
  // stage is free (its last reader, chunk i - 2, finished before iteration i's barrier); the
  // barrier of iteration i + 2 publishes them.
  std::uint32_t pending_scales = load_scales(kWgmmaLookahead);

  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0F;
  const int row_lo = 64 * group + 16 * warp + r;  // stage rows of this lane: row_lo, row_lo + 8
  const int unit_xor = (r / 2) % 4;               // (row / 2) % 4 for both rows
  std::uint32_t frag_even[8][4];
  std::uint32_t frag_odd[8][4];
  const auto step = [&](int chunk, std::uint32_t(&frag)[8][4]) {
    cp_async_wait<kWgmmaLookahead - 1>();  // this thread's copies of `chunk` have landed
    fence_proxy_async_shared();            // ... and are visible to wgmma's reads
    __syncthreads();  // everyone's have; stage (chunk + 2) % 4 is no longer read by anyone
    if (chunk + kWgmmaLookahead < chunks) copy_stage(chunk + kWgmmaLookahead);
    cp_async_commit();  // possibly empty: one group per chunk for the wait above
    if (chunk >= 1 && chunk + 1 < chunks) store_scales(chunk + 1, pending_scales);
    if (chunk >= 1) pending_scales = load_scales(chunk + kWgmmaLookahead);

    const int stage = chunk % kWgmmaStages;
    const std::uint8_t* w_stage = w_smem + stage * kWgmmaWBytes;
    const std::uint8_t* s_stage = scale_smem + stage * kWgmmaScaleBytes;
    const std::uint32_t scale_lo = *reinterpret_cast<const std::uint32_t*>(s_stage + row_lo * 4);
    const std::uint32_t scale_hi =
        *reinterpret_cast<const std::uint32_t*>(s_stage + (row_lo + 8) * 4);
    std::uint32_t words_lo[4];
    std::uint32_t words_hi[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int offset = ((b ^ unit_xor) * 16) + 4 * c;
      words_lo[b] = *reinterpret_cast<const std::uint32_t*>(w_stage + row_lo * 64 + offset);
      words_hi[b] = *reinterpret_cast<const std::uint32_t*>(w_stage + (row_lo + 8) * 64 + offset);
    }
    std::uint32_t scale_bytes[4][2];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      scale_bytes[b][0] = (scale_lo >> (8 * b)) & 0xFFU;
      scale_bytes[b][1] = (scale_hi >> (8 * b)) & 0xFFU;
    }
    const auto decode = [&](auto wide_scales) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        decode_word_pair_fragments<decltype(wide_scales)::value>(
            words_lo[b], words_hi[b], e8m0_scale_factors(scale_bytes[b][0]),
            e8m0_scale_factors(scale_bytes[b][1]), frag[2 * b], frag[2 * b + 1]);
      }
    };
    if (warp_any_wide_scale(scale_bytes)) {
      decode(std::true_type{});
    } else {
      decode(std::false_type{});
    }
    const std::uint32_t x_stage = x_base + stage * kWgmmaXBytes;
    wgmma_fence();  // the fragments (and, first time, the zeroed accumulators) are written
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const std::uint64_t desc =
          wgmma_desc_k128_sw128(x_stage + (s / 4) * kWgmmaAtomBytes + (s % 4) * 32);
      wgmma_bf16_rs<kN>(acc, frag[s], desc, true);
    }
    wgmma_commit();
    wgmma_wait<1>();  // chunk - 1's wgmma are done: its fragments and stage are free
  };
  for (int chunk = 0; chunk < chunks; chunk += 2) {
    step(chunk, frag_even);
    if (chunk + 1 < chunks) step(chunk + 1, frag_odd);
  }
  wgmma_wait<0>();
  wgmma_fence_operands(acc);
  allow_dependents();

  // acc[4 i + j]: A row 16 warp + r (+ 8 for j >= 2), slot column 8 i + 2 c + (j & 1).
#pragma unroll
  for (int i = 0; i < kN / 8; ++i)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int col = 8 * i + 2 * c + t;
      if (col >= tile.rows) continue;
      if constexpr (kGemm1) {
        const int channel = block_first + 32 * group + 8 * warp + r;
        if (channel < matrix_rows)
          store_gemm1<true>(args, tile.expert, channel, tile.slot0 + col, acc[4 * i + t],
                            acc[4 * i + 2 + t]);
      } else {
        const int row = block_first + 64 * group + 16 * warp + r;
        if (row < matrix_rows)
          store_gemm2(args, tile.expert, row, tile.slot0 + col, acc[4 * i + t]);
        if (row + 8 < matrix_rows)
          store_gemm2(args, tile.expert, row + 8, tile.slot0 + col, acc[4 * i + 2 + t]);
      }
    }
}

template <bool kGemm1>
__global__ void __launch_bounds__(kWgmmaThreads, 1) gemm_wgmma_kernel(GemmArgs args) {
  wait_for_predecessor();
  const int tile_index = blockIdx.y;
  if (tile_index >= *args.ws.num_tiles) return;
  extern __shared__ std::uint8_t wgmma_smem_raw[];
  // The first 16-byte vector of each tile slot's activation row in x_rows, kNoRow past the tile.
  __shared__ std::uint32_t slot_vec[kWgmmaTileTokens];
  const WorkTile tile = read_work_tile(args.ws, tile_index);
  const uint4* x_rows = kGemm1 ? reinterpret_cast<const uint4*>(args.ws.x_wgmma)
                               : reinterpret_cast<const uint4*>(args.ws.act);
  for (int n = static_cast<int>(threadIdx.x); n < kWgmmaTileTokens; n += kWgmmaThreads) {
    std::uint32_t row = kNoRow;
    if (n < tile.rows) {
      row = kGemm1 ? static_cast<std::uint32_t>(args.ws.slot_pair[tile.slot0 + n] / args.top_k) *
                         static_cast<std::uint32_t>(args.w.hidden / 8)
                   : static_cast<std::uint32_t>(tile.slot0 + n) *
                         static_cast<std::uint32_t>(args.w.inter / 8);
    }
    slot_vec[n] = row;
  }
  __syncthreads();
  // The swizzle pattern is a function of address bits: the atoms must be 1024-byte aligned.
  const std::uint32_t raw = mxq::linear::device::smem_addr(wgmma_smem_raw);
  std::uint8_t* smem = wgmma_smem_raw + ((1024U - (raw % 1024U)) % 1024U);
  if (tile.rows <= 64) {
    wgmma_tile_gemm<kGemm1, 64>(args, tile, smem, x_rows, slot_vec);
  } else {
    wgmma_tile_gemm<kGemm1, kWgmmaTileTokens>(args, tile, smem, x_rows, slot_vec);
  }
}

// Row blocks of a wgmma GEMM launch.
inline int wgmma_row_blocks(const MoeDeviceWeights& w, bool gemm1) {
  return gemm1 ? (w.inter + kWgmmaGemm1Channels - 1) / kWgmmaGemm1Channels
               : (w.hidden + kWgmmaGemm2Rows - 1) / kWgmmaGemm2Rows;
}

}  // namespace mxq::moe::cuda::detail
