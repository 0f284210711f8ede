// The wgmma grouped GEMMs of the MoE forward (GemmVariant::kPrefillWgmma), for prefill.
//
// Why: a prefill design that fed each decoded weight fragment to mma.sync (wide tiles, measured
// and removed) kept the tensor pipe ~36% busy through mma.sync's issue and dependent-latency cost
// (docs/perf-log/moe-prefill.md). Here the decoded weights
// are the register A operand of wgmma (m64 x n64/n128 x k16): one instruction per warpgroup and
// k-step does the work of 16-32 mma.sync, and runs asynchronously while the warps decode the
// next chunk.
//
// Block = 3 consumer warpgroups, each on 64 weight rows (A rows), over a work tile of up to 128 +
// kWgmmaTileExtra slots (B columns), and 1 producer warpgroup:
//   GEMM1: warp w of warpgroup g holds channels 32 g + 8 w .. + 7 of the block: A rows 0..7 their
//          gate rows, 8..15 their up rows, so each lane's accumulators hold gate and up of the
//          same (channel, slot) and the SwiGLU epilogue needs no exchange; 96 channels per block;
//   GEMM2: warpgroup g takes 64 rows of w2; 192 per block.
// Why 3: with 2 the decode's dependency chains left the schedulers idle (2 consumer warps each).
// The producer warpgroup gives its registers to the consumers (setmaxnreg: 160 a consumer thread,
// against the 128 a 13-warp block with a producer warp allowed), which the wide tiles' second
// accumulator needs; the fragments live in a small ring (below) instead of two whole-chunk sets.
// 96 channels and 192 rows also divide gpt-oss's 2880, and the activation tile is shared by 192
// rows.
// Tiles of at most 16, 32 or 64 slots run the n16, n32 or n64 instruction and copy only that many
// activation rows (less tensor work and less L2 traffic). A tile of 129 .. 128 + kWgmmaTileExtra
// slots (an expert's last, tile_cut_for) runs the n128 instruction on its first 128 slots and an
// n16, n32 or n64 one on the rest, both on the same decoded fragments: its extra slots cost tensor
// work only, where a tile of their own decoded the expert's weights again. Tiles of 65 .. 96 slots
// run n64 and n16 or n32 the same way (the n128 instruction did up to 2x the tensor work needed).
// The producer fills a ring of stages (4, or 3 for the two-instruction tiles' larger x stages), one
// 128-wide K chunk each, by TMA:
// the tile's activations (64 slot rows x 64 K per box, 128-byte swizzled as wgmma's descriptor
// reads them: the activations are in slot order, so a tile's rows are contiguous), the weights
// (kWgmmaWBoxRows-row boxes of 6 row groups, row_groups.h, 64-byte swizzled: MX block b of stage
// row s at unit b ^ ((s / 2) % 4), so the consumers' 4-byte reads hit 32 distinct banks; the short
// last chunk of K = 2880 lands unswizzled, its rows nb * 16 bytes apart). A stage's "full" barrier
// completes with the copies' bytes; consumers hand a stage back on its "empty" barrier once the
// wgmma reading it are done. Consumers: lane (r, c) decodes word c of MX block b of its rows
// (mxfp4_mma.cuh): the A fragments of k-steps 2b and 2b + 1, issued as one wgmma group. The
// fragments of kWgmmaRing MX blocks are in flight per warp: a block's registers are rewritten only
// after a wait for the group that read them, so decoding block j + 1 overlaps the wgmma of block j.
// The E8M0 scales are read by the consumer lanes from global memory (one aligned word per row and
// chunk in the padded device layout), one chunk ahead: shared memory is written by TMA only. The
// activations arrive in slot order and the wgmma K order (wgmma_k_order.h): GEMM1 reads x gathered
// and permuted by gather_activations_kernel, GEMM1's epilogue writes the GEMM2 activations
// permuted. (Gathering rows by TMA instead, one 1 x 64 box per slot row, measured 4x slower: TMA's
// cost is per box.)
#pragma once

#include <cuda.h>

#include <algorithm>
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
#include "mxfp4_mma.cuh"
#include "wgmma_epilogue.cuh"
#include "wgmma_k_order.h"

namespace mxq::moe::gpu::detail {

constexpr int kWgmmaGroups = 3;                             // consumer warpgroups per block
constexpr int kWgmmaConsumerThreads = 128 * kWgmmaGroups;   // warps 0..11
constexpr int kWgmmaThreads = kWgmmaConsumerThreads + 128;  // + the producer warpgroup
constexpr int kWgmmaConsumerRegisters = 160;                // 3 x 128 x 160 + 128 x 24 <= 64K
constexpr int kWgmmaProducerRegisters = 24;
constexpr int kWgmmaMaxStages = 4;
constexpr int kWgmmaChunk = 128;                              // K values per stage
constexpr int kWgmmaAtomBytes = kWgmmaTileTokens * 128;       // 64 K values of 128 slots
constexpr int kWgmmaXBytes = 2 * kWgmmaAtomBytes;             // 32 KB
constexpr int kWgmmaRows = 64 * kWgmmaGroups;                 // weight rows per stage
constexpr int kWgmmaWBoxRows = kWgmmaRows / 2;                // rows per weight TMA box
constexpr int kWgmmaWBytes = kWgmmaRows * (kWgmmaChunk / 2);  // 12 KB

// The shared-memory stages of a tile with kExtra slots past the n64 or n128 instruction's: the x
// stages (the first 64 or 128 slots' two 64-K atoms of 128 rows, then the extra slots' two), then
// the weight stages; all 1024-byte aligned (the swizzle patterns are functions of address bits).
template <int kExtra>
struct WgmmaStages {
  static_assert(kExtra == 0 || kExtra == 16 || kExtra == 32 || kExtra == 64);
  static constexpr int kCount = kExtra == 0 ? kWgmmaMaxStages : kWgmmaMaxStages - 1;
  static constexpr int kExtraAtomBytes = kExtra * 128;
  static constexpr int kXBytes = kWgmmaXBytes + 2 * kExtraAtomBytes;
  static constexpr int kWOffset = kCount * kXBytes;
  static constexpr int kBytes = kWOffset + kCount * kWgmmaWBytes;
};
// The barriers (kWgmmaMaxStages full, then as many empty) after the largest stage layout; + slack
// to align.
constexpr int kWgmmaBarrierOffset = std::max({WgmmaStages<0>::kBytes, WgmmaStages<16>::kBytes,
                                              WgmmaStages<32>::kBytes, WgmmaStages<64>::kBytes});
constexpr int kWgmmaSmemBytes = kWgmmaBarrierOffset + 2 * kWgmmaMaxStages * 8 + 1024;
static_assert(kWgmmaSmemBytes <= 232448, "shared memory per block on sm_90");
static_assert(kWgmmaTileExtra <= 64, "the extra slots' wgmma is n16, n32 or n64");
constexpr int kWgmmaGemm1Channels = 32 * kWgmmaGroups;  // channels per GEMM1 block
constexpr int kWgmmaGemm2Rows = 64 * kWgmmaGroups;      // w2 rows per GEMM2 block
// MX blocks (2 k-steps) of decoded A fragments a consumer warp keeps in flight: block b of a
// chunk is decoded into ring[b % kWgmmaRing] once the wgmma that read it kWgmmaRing blocks ago
// are done. 4 spilled at the 128-register cap.
constexpr int kWgmmaRing = 2;

// The TMA views of a GEMM's operands (built by the launcher): activations [slots, K] bf16 in
// boxes of 64 x 64 (128-byte swizzle); the packed weights in their row groups (row_groups.h) as
// [groups][16 * full chunks][64 bytes], read in boxes of 6 groups x 16 rows x 64 bytes of one
// chunk (kWgmmaWBoxRows rows, which land as 64-byte rows in order, 64-byte swizzled), and the
// short last chunk of the stored rows (K not a multiple of 128: nb < 4 MX blocks) as
// [groups][16][nb * 16 bytes], unswizzled (`w_short`, built only when the rows have one).
struct WgmmaMaps {
  CUtensorMap x;
  CUtensorMap x16;  // the activations in boxes of 16 and 32 slots: narrow tiles copy only
  CUtensorMap x32;  // their own rows
  CUtensorMap w;
  CUtensorMap w_short;
};

// Row groups per weight box.
constexpr int kWgmmaWBoxGroups = kWgmmaWBoxRows / kGroupRows;
static_assert(kWgmmaWBoxRows % kGroupRows == 0, "a weight box is whole row groups");

// GEMM1's activations: x_sorted[slot][wgmma_k_position(k)] = x[token of the slot's pair][k].
// One thread per 16-byte unit of a pair's row: positions 4v .. 4v + 3 of one MX block, gathered
// from the 4 places of their pairs (wgmma_position_pair).
__global__ void gather_activations_kernel(const std::uint32_t* __restrict__ x,
                                          const int* __restrict__ pair_slot, int pairs, int top_k,
                                          int hidden, uint4* __restrict__ x_sorted) {
  ptx::wait_for_predecessor();  // the routing kernel's slots
  ptx::allow_dependents();
  const int units_per_row = hidden / 8;
  const std::size_t units = static_cast<std::size_t>(pairs) * units_per_row;
  for (std::size_t q = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; q < units;
       q += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int pair = static_cast<int>(q / units_per_row);
    const int unit = static_cast<int>(q % units_per_row);
    const int slot = pair_slot[pair];
    if (slot < 0) continue;  // an expert of another rank
    const int block = unit / 4;
    const int v = unit % 4;
    // The MX block's 16 bf16x2 pairs in the token's row.
    const std::uint32_t* src =
        x + static_cast<std::size_t>(pair / top_k) * (hidden / 2) + 16 * block;
    uint4 out;
    out.x = __ldg(src + wgmma_position_pair(4 * v + 0));
    out.y = __ldg(src + wgmma_position_pair(4 * v + 1));
    out.z = __ldg(src + wgmma_position_pair(4 * v + 2));
    out.w = __ldg(src + wgmma_position_pair(4 * v + 3));
    x_sorted[static_cast<std::size_t>(slot) * units_per_row + unit] = out;
  }
}

// The work of one block (row block blockIdx.x of a tile) with the n = kN instruction (kN >= the
// tile's slots), or with kExtra > 0: n = kN (64 or 128) on the first kN slots and n = kExtra on the
// rest (kN + kExtra >= the tile's slots).
template <bool kGemm1, int kN, int kExtra = 0>
__device__ __forceinline__ void wgmma_tile_gemm(const GemmArgs& args, const WgmmaMaps& maps,
                                                const WorkTile& tile, std::uint8_t* smem) {
  using namespace mxq::ptx;  // TMA, mbarrier, wgmma, setmaxnreg
  static_assert(kExtra == 0 || kN == 64 || kN == 128, "extra slots past an n64 or n128 tile");
  using Stages = WgmmaStages<kExtra>;
  constexpr int kStages = Stages::kCount;
  // The activations' map: boxes of the tile's width, so that a 16- or 32-slot tile copies 16 or
  // 32 rows per stage (in 64-row boxes, a T = 512 layer's GEMM1 read 1.5 GB of activations from
  // L2 for 1.1 GB of weights). The rows land at the start of each atom, where a 64-row box puts
  // them too (the 128-byte swizzle is a function of the row within 8-row groups).
  const CUtensorMap* const x_map = kN == 16 ? &maps.x16 : (kN == 32 ? &maps.x32 : &maps.x);
  constexpr int kXBoxRows = kN < 64 ? kN : 64;
  const int tid = static_cast<int>(threadIdx.x);
  const int block_first = blockIdx.x * (kGemm1 ? kWgmmaGemm1Channels : kWgmmaGemm2Rows);
  const int chunks = (streamed_k(args.w, kGemm1) + kWgmmaChunk - 1) / kWgmmaChunk;
  // The stored rows' full chunks and the MX blocks of their short last chunk (GEMM2: P values).
  const int stored_k = stored_row_k(args.w, kGemm1);
  const int stored_full = stored_k / kWgmmaChunk;
  const int short_blocks = chunk_blocks(stored_k, stored_full);
  std::uint8_t* const w_smem = smem + Stages::kWOffset;
  auto* const full = reinterpret_cast<std::uint64_t*>(smem + kWgmmaBarrierOffset);
  std::uint64_t* const empty = full + kWgmmaMaxStages;
  // Stage rows: GEMM1 rows 0..95 the gate rows of the block's channels, 96..191 their up rows;
  // GEMM2 rows 0..191 the block's w2 rows.
  const WgmmaBlockRows<kGemm1, kWgmmaWBoxRows> rows{args.w, tile.expert, block_first};

  if (tid >= kWgmmaConsumerThreads) {  // ---- producer warpgroup: one thread issues
    setmaxnreg_dec<kWgmmaProducerRegisters>();
    if (tid != kWgmmaConsumerThreads) return;
    // Boxes past the tile's slots read other experts' slots or zeros: their B columns only reach
    // accumulator columns that are never stored.
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const int stage = chunk % kStages;
      if (chunk >= kStages) mbarrier_wait(&empty[stage], ((chunk / kStages) - 1) & 1);
      std::uint8_t* const x_stage = smem + stage * Stages::kXBytes;
      std::uint8_t* const w_stage = w_smem + stage * kWgmmaWBytes;
      const bool short_chunk = chunk >= stored_full;
      mbarrier_arrive_expect_tx(
          &full[stage],
          (kN + kExtra) * 256 + (short_chunk ? kWgmmaRows * 16 * short_blocks : kWgmmaWBytes));
#pragma unroll
      for (int atom = 0; atom < 2; ++atom) {
#pragma unroll
        for (int box = 0; box < kN / kXBoxRows; ++box)
          tma_load_2d(x_stage + atom * kWgmmaAtomBytes + box * kXBoxRows * 128, x_map, &full[stage],
                      chunk * kWgmmaChunk + 64 * atom, tile.slot0 + kXBoxRows * box);
        if constexpr (kExtra > 0) {  // the extra slots: one box of their width (<= 64 rows)
          const CUtensorMap* const x_extra_map =
              kExtra == 16 ? &maps.x16 : (kExtra == 32 ? &maps.x32 : &maps.x);
          tma_load_2d(x_stage + kWgmmaXBytes + atom * Stages::kExtraAtomBytes, x_extra_map,
                      &full[stage], chunk * kWgmmaChunk + 64 * atom, tile.slot0 + kN);
        }
      }
      rows.tma_load_chunk(w_stage, &maps.w, &maps.w_short, &full[stage], chunk, short_chunk);
    }
    return;
  }

  // ---- consumers
  setmaxnreg_inc<kWgmmaConsumerRegisters>();
  const int group = tid / 128;
  const int warp = (tid / 32) % 4;
  const int lane = tid % 32;
  const int r = lane / 4;
  const int c = lane % 4;
  // Stage rows of this lane's A rows r and r + 8.
  const int row_lo = kGemm1 ? 32 * group + 8 * warp + r : 64 * group + 16 * warp + r;
  constexpr int kHiRows = kGemm1 ? kWgmmaWBoxRows : 8;  // row_hi - row_lo
  const int row_hi = row_lo + kHiRows;
  const int unit_xor = (r / 2) % 4;  // (row / 2) % 4 of both rows: the 64-byte swizzle
  // E8M0 scales of rows row_lo and row_hi, the chunk's 4 MX blocks packed little-endian (0 past
  // K, where the weights are zero too); loaded one chunk ahead of their use. A row past the
  // matrix reads row 0's (WgmmaBlockRows::scale_row), and the look-ahead past the last chunk reads
  // the last one again: no branch or predicate per chunk for either.
  const std::uint8_t* const scales_lo = rows.scale_row(row_lo);
  const std::uint8_t* const scales_hi = rows.scale_row(row_hi);
  const int last_chunk = chunks - 1;
  std::uint32_t next_scales_lo = load_chunk_scales(scales_lo, 0);
  std::uint32_t next_scales_hi = load_chunk_scales(scales_hi, 0);
  // Shared-memory addresses held in registers across the loop (the per-chunk work then adds the
  // stage's offset instead of converting generic pointers again): this lane's words of MX block b
  // of row row_lo (row_hi is kHiRowOffset bytes on), the barriers, and the activations' wgmma
  // descriptor (start address in 16-byte units in its low bits: stage and k-step offsets add).
  constexpr std::uint32_t kHiRowOffset = kHiRows * 64;
  const std::uint32_t smem_base = smem_addr(smem);
  const std::uint32_t full_base = smem_base + kWgmmaBarrierOffset;
  const std::uint32_t empty_base = full_base + kWgmmaMaxStages * 8;
  const std::uint32_t w_smem_base = smem_base + Stages::kWOffset;
  std::uint32_t w_lane[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) w_lane[b] = w_smem_base + row_lo * 64 + ((b ^ unit_xor) * 16) + 4 * c;
  const std::uint64_t x_desc = wgmma_desc_k128_sw128(smem_base);
  const auto x_desc_lo = static_cast<std::uint32_t>(x_desc);  // the address field, < 2^14
  const std::uint64_t x_desc_hi = x_desc & ~0xFFFFFFFFULL;
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0F;
  float acc_extra[kExtra > 0 ? kExtra / 2 : 1];  // the extra slots' accumulators
#pragma unroll
  for (int i = 0; i < kExtra / 2; ++i) acc_extra[i] = 0.0F;
  std::uint32_t ring[kWgmmaRing][2][4];  // [slot][k-step of the MX block][A registers]
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int stage = chunk % kStages;
    mbarrier_wait(full_base + 8 * stage, (chunk / kStages) & 1);
    const std::uint32_t scale_lo = next_scales_lo;
    const std::uint32_t scale_hi = next_scales_hi;
    const int ahead = min(chunk + 1, last_chunk);
    next_scales_lo = load_chunk_scales(scales_lo, ahead);
    next_scales_hi = load_chunk_scales(scales_hi, ahead);
    std::uint32_t words_lo[4];
    std::uint32_t words_hi[4];
    if (chunk < stored_full) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const std::uint32_t at = w_lane[b] + stage * kWgmmaWBytes;
        words_lo[b] = ld_shared_u32(at);
        words_hi[b] = ld_shared_u32(at + kHiRowOffset);
      }
    } else {
      // The short chunk: each box's rows short_blocks * 16 bytes apart, unswizzled; the blocks
      // past them are zero weights.
      const auto short_row = [&](int row) -> std::uint32_t {
        return w_smem_base + stage * kWgmmaWBytes +
               (row / kWgmmaWBoxRows) * kWgmmaWBoxRows * (kWgmmaChunk / 2) +
               (row % kWgmmaWBoxRows) * short_blocks * 16 + 4 * c;
      };
      const std::uint32_t lo = short_row(row_lo);
      const std::uint32_t hi = short_row(row_hi);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        words_lo[b] = b < short_blocks ? ld_shared_u32(lo + 16 * b) : 0U;
        words_hi[b] = b < short_blocks ? ld_shared_u32(hi + 16 * b) : 0U;
      }
    }
    // A scale above 2^1 or NaN somewhere in the warp: the two-factor decode for this chunk.
    const bool wide =
        __any_sync(0xFFFFFFFFU, any_wide_scale_byte(scale_lo) || any_wide_scale_byte(scale_hi));
    const std::uint32_t biased_lo = scale_lo + kPackedScaleBias;
    const std::uint32_t biased_hi = scale_hi + kPackedScaleBias;
    // 32-bit offsets: smem addresses stay below 2^18 bytes, so the field never carries.
    const std::uint32_t stage_desc_lo = x_desc_lo + ((stage * Stages::kXBytes) >> 4);
    // MX block b: k-steps 2b, 2b + 1, one wgmma group. Its ring slot was last read by the group
    // kWgmmaRing blocks back; once that group is done, so is every group of the previous chunk
    // when b == kWgmmaRing - 1, and that chunk's stage goes back to the producer.
    const auto mx_block = [&](auto block) {
      constexpr int b = decltype(block)::value;
      std::uint32_t(&frag)[2][4] = ring[b % kWgmmaRing];
      wgmma_wait<kWgmmaRing - 1>();
      if (b == kWgmmaRing - 1 && chunk >= 1 && lane == 0)
        mbarrier_arrive(empty_base + 8 * ((chunk - 1) % kStages));
      if (wide) {
        decode_word_pair_fragments<true>(
            words_lo[b], words_hi[b], e8m0_scale_factors((scale_lo >> (8 * b)) & 0xFFU),
            e8m0_scale_factors((scale_hi >> (8 * b)) & 0xFFU), frag[0], frag[1]);
      } else {
        decode_word_pair_fragments<false>(
            words_lo[b], words_hi[b], {packed_narrow_scale_factor<b>(biased_lo), 0U},
            {packed_narrow_scale_factor<b>(biased_hi), 0U}, frag[0], frag[1]);
      }
      wgmma_fence();  // the fragments (and, first time, the zeroed accumulators) are written
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * b + h;
        wgmma_m64k16_bf16_rs<kN>(
            acc, frag[h],
            x_desc_hi | (stage_desc_lo + (((s / 4) * kWgmmaAtomBytes + (s % 4) * 32) >> 4)), true);
        if constexpr (kExtra > 0) {
          wgmma_m64k16_bf16_rs<kExtra>(
              acc_extra, frag[h],
              x_desc_hi |
                  (stage_desc_lo +
                   ((kWgmmaXBytes + (s / 4) * Stages::kExtraAtomBytes + (s % 4) * 32) >> 4)),
              true);
        }
      }
      wgmma_commit();
    };
    static_assert(kWgmmaRing >= 1 && kWgmmaRing <= 4 && 4 % kWgmmaRing == 0);
    mx_block(std::integral_constant<int, 0>{});
    mx_block(std::integral_constant<int, 1>{});
    mx_block(std::integral_constant<int, 2>{});
    mx_block(std::integral_constant<int, 3>{});
  }
  wgmma_wait<0>();
  wgmma_fence_operands(acc);
  if constexpr (kExtra > 0) wgmma_fence_operands(acc_extra);
  store_wgmma_tile_parts<kGemm1, kN, kExtra, /*kWgmmaOrder=*/true>(args, tile, acc, acc_extra,
                                                                   block_first + row_lo, c);
}

// Grid: (row blocks, tiles); blocks past the routed tiles return at once.
template <bool kGemm1>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    gemm_wgmma_kernel(GemmArgs args, const __grid_constant__ WgmmaMaps maps) {
  using namespace mxq::ptx;
  if (threadIdx.x == kWgmmaConsumerThreads) {
    prefetch_tensor_map(&maps.x);
    prefetch_tensor_map(&maps.x16);
    prefetch_tensor_map(&maps.x32);
    prefetch_tensor_map(&maps.w);
    if (stored_row_k(args.w, kGemm1) % kWgmmaChunk != 0) prefetch_tensor_map(&maps.w_short);
  }
  ptx::wait_for_predecessor();
  const int tile_index = static_cast<int>(blockIdx.y);
  if (tile_index >= *args.ws.num_tiles) return;
  extern __shared__ std::uint8_t wgmma_smem_raw[];
  // The swizzle patterns are functions of address bits: the atoms must be 1024-byte aligned.
  const std::uint32_t raw = smem_addr(wgmma_smem_raw);
  std::uint8_t* smem = wgmma_smem_raw + ((1024U - (raw % 1024U)) % 1024U);
  if (threadIdx.x == 0) {
    auto* const full = reinterpret_cast<std::uint64_t*>(smem + kWgmmaBarrierOffset);
    for (int s = 0; s < kWgmmaMaxStages; ++s) {
      mbarrier_init(&full[s], 1);                                   // the producer's expect_tx
      mbarrier_init(&full[kWgmmaMaxStages + s], 4 * kWgmmaGroups);  // empty: per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();
  const WorkTile tile = read_work_tile(args.ws, tile_index);
  // The narrowest instruction that covers the tile's slots: with every expert touched by a few
  // tokens (T = 512 of gpt-oss-120b: ~16 slots an expert), n64 did 4x the tensor work needed, and
  // the kernel's time follows its tensor work.
  if (tile.rows <= 16) {
    wgmma_tile_gemm<kGemm1, 16>(args, maps, tile, smem);
  } else if (tile.rows <= 32) {
    wgmma_tile_gemm<kGemm1, 32>(args, maps, tile, smem);
  } else if (tile.rows <= 64) {
    wgmma_tile_gemm<kGemm1, 64>(args, maps, tile, smem);
  } else if (tile.rows <= 64 + 16) {
    wgmma_tile_gemm<kGemm1, 64, 16>(args, maps, tile, smem);
  } else if (tile.rows <= 64 + 32) {
    wgmma_tile_gemm<kGemm1, 64, 32>(args, maps, tile, smem);
  } else if (tile.rows <= kWgmmaTileTokens) {
    wgmma_tile_gemm<kGemm1, kWgmmaTileTokens>(args, maps, tile, smem);
  } else if (tile.rows <= kWgmmaTileTokens + 16) {
    wgmma_tile_gemm<kGemm1, kWgmmaTileTokens, 16>(args, maps, tile, smem);
  } else if (tile.rows <= kWgmmaTileTokens + 32) {
    wgmma_tile_gemm<kGemm1, kWgmmaTileTokens, 32>(args, maps, tile, smem);
  } else {
    wgmma_tile_gemm<kGemm1, kWgmmaTileTokens, 64>(args, maps, tile, smem);
  }
  ptx::allow_dependents();
}

// Row blocks of a wgmma GEMM launch.
inline int wgmma_row_blocks(const MoeDeviceWeights& w, bool gemm1) {
  return gemm1 ? (w.inter + kWgmmaGemm1Channels - 1) / kWgmmaGemm1Channels
               : (w.hidden + kWgmmaGemm2Rows - 1) / kWgmmaGemm2Rows;
}

}  // namespace mxq::moe::gpu::detail
