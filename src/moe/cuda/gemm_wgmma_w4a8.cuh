// The wgmma grouped GEMMs of the W4A8 MoE forward (GemmVariant::kPrefillWgmma with E4M3
// activations): Hopper's FP8 tensor cores, twice the bf16 rate of gemm_wgmma.cuh's W4A16 kernel.
//
// The weights are decoded to E4M3 in registers (the register A operand of wgmma m64nNk32) by a
// byte table per row and MX block (w4a8_layout.h). The MX block scales are folded into those
// tables: in each 128-wide K chunk a row's blocks are written as e2m1 * 2^(6 - e_b), e_b = its
// scale's distance below the row's largest scale in the chunk, all exact in E4M3 while e_b <= 11.
// The chunk's 4 wgmma then accumulate into one register set `part` (from zero: the tensor core's
// reduced-precision FP8 accumulation spans 128 products, as in DeepGEMM), and one multiply-add
// per output promotes it into the fp32 sum: acc += part * 2^(max - 133) * x_scale[slot]. A chunk
// in which some row's blocks span more binades (rare; a NaN scale too) takes one wgmma and one
// promotion per MX block instead (a warpgroup vote: wgmma needs the warpgroup on one path).
// Promoting per block always would cost as much CUDA-core work as the tensor work
// (docs/perf-log/moe-prefill.md).
//
// Block = 2 consumer warpgroups, each on 64 weight rows over a work tile of up to 128 slots (and up
// to kW4a8TileExtra more in an expert's last tile: a second wgmma on the same decoded fragments,
// with its own part and sum, as in gemm_wgmma.cuh), and
// a producer warpgroup that gives its registers to the consumers (setmaxnreg: two fp32 sets of a
// 64 x 128 tile are 128 registers a thread, beyond the 128-register cap of the W4A16 kernel's 13
// warps):
//   GEMM1: warp w of warpgroup g holds channels 32 g + 8 w .. + 7 of the block: A rows 0..7 their
//          gate rows, 8..15 their up rows (the SwiGLU epilogue needs no exchange); 64 channels;
//   GEMM2: warpgroup g takes 64 rows of w2; 128 per block.
// One producer thread fills a ring of stages by TMA, each one 128-wide K chunk: the tile's E4M3
// activations (rows by slot, 128 bytes a row, 128-byte swizzled, in the instruction's K order:
// w4a8_layout.h), their group scales (one fp32 per slot), and the 128 weight rows in two boxes
// of 64 (row groups, 64-byte swizzled as in gemm_wgmma.cuh; the short last chunk of a row
// unswizzled). Consumers decode chunk q + 1 while the wgmma of chunk q run, then promote chunk q
// and hand its stage back.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda_common/mbarrier.cuh"
#include "cuda_common/pdl.cuh"
#include "cuda_common/smem.cuh"
#include "cuda_common/tma.cuh"
#include "cuda_common/warp_specialization.cuh"
#include "cuda_common/wgmma.cuh"
#include "gemm_common.cuh"
#include "moe/layout/row_groups.h"
#include "moe/layout/w4a8_layout.h"
#include "mxfp4_mma.cuh"
#include "wgmma_epilogue.cuh"

namespace mxq::moe::gpu::detail {

constexpr int kW4a8WgmmaGroups = 2;  // consumer warpgroups per block
constexpr int kW4a8WgmmaConsumerThreads = 128 * kW4a8WgmmaGroups;
constexpr int kW4a8WgmmaThreads = kW4a8WgmmaConsumerThreads + 128;  // + the producer warpgroup
// 2 x 128 x 240 + 128 x 24 = 64,512 of the SM's 65,536 registers.
constexpr int kW4a8ConsumerRegisters = 240;
constexpr int kW4a8ProducerRegisters = 24;
constexpr int kW4a8WgmmaStages = 6;
constexpr int kW4a8WgmmaRows = 64 * kW4a8WgmmaGroups;  // weight rows per stage
constexpr int kW4a8WgmmaWBoxRows = 64;                 // rows per weight TMA box
// A stage's activations: 128 slots x 128 E4M3, then the extra slots' rows.
constexpr int kW4a8WgmmaXMainBytes = kWgmmaTileTokens * kW4a8Chunk;
constexpr int kW4a8WgmmaXBytes = kW4a8WgmmaXMainBytes + kW4a8TileExtra * kW4a8Chunk;
constexpr int kW4a8WgmmaWBytes = kW4a8WgmmaRows * kChunkBytes;  // 8 KB
// A stage's activation scales, one fp32 per slot: TMA reads an inner coordinate only at a 16-byte
// boundary (any other is an illegal instruction, which no encode-time check reports), so the box
// starts at the multiple of 4 slots at or below the tile's first and is 4 slots wider than a
// tile; stages 128-byte aligned for TMA.
constexpr int kW4a8WgmmaScaleSlotAlign = 4;
constexpr int kW4a8WgmmaScaleBoxSlots =
    kWgmmaTileTokens + kW4a8TileExtra + kW4a8WgmmaScaleSlotAlign;
constexpr int kW4a8WgmmaScaleBoxBytes = kW4a8WgmmaScaleBoxSlots * 4;
constexpr int kW4a8WgmmaScaleBytes = (kW4a8WgmmaScaleBoxBytes + 127) / 128 * 128;
// Shared memory: x stages first (1024-byte aligned atoms), weights, scales, barriers; + slack.
constexpr int kW4a8WgmmaWOffset = kW4a8WgmmaStages * kW4a8WgmmaXBytes;
constexpr int kW4a8WgmmaScaleOffset = kW4a8WgmmaWOffset + kW4a8WgmmaStages * kW4a8WgmmaWBytes;
constexpr int kW4a8WgmmaBarrierOffset =
    kW4a8WgmmaScaleOffset + kW4a8WgmmaStages * kW4a8WgmmaScaleBytes;
constexpr int kW4a8WgmmaSmemBytes = kW4a8WgmmaBarrierOffset + 2 * kW4a8WgmmaStages * 8 + 1024;
constexpr int kW4a8WgmmaGemm1Channels = 32 * kW4a8WgmmaGroups;  // channels per GEMM1 block
constexpr int kW4a8WgmmaGemm2Rows = 64 * kW4a8WgmmaGroups;      // w2 rows per GEMM2 block
constexpr int kW4a8WgmmaWBoxGroups = kW4a8WgmmaWBoxRows / kGroupRows;
static_assert(kW4a8WgmmaWBoxRows % kGroupRows == 0, "a weight box is whole row groups");

// The TMA views of a GEMM's operands (built by the launcher): the E4M3 activations [slots,
// w4a8_act_pitch(K)] bytes in boxes of 64, 16 or 32 slots x 128 (128-byte swizzle; a narrow tile
// copies only its own rows, as in gemm_wgmma.cuh); their scales [groups,
// w4a8_wgmma_scale_pitch(slots)] fp32 in boxes of kW4a8WgmmaScaleBoxSlots slots x 1 group; the
// weights as WgmmaMaps::w / w_short (gemm_wgmma.cuh) in boxes of kW4a8WgmmaWBoxGroups row groups.
struct W4a8WgmmaMaps {
  CUtensorMap x;
  CUtensorMap x16;
  CUtensorMap x32;
  CUtensorMap x_scale;
  CUtensorMap w;
  CUtensorMap w_short;
};

// One chunk of a lane's two rows, decoded: the A fragments of the chunk's 4 MX blocks (k32 steps)
// and what the promotion needs (the rows' packed scales; whether the chunk folds).
struct W4a8DecodedChunk {
  std::uint32_t frag[4][4];
  std::uint32_t scale_lo;
  std::uint32_t scale_hi;
  std::uint32_t max_lo;
  std::uint32_t max_hi;
  bool folds;
};

// 2^(s - 133) = 2^(s - 127) * 2^-6 (the tables' 2^6 placement), NaN for s = 255.
__device__ __forceinline__ float w4a8_wgmma_row_factor(std::uint32_t s) {
  return __uint_as_float(w4a8_exact_scale_bits(s)) * 0.015625F;
}

// The work of one block (row block blockIdx.x of a tile) with the n = kN instruction, and with
// kExtra > 0 an n = kExtra one on the slots past the first 128 (kN = 128).
template <bool kGemm1, int kN, int kExtra = 0>
__device__ __forceinline__ void w4a8_wgmma_tile_gemm(const GemmArgs& args,
                                                     const W4a8WgmmaMaps& maps,
                                                     const WorkTile& tile, std::uint8_t* smem) {
  using namespace mxq::ptx;  // TMA, mbarrier, wgmma
  static_assert(kExtra == 0 || (kN == kWgmmaTileTokens && kExtra <= kW4a8TileExtra));
  // Slot rows copied per stage: the tile's width (16, 32 or 64-row boxes).
  const CUtensorMap* const x_map = kN == 16 ? &maps.x16 : (kN == 32 ? &maps.x32 : &maps.x);
  constexpr int kXBoxRows = kN < 64 ? kN : 64;
  const int tid = static_cast<int>(threadIdx.x);
  const int block_first = blockIdx.x * (kGemm1 ? kW4a8WgmmaGemm1Channels : kW4a8WgmmaGemm2Rows);
  const int chunks = (streamed_k(args.w, kGemm1) + kW4a8Chunk - 1) / kW4a8Chunk;
  const int stored_k = stored_row_k(args.w, kGemm1);
  const int stored_full = stored_k / kW4a8Chunk;
  const int short_blocks = chunk_blocks(stored_k, stored_full);
  auto* const full = reinterpret_cast<std::uint64_t*>(smem + kW4a8WgmmaBarrierOffset);
  std::uint64_t* const empty = full + kW4a8WgmmaStages;
  // Stage rows: GEMM1 rows 0..63 the gate rows of the block's channels, 64..127 their up rows;
  // GEMM2 rows 0..127 the block's w2 rows.
  const WgmmaBlockRows<kGemm1, kW4a8WgmmaWBoxRows> rows{args.w, tile.expert, block_first};

  if (tid >= kW4a8WgmmaConsumerThreads) {  // ---- producer warpgroup: one thread issues
    setmaxnreg_dec<kW4a8ProducerRegisters>();
    if (tid != kW4a8WgmmaConsumerThreads) return;
    // Boxes past the block's rows or the tile's slots read other rows or zeros: they reach only
    // accumulators that are never stored.
    const int scale_box_slot0 = tile.slot0 - tile.slot0 % kW4a8WgmmaScaleSlotAlign;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const int stage = chunk % kW4a8WgmmaStages;
      if (chunk >= kW4a8WgmmaStages)
        mbarrier_wait(&empty[stage], ((chunk / kW4a8WgmmaStages) - 1) & 1);
      std::uint8_t* const x_stage = smem + stage * kW4a8WgmmaXBytes;
      std::uint8_t* const w_stage = smem + kW4a8WgmmaWOffset + stage * kW4a8WgmmaWBytes;
      std::uint8_t* const s_stage = smem + kW4a8WgmmaScaleOffset + stage * kW4a8WgmmaScaleBytes;
      const bool short_chunk = chunk >= stored_full;
      mbarrier_arrive_expect_tx(
          &full[stage], (kN + kExtra) * kW4a8Chunk + kW4a8WgmmaScaleBoxBytes +
                            (short_chunk ? kW4a8WgmmaRows * 16 * short_blocks : kW4a8WgmmaWBytes));
#pragma unroll
      for (int box = 0; box < kN / kXBoxRows; ++box)
        tma_load_2d(x_stage + box * kXBoxRows * kW4a8Chunk, x_map, &full[stage], chunk * kW4a8Chunk,
                    tile.slot0 + kXBoxRows * box);
      if constexpr (kExtra > 0) {  // the extra slots: one box of their width
        tma_load_2d(x_stage + kW4a8WgmmaXMainBytes, kExtra == 16 ? &maps.x16 : &maps.x32,
                    &full[stage], chunk * kW4a8Chunk, tile.slot0 + kWgmmaTileTokens);
      }
      tma_load_2d(s_stage, &maps.x_scale, &full[stage], scale_box_slot0, chunk);
      rows.tma_load_chunk(w_stage, &maps.w, &maps.w_short, &full[stage], chunk, short_chunk);
    }
    return;
  }

  // ---- consumers
  setmaxnreg_inc<kW4a8ConsumerRegisters>();
  const int group = tid / 128;
  const int warp = (tid / 32) % 4;
  const int lane = tid % 32;
  const int r = lane / 4;
  const int c = lane % 4;
  // Stage rows of this lane's A rows r and r + 8.
  const int row_lo = kGemm1 ? 32 * group + 8 * warp + r : 64 * group + 16 * warp + r;
  constexpr int kHiRows = kGemm1 ? kW4a8WgmmaWBoxRows : 8;  // row_hi - row_lo
  const int row_hi = row_lo + kHiRows;
  // E8M0 scales of the two rows, a chunk's 4 MX blocks packed little-endian (0 past K, where the
  // weights are zero too), loaded one chunk ahead of their decode. A row past the matrix reads
  // row 0's (WgmmaBlockRows::scale_row), and the look-ahead past the last chunk reads the last
  // one again: no predicate per chunk.
  const std::uint8_t* const scales_lo = rows.scale_row(row_lo);
  const std::uint8_t* const scales_hi = rows.scale_row(row_hi);
  const int last_chunk = chunks - 1;
  std::uint32_t next_scale_lo = load_chunk_scales(scales_lo, 0);
  std::uint32_t next_scale_hi = load_chunk_scales(scales_hi, 0);
  // Shared-memory addresses held in registers: this lane's 16 bytes of row row_lo in a full chunk
  // (word c of the 4 MX blocks: unit c, 64-byte swizzled), the barriers, the scales of its slot
  // columns 2c, 2c + 1, and the activations' wgmma descriptor.
  const std::uint32_t smem_base = smem_addr(smem);
  const std::uint32_t full_base = smem_base + kW4a8WgmmaBarrierOffset;
  const std::uint32_t empty_base = full_base + kW4a8WgmmaStages * 8;
  const std::uint32_t w_base = smem_base + kW4a8WgmmaWOffset;
  const std::uint32_t w_lane = w_base + row_lo * kChunkBytes + ((c ^ ((r / 2) % 4)) * 16);
  const std::uint32_t xs_lane =
      smem_base + kW4a8WgmmaScaleOffset + 4 * (tile.slot0 % kW4a8WgmmaScaleSlotAlign) + 8 * c;
  const std::uint64_t x_desc = wgmma_desc_k128_sw128(smem_base);
  const auto x_desc_lo = static_cast<std::uint32_t>(x_desc);  // the address field, < 2^14
  const std::uint64_t x_desc_hi = x_desc & ~0xFFFFFFFFULL;
  const int vote_barrier = 1 + group;  // named barrier of this warpgroup (0 is __syncthreads)

  // Waits for chunk `chunk`'s stage and decodes its weights into `d`.
  const auto decode = [&](int chunk, W4a8DecodedChunk& d) {
    const int stage = chunk % kW4a8WgmmaStages;
    mbarrier_wait(full_base + 8 * stage, (chunk / kW4a8WgmmaStages) & 1);
    d.scale_lo = next_scale_lo;
    d.scale_hi = next_scale_hi;
    const int ahead = min(chunk + 1, last_chunk);
    next_scale_lo = load_chunk_scales(scales_lo, ahead);
    next_scale_hi = load_chunk_scales(scales_hi, ahead);
    std::uint32_t lo[4];
    std::uint32_t hi[4];
    int nb = 4;
    if (chunk < stored_full) {
      const std::uint32_t at = w_lane + stage * kW4a8WgmmaWBytes;
      const uint4 vlo = ld_shared_u32x4(at);
      const uint4 vhi = ld_shared_u32x4(at + kHiRows * kChunkBytes);
      lo[0] = vlo.x;
      lo[1] = vlo.y;
      lo[2] = vlo.z;
      lo[3] = vlo.w;
      hi[0] = vhi.x;
      hi[1] = vhi.y;
      hi[2] = vhi.z;
      hi[3] = vhi.w;
    } else {
      // The short chunk: each box's rows short_blocks * 16 bytes apart, unswizzled, lane c's
      // words at c * nb + b; the blocks past them are zero weights.
      nb = short_blocks;
      const auto short_row = [&](int row) -> std::uint32_t {
        return w_base + stage * kW4a8WgmmaWBytes +
               (row / kW4a8WgmmaWBoxRows) * kW4a8WgmmaWBoxRows * kChunkBytes +
               (row % kW4a8WgmmaWBoxRows) * short_blocks * 16 + 4 * c * short_blocks;
      };
      const std::uint32_t at_lo = short_row(row_lo);
      const std::uint32_t at_hi = short_row(row_hi);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        lo[b] = b < nb ? ld_shared_u32(at_lo + 4 * b) : 0U;
        hi[b] = b < nb ? ld_shared_u32(at_hi + 4 * b) : 0U;
      }
    }
    const W4a8ChunkFold fold_lo = w4a8_fold_chunk(d.scale_lo, nb);
    const W4a8ChunkFold fold_hi = w4a8_fold_chunk(d.scale_hi, nb);
    d.folds = named_barrier_all(vote_barrier, 128, fold_lo.folds && fold_hi.folds);
    d.max_lo = fold_lo.max_scale;
    d.max_hi = fold_hi.max_scale;
    // Not folding: every block at 2^6 (shift 0), scaled by its own factor after its wgmma.
    const std::uint32_t shifts_lo = d.folds ? fold_lo.shifts : 0U;
    const std::uint32_t shifts_hi = d.folds ? fold_hi.shifts : 0U;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const W4a8Table t_lo = w4a8_folded_table((shifts_lo >> (8 * b)) & 0xFFU);
      const W4a8Table t_hi = w4a8_folded_table((shifts_hi >> (8 * b)) & 0xFFU);
      // m16n8k32 A: a0 / a1 = rows r / r + 8 at k 4c .. 4c + 3, a2 / a3 at k 16 + 4c .. + 3.
      w4a8_registers(lo[b], t_lo, d.frag[b][0], d.frag[b][2]);
      w4a8_registers(hi[b], t_hi, d.frag[b][1], d.frag[b][3]);
    }
  };

  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0F;
  float part[kN / 2];
  constexpr int kExtraAcc = kExtra > 0 ? kExtra / 2 : 1;  // the extra slots' sums and parts
  float acc_extra[kExtraAcc];
#pragma unroll
  for (int i = 0; i < kExtra / 2; ++i) acc_extra[i] = 0.0F;
  float part_extra[kExtraAcc];
  // sum += part * f * x_scale of each column (f_lo for A row r, f_hi for row r + 8), the columns'
  // scales from `xs` on.
  const auto promote_into = [&](auto& sum, const auto& p, std::uint32_t xs, float f_lo,
                                float f_hi) {
    constexpr int kCols = static_cast<int>(sizeof(p) / sizeof(float)) * 2;
#pragma unroll
    for (int i = 0; i < kCols / 8; ++i) {
      // Columns 8i + 2c, 8i + 2c + 1: two loads, the pair is 8-byte aligned only for even slot0.
      const float2 s = make_float2(__uint_as_float(ld_shared_u32(xs + 32 * i)),
                                   __uint_as_float(ld_shared_u32(xs + 32 * i + 4)));
      sum[4 * i + 0] = fmaf(p[4 * i + 0] * f_lo, s.x, sum[4 * i + 0]);
      sum[4 * i + 1] = fmaf(p[4 * i + 1] * f_lo, s.y, sum[4 * i + 1]);
      sum[4 * i + 2] = fmaf(p[4 * i + 2] * f_hi, s.x, sum[4 * i + 2]);
      sum[4 * i + 3] = fmaf(p[4 * i + 3] * f_hi, s.y, sum[4 * i + 3]);
    }
  };
  const auto promote = [&](int stage, float f_lo, float f_hi) {
    const std::uint32_t xs = xs_lane + stage * kW4a8WgmmaScaleBytes;
    promote_into(acc, part, xs, f_lo, f_hi);
    if constexpr (kExtra > 0) {
      promote_into(acc_extra, part_extra, xs + 4 * kWgmmaTileTokens, f_lo, f_hi);
    }
  };
  const auto desc = [&](int stage, int b) {
    // 32-bit offsets: smem addresses stay below 2^18 bytes, so the field never carries.
    return x_desc_hi | (x_desc_lo + ((stage * kW4a8WgmmaXBytes + 32 * b) >> 4));
  };
  // MX block b's wgmma: the first 128 (or kN) slots, then the extra slots' rows.
  const auto block_wgmma = [&](const W4a8DecodedChunk& d, int stage, int b, bool accumulate) {
    wgmma_m64k32_e4m3_rs<kN>(part, d.frag[b], desc(stage, b), accumulate);
    if constexpr (kExtra > 0) {
      wgmma_m64k32_e4m3_rs<kExtra>(
          part_extra, d.frag[b],
          x_desc_hi |
              (x_desc_lo + ((stage * kW4a8WgmmaXBytes + kW4a8WgmmaXMainBytes + 32 * b) >> 4)),
          accumulate);
    }
  };
  const auto settle_parts = [&] {
    wgmma_fence_operands(part);
    if constexpr (kExtra > 0) wgmma_fence_operands(part_extra);
  };
  // Chunk `chunk` from d (decoded), decoding chunk + 1 into `next` while its wgmma run.
  const auto run_chunk = [&](int chunk, W4a8DecodedChunk& d, W4a8DecodedChunk& next) {
    const int stage = chunk % kW4a8WgmmaStages;
    const bool more = chunk + 1 < chunks;
    if (d.folds) {
      wgmma_fence();  // the fragments (and part, read by the last promotion) are settled
#pragma unroll
      for (int b = 0; b < 4; ++b) block_wgmma(d, stage, b, b > 0);
      wgmma_commit();
      if (more) decode(chunk + 1, next);
      wgmma_wait<0>();
      settle_parts();
      promote(stage, w4a8_wgmma_row_factor(d.max_lo), w4a8_wgmma_row_factor(d.max_hi));
    } else {
      if (more) decode(chunk + 1, next);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        wgmma_fence();
        block_wgmma(d, stage, b, false);
        wgmma_commit();
        wgmma_wait<0>();
        settle_parts();
        promote(stage, w4a8_wgmma_row_factor((d.scale_lo >> (8 * b)) & 0xFFU),
                w4a8_wgmma_row_factor((d.scale_hi >> (8 * b)) & 0xFFU));
      }
    }
    __syncwarp();  // every lane's reads of the stage (the scales) before lane 0 hands it back
    if (lane == 0) mbarrier_arrive(empty_base + 8 * stage);
  };

  // Two decoded chunks in flight, by name (an array indexed by the chunk's parity would live in
  // local memory).
  W4a8DecodedChunk even;
  W4a8DecodedChunk odd;
  decode(0, even);
  for (int chunk = 0; chunk < chunks; chunk += 2) {
    run_chunk(chunk, even, odd);
    if (chunk + 1 < chunks) run_chunk(chunk + 1, odd, even);
  }
  store_wgmma_tile_parts<kGemm1, kN, kExtra, /*kWgmmaOrder=*/false>(args, tile, acc, acc_extra,
                                                                    block_first + row_lo, c);
}

// Grid: (row blocks, tiles); blocks past the routed tiles return at once.
template <bool kGemm1>
__global__ void __launch_bounds__(kW4a8WgmmaThreads, 1)
    gemm_wgmma_w4a8_kernel(GemmArgs args, const __grid_constant__ W4a8WgmmaMaps maps) {
  using namespace mxq::ptx;
  if (threadIdx.x == kW4a8WgmmaConsumerThreads) {
    prefetch_tensor_map(&maps.x);
    prefetch_tensor_map(&maps.x16);
    prefetch_tensor_map(&maps.x32);
    prefetch_tensor_map(&maps.x_scale);
    prefetch_tensor_map(&maps.w);
    if (stored_row_k(args.w, kGemm1) % kW4a8Chunk != 0) prefetch_tensor_map(&maps.w_short);
  }
  ptx::wait_for_predecessor();
  const int tile_index = static_cast<int>(blockIdx.y);
  if (tile_index >= *args.ws.num_tiles) return;
  extern __shared__ std::uint8_t w4a8_wgmma_smem_raw[];
  // The swizzle patterns are functions of address bits: the atoms must be 1024-byte aligned.
  const std::uint32_t raw = smem_addr(w4a8_wgmma_smem_raw);
  std::uint8_t* smem = w4a8_wgmma_smem_raw + ((1024U - (raw % 1024U)) % 1024U);
  if (threadIdx.x == 0) {
    auto* const full = reinterpret_cast<std::uint64_t*>(smem + kW4a8WgmmaBarrierOffset);
    for (int s = 0; s < kW4a8WgmmaStages; ++s) {
      mbarrier_init(&full[s], 1);  // the producer's expect_tx arrival
      mbarrier_init(&full[kW4a8WgmmaStages + s], 4 * kW4a8WgmmaGroups);  // empty: consumer warps
    }
    fence_barrier_init();
  }
  __syncthreads();
  const WorkTile tile = read_work_tile(args.ws, tile_index);
  // The narrowest instruction that covers the tile's slots (gemm_wgmma_kernel says why).
  if (tile.rows <= 16) {
    w4a8_wgmma_tile_gemm<kGemm1, 16>(args, maps, tile, smem);
  } else if (tile.rows <= 32) {
    w4a8_wgmma_tile_gemm<kGemm1, 32>(args, maps, tile, smem);
  } else if (tile.rows <= 64) {
    w4a8_wgmma_tile_gemm<kGemm1, 64>(args, maps, tile, smem);
  } else if (tile.rows <= kWgmmaTileTokens) {
    w4a8_wgmma_tile_gemm<kGemm1, kWgmmaTileTokens>(args, maps, tile, smem);
  } else if (tile.rows <= kWgmmaTileTokens + 16) {
    w4a8_wgmma_tile_gemm<kGemm1, kWgmmaTileTokens, 16>(args, maps, tile, smem);
  } else {
    w4a8_wgmma_tile_gemm<kGemm1, kWgmmaTileTokens, 32>(args, maps, tile, smem);
  }
  ptx::allow_dependents();
}

// Row blocks of a W4A8 wgmma GEMM launch.
inline int w4a8_wgmma_row_blocks(const MoeDeviceWeights& w, bool gemm1) {
  return gemm1 ? (w.inter + kW4a8WgmmaGemm1Channels - 1) / kW4a8WgmmaGemm1Channels
               : (w.hidden + kW4a8WgmmaGemm2Rows - 1) / kW4a8WgmmaGemm2Rows;
}

}  // namespace mxq::moe::gpu::detail
