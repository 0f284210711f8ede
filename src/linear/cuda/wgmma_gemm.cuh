// The Hopper block-FP8 GEMM: the fast path for DeepSeek-V3 128x128 weight blocks with 1x128
// activation groups, and (same kernel, other template arguments) the wgmma fallback for weight
// blocks of 64 or 128 along K and 64 or a multiple of the tile width along N. bf16 out,
// N % 16 == 0. Persistent, warp-specialised:
//  * one producer warpgroup whose first thread streams A [kBm x 128], W [kBn x 128] and the
//    activation scales of the tile's rows through a kStages-deep ring of shared-memory stages with
//    TMA (cp.async.bulk.tensor, 128-byte swizzle), completion on "full" mbarriers;
//  * consumer warpgroups of 64 rows each (two of 128 rows, 64 at a time, in 256-row tiles): per
//    scale block of K (a "unit": the 128-wide stage, or each of its kKSplit parts when the
//    weight block is narrower along K)
//    wgmma m64n{kBn}k32 e4m3 into a fresh fp32 accumulator, then the promotion
//    result += accumulator * (a_scale[row] * w_scale[block]) on the CUDA cores (the fp32
//    promotion per K-block that keeps the tensor cores' limited accumulation precision from
//    growing with K), and after a stage's last unit an "empty" mbarrier arrival that hands the
//    stage back;
//  * epilogue: bias, bf16 rounding, a 128-byte-swizzled staging buffer and TMA stores that
//    clip the ragged M and N edges.
// 256-row tiles: each consumer warpgroup owns 128 rows as two 64-row waves that share one
// wgmma accumulator (each wave is promoted into its own result registers), so a tile reads its
// weights once per 256 rows. With kCluster == 2 the two blocks of a cluster take neighbouring
// tiles along N with the same rows: each loads half of the A tile and multicasts it to both, so
// the pair reads each A row from L2 once (the L2-to-SM traffic per FLOP, not the tensor cores, is
// what limits 128x128 tiles at large M).
// Split K (kSplitK > 1, for small M): the kSplitK blocks of a cluster compute the same tile over
// consecutive ranges of K, so that a problem of few tiles still runs on every SM while each block
// keeps a wide tile (narrowing the tile instead multiplies the A rows every block reads). Each
// block writes its fp32 partial tile to its shared memory; after every block of the cluster has
// (the "reduce ready" mbarriers), block r sums columns [r, r + 1) * kBn / kSplitK of the tile over
// the blocks in rank order through distributed shared memory, and stores them. No workspace, no
// atomics: the same bits on every run.
// Weight scales: with kNSplit == 1 a tile lies inside one weight block row (block_n % kBn == 0)
// and needs one scale per unit; with kNSplit == 2 the tile's columns span up to two block rows,
// and each 8-column accumulator fragment takes the scale of its block row: the second row's
// fragments start at the tile's "boundary" fragment. That is half the tile when the block is
// half the tile's width (block_n = 64, kBn = 128), and in a tile whose width does not divide the
// 128-wide block (kBn = 112: N = 7168 in 64 tiles, which fill an H100's 132 SMs where 56 tiles of
// 128 leave 20 idle) it depends on the tile's column: the consumers' K loop is compiled once per
// possible boundary and the tile runs the one of its column, so the choice of scale stays a
// compile-time fact. Most tiles' weight scales are staged in shared memory by the producer
// (WgmmaTile::kStagedWScales).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <utility>

#include "cuda_common/cluster.cuh"
#include "cuda_common/mbarrier.cuh"
#include "cuda_common/smem.cuh"
#include "cuda_common/tma.cuh"
#include "cuda_common/warp_specialization.cuh"
#include "cuda_common/wgmma.cuh"
#include "linear/cuda/tile_schedule.h"

namespace mxq::linear::gpu {

struct WgmmaGemmArgs {
  int m = 0;
  int n = 0;
  int k = 0;
  int block_n = 128;
  int block_k = 128;
  const float* w_scale = nullptr;  // f32 [ceil(N/block_n), w_scale_ld]
  std::int64_t w_scale_ld = 0;
  // Rows of A (and of its scales) a stage loads: the tile's kBm, or M rounded up to 8 when the
  // whole of M is shorter than one tile (WgmmaTile::stage_rows).
  int a_rows = 0;
  const float* bias_f32 = nullptr;
  const std::uint16_t* bias_bf16 = nullptr;
};

}  // namespace mxq::linear::gpu

namespace mxq::linear::gpu::kernels {

template <int kBm_, int kBn_, int kStages_, bool kOverlap_ = false, int kKSplit_ = 1,
          int kNSplit_ = 1, int kCluster_ = 1, int kSplitK_ = 1>
struct WgmmaTile {
  static constexpr int kBm = kBm_;
  static constexpr int kBn = kBn_;
  static constexpr int kBk = 128;  // K bytes per stage: the 128-byte swizzle span
  static constexpr int kStages = kStages_;
  // Scale blocks of K per stage (weight block K extent = 128 / kKSplit) and weight block rows
  // per tile (weight block N extent = kBn / kNSplit, or a multiple of kBn when kNSplit == 1).
  static constexpr int kKSplit = kKSplit_;
  static constexpr int kNSplit = kNSplit_;
  // The tile's width does not divide the weight block's 128 columns (fast path only): where its
  // second block row starts depends on the tile's column (with_weight_boundary).
  static constexpr bool kStraddles = 128 % kBn_ != 0;
  static constexpr int kUnitK = kBk / kKSplit;
  static constexpr int kWgmmaPerUnit = kUnitK / 32;
  // Overlap each K-block's promotion with the next block's wgmma (two accumulators).
  static constexpr bool kOverlap = kOverlap_;
  // Rows per consumer warpgroup: 64, or 128 (two 64-row waves) in 256-row tiles.
  static constexpr int kRowsPerConsumer = kBm == 256 ? 128 : 64;
  static constexpr int kWaves = kRowsPerConsumer / 64;
  static constexpr int kConsumers = kBm / kRowsPerConsumer;  // consumer warpgroups
  // Blocks per cluster along N sharing (multicasting) the A tile; each loads kBm / kCluster rows.
  static constexpr int kCluster = kCluster_;
  // Blocks per cluster splitting K (each sums and stores kBn / kSplitK of the tile's columns).
  static constexpr int kSplitK = kSplitK_;
  static constexpr int kClusterBlocks = kCluster * kSplitK;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kAccumulators = kBn / 2;         // fp32 per thread for a 64 x kBn wgmma tile
  static constexpr int kFragments = kAccumulators / 4;  // 8-column fragments of the tile
  static constexpr int kOutCols = kBn / kSplitK;        // columns this block stores
  static constexpr int kOutFragments = kFragments / kSplitK;

  static constexpr int kABytes = kBm * kBk;
  static constexpr int kBBytes = kBn * kBk;
  static constexpr int kScaleBytes = kBm * 4 * kKSplit;  // [kKSplit][kBm] activation scales
  // Output staging: boxes of 64 rows x 64 columns (128 bytes of bf16: the swizzle span), or one
  // unswizzled box of the tile's width for the narrow 16- and 32-column tiles and the 112-wide
  // one (224-byte rows: its staging writes meet two-way bank conflicts, a few hundred cycles a
  // tile).
  static constexpr bool kSwizzledStore = kOutCols % 64 == 0;
  static constexpr int kStoreBoxCols = kSwizzledStore ? 64 : kOutCols;
  static constexpr int kStoreBoxBytes = 64 * kStoreBoxCols * 2;
  static constexpr int kWaveStoreBytes = 64 * kOutCols * 2;  // one 64-row wave's staged output
  static constexpr int kDBytes = kBm * kOutCols * 2;
  // Split K: every consumer thread's fp32 partial, float4 f of thread t at [f][t] (a warp's
  // 16-byte accesses are consecutive: no bank conflicts).
  static constexpr int kReduceBytes = kSplitK > 1 ? kBm* kBn * 4 : 0;
  // Where the consumers read a unit's weight scales: staged, the producer thread reads a stage's
  // [kKSplit][kNSplit] floats from global one stage ahead and stores them beside the stage before
  // its arrival (the consumers' own global load, among a unit's wgmma, held the unit's later wgmma
  // back until it returned); else every consumer loads them from global before the unit's wait.
  // On 128x128 blocks staged was 5-15% faster for the 64- and 128-row tiles on an H100, but 1-4%
  // slower for the 256 x 128 tile at M = 4096 and 5% slower for the plain 16-wide one at M <= 64
  // (whose stages, about 450 cycles, are shorter than the producer's load): on one-unit stages of
  // one block row those two keep the consumers' load. On 64x64 blocks every tile ran 7-16% faster
  // staged (docs/perf-log/linear.md, 2026-12-07).
  static constexpr bool kStagedWScales =
      !(kKSplit == 1 && kNSplit == 1 && (kBm == 256 || (kBn == 16 && !kOverlap)));
  static constexpr int kWScaleBytes = kStagedWScales ? (kKSplit * kNSplit * 4 + 15) / 16 * 16 : 0;
  // Bytes a stage receives when it loads `a_rows` rows of A and of their scales.
  static constexpr __host__ __device__ int tx_bytes(int a_rows) {
    return a_rows * kBk + kBBytes + a_rows * 4 * kKSplit;
  }
  // The rows of A a stage loads. A tile of an M shorter than kBm loads only M's rows (rounded up
  // to the swizzle's 8-row atom): TMA's zero fill of the rows past M is not free (M = 1 ran
  // 1.4x slower than M = 64 with 16-wide tiles on an H100), and those rows' accumulators are
  // never stored, so whatever the stage held there before is as good as zeros. A multicast
  // cluster loads whole slices.
  static constexpr int stage_rows(int m) {
    return (kCluster == 1 && m < kBm) ? (m + 7) / 8 * 8 : kBm;
  }

  // Shared-memory layout (offsets from a 1024-byte aligned base).
  static constexpr int kAOffset = 0;
  static constexpr int kBOffset = kAOffset + kStages * kABytes;
  static constexpr int kDOffset = kBOffset + kStages * kBBytes;
  static constexpr int kScaleOffset = kDOffset + kDBytes;
  static constexpr int kReduceOffset = kScaleOffset + kStages * kScaleBytes;
  static constexpr int kWScaleOffset = kReduceOffset + kReduceBytes;
  static constexpr int kBarrierOffset = kWScaleOffset + kStages * kWScaleBytes;
  // full[kStages], empty[kStages], then (split K) reduce_ready, reduce_done.
  static constexpr int kBarriers = 2 * kStages + (kSplitK > 1 ? 2 : 0);
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8 + 1024;  // + alignment slack

  static_assert(kBm == 64 || kBm == 128 || kBm == 256,
                "64 rows per consumer warpgroup, 1 or 2 of them; or 2 x 128 rows");
  static_assert(!kOverlap || kWaves == 1, "the overlapping variant has one 64-row wave");
  static_assert(kCluster == 1 || (kCluster == 2 && kBm == 256),
                "clusters of two blocks, with 256-row tiles");
  static_assert(kSplitK == 1 || kSplitK == 2 || kSplitK == 4, "K split over 1, 2 or 4 blocks");
  static_assert(kSplitK == 1 || (kCluster == 1 && kWaves == 1),
                "split K with one 64-row wave per consumer and no multicast cluster");
  static_assert(kOutCols >= 16 && kFragments % kSplitK == 0, "16-column store boxes at least");
  static_assert(kBn == 16 || kBn == 32 || kBn == 64 || kBn == 112 || kBn == 128,
                "16-, 32-, 64-, 112- or 128-wide tiles");
  static_assert(!kStraddles || (kNSplit == 2 && kKSplit == 1 && kSplitK == 1 && kCluster == 1),
                "a tile straddling 128-column weight blocks spans two block rows (fast path)");
  static_assert(kKSplit == 1 || kKSplit == 2 || kKSplit == 4, "weight block K of 128, 64 or 32");
  static_assert(kNSplit == 1 || kNSplit == 2, "a tile spans one or two weight block rows");
  static_assert(kStraddles || (kAccumulators / 4) % kNSplit == 0,
                "whole 8-column fragments per block row");
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "swizzle-128B atoms");
  static_assert(kScaleBytes % 128 == 0, "TMA destination alignment");
  static_assert(kSmemBytes <= 232448, "shared memory per block on sm_90");
};

// Split K: replaces this consumer thread's fragments of the columns its block stores with their
// sums over the cluster's blocks (in rank order), from the partial tiles in each block's shared
// memory at `partials`. `reductions` counts the tiles reduced before (the barriers' phase).
template <typename Tile>
__device__ __forceinline__ void reduce_split_k(float (&result)[Tile::kAccumulators],
                                               std::uint8_t* partials, std::uint64_t* reduce_ready,
                                               std::uint64_t* reduce_done, int reductions,
                                               int consumer_thread, int split_rank) {
  auto* mine = reinterpret_cast<float4*>(partials);
  // The peers have read the previous tile's partial out of this buffer (their release at cluster
  // scope, acquired here, orders those reads before these writes).
  if (reductions > 0) {
    ptx::mbarrier_wait_cluster(reduce_done, static_cast<std::uint32_t>(reductions - 1) & 1U);
  }
#pragma unroll
  for (int i = 0; i < Tile::kFragments; ++i) {
    mine[i * Tile::kConsumerThreads + consumer_thread] =
        make_float4(result[4 * i], result[4 * i + 1], result[4 * i + 2], result[4 * i + 3]);
  }
  // Every thread releases its own writes to every block of the cluster. One release per
  // warpgroup after a named barrier is correct by the PTX memory model (the barrier orders the
  // other threads' writes before the first thread's cumulative release) and as fast on an H100,
  // but compute-sanitizer's racecheck does not follow it (nor a __syncwarp with lane 0's
  // release, nor a fence.acq_rel.cluster with relaxed arrivals): per-thread arrivals are what it
  // checks clean, and their fences overlap (docs/perf-log/linear.md).
#pragma unroll
  for (int cta = 0; cta < Tile::kSplitK; ++cta) {
    ptx::mbarrier_arrive_remote_release_cluster(reduce_ready, static_cast<std::uint32_t>(cta));
  }
  ptx::mbarrier_wait_cluster(reduce_ready, static_cast<std::uint32_t>(reductions) & 1U);
  // Every remote load first, back to back (each is a round trip to another SM; issued one after
  // another's sum they would add their latencies), then the sums in rank order.
  float4 parts[Tile::kOutFragments][Tile::kSplitK];
  const int first_fragment = split_rank * Tile::kOutFragments;
#pragma unroll
  for (int f = 0; f < Tile::kOutFragments; ++f) {
#pragma unroll
    for (int cta = 0; cta < Tile::kSplitK; ++cta) {
      parts[f][cta] = ptx::ld_shared_cluster_f32x4(
          &mine[(first_fragment + f) * Tile::kConsumerThreads + consumer_thread],
          static_cast<std::uint32_t>(cta));
    }
  }
#pragma unroll
  for (int i = 0; i < Tile::kFragments; ++i) {
    if (i / Tile::kOutFragments != split_rank) continue;
    float4 sum = make_float4(0.0F, 0.0F, 0.0F, 0.0F);
#pragma unroll
    for (int cta = 0; cta < Tile::kSplitK; ++cta) {
      const float4 part = parts[i % Tile::kOutFragments][cta];
      sum.x += part.x;
      sum.y += part.y;
      sum.z += part.z;
      sum.w += part.w;
    }
    result[4 * i] = sum.x;
    result[4 * i + 1] = sum.y;
    result[4 * i + 2] = sum.z;
    result[4 * i + 3] = sum.w;
  }
  // This thread's reads of the peers' partials are done: the peers may write the next tile's.
#pragma unroll
  for (int cta = 0; cta < Tile::kSplitK; ++cta) {
    ptx::mbarrier_arrive_remote_release_cluster(reduce_done, static_cast<std::uint32_t>(cta));
  }
}

// The weight scales of one stage: [kKSplit][kNSplit], of K-block `kb` in the weight scale rows
// of one tile (tile_weight_scale_rows). A unit past K (ragged K, kKSplit > 1) has zero operands;
// its scale is not read.
template <typename Tile>
struct StageWeightScales {
  float w[Tile::kKSplit][Tile::kNSplit];

  __device__ __forceinline__ void load(const float* const (&rows)[Tile::kNSplit], int kb,
                                       int k_groups) {
#pragma unroll
    for (int c = 0; c < Tile::kNSplit; ++c) {
#pragma unroll
      for (int part = 0; part < Tile::kKSplit; ++part) {
        const int group = kb * Tile::kKSplit + part;
        w[part][c] = group < k_groups ? __ldg(rows[c] + group) : 0.0F;
      }
    }
  }

  __device__ __forceinline__ void store(float* stage) const {
#pragma unroll
    for (int part = 0; part < Tile::kKSplit; ++part) {
#pragma unroll
      for (int c = 0; c < Tile::kNSplit; ++c) stage[part * Tile::kNSplit + c] = w[part][c];
    }
  }
};

// The weight scale rows that tile column `n_tile`'s columns take their scales from: the block row
// of its first column and the next (clamped for a ragged N edge, whose columns are never stored,
// and a cluster's tile past N).
template <typename Tile>
__device__ __forceinline__ void tile_weight_scale_rows(const gpu::WgmmaGemmArgs& args, int n_tile,
                                                       const float* (&rows)[Tile::kNSplit]) {
  const int block_rows = (args.n + args.block_n - 1) / args.block_n;
  const int first = n_tile * Tile::kBn / args.block_n;
#pragma unroll
  for (int c = 0; c < Tile::kNSplit; ++c) {
    rows[c] =
        args.w_scale + static_cast<std::int64_t>(min(first + c, block_rows - 1)) * args.w_scale_ld;
  }
}

// The scales of one unit (scale block of K): a consumer thread's two rows' activation scales times
// the weight scale of each block row of the tile.
template <typename Tile>
struct UnitScales {
  float lo[Tile::kNSplit];
  float hi[Tile::kNSplit];
};

// into += acc * (a_scale[row] * w_scale[block row]): the fp32 promotion of one unit, whose
// 8-column fragments from `kBoundary` on take the second block row's scales.
template <typename Tile, int kBoundary>
__device__ __forceinline__ void promote_unit(float (&acc)[Tile::kAccumulators],
                                             const UnitScales<Tile>& scales,
                                             float (&into)[Tile::kAccumulators]) {
  ptx::wgmma_fence_operands(acc);
#pragma unroll
  for (int i = 0; i < Tile::kFragments; ++i) {
    const int c = i < kBoundary ? 0 : 1;
    into[4 * i + 0] += acc[4 * i + 0] * scales.lo[c];
    into[4 * i + 1] += acc[4 * i + 1] * scales.lo[c];
    into[4 * i + 2] += acc[4 * i + 2] * scales.hi[c];
    into[4 * i + 3] += acc[4 * i + 3] * scales.hi[c];
  }
}

// Calls body.template operator()<kBoundary>() with the first fragment of tile column `n_tile` that
// takes the second weight block row's scales (kFragments: none does) as a constant: half the
// tile for a block half its width, and for a tile straddling 128-column blocks the one of the
// values its columns can take (tile_schedule.h: weight_boundary_fragment, a multiple of
// straddle_boundary_step) that this tile has.
template <typename Tile, typename Body>
__device__ __forceinline__ void with_weight_boundary(int n_tile, int block_n, Body&& body) {
  if constexpr (!Tile::kStraddles) {
    body.template operator()<Tile::kNSplit == 1 ? Tile::kFragments : Tile::kFragments / 2>();
  } else {
    constexpr int kStep = straddle_boundary_step(Tile::kBn);
    const int boundary = weight_boundary_fragment(n_tile, Tile::kBn, block_n);
    [&]<int... kI>(std::integer_sequence<int, kI...>) {
      (void)((boundary == (kI + 1) * kStep ? (body.template operator()<(kI + 1) * kStep>(), true)
                                           : false) ||
             ...);
    }
    (std::make_integer_sequence<int, Tile::kFragments / kStep>{});
  }
}

template <typename Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    block_fp8_wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                           const __grid_constant__ CUtensorMap map_w,
                           const __grid_constant__ CUtensorMap map_a_scale,
                           const __grid_constant__ CUtensorMap map_out,
                           const gpu::WgmmaGemmArgs args) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) std::uint8_t smem_raw[];
  // Swizzle-128B tiles need 1024-byte alignment of the shared-space address.
  const std::uint32_t raw_addr = ptx::smem_addr(smem_raw);
  std::uint8_t* smem = smem_raw + ((1024U - (raw_addr & 1023U)) & 1023U);
  auto* full = reinterpret_cast<std::uint64_t*>(smem + Tile::kBarrierOffset);
  std::uint64_t* empty = full + Tile::kStages;
  std::uint64_t* reduce_ready = empty + Tile::kStages;  // split K only
  std::uint64_t* reduce_done = reduce_ready + 1;

  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  const int thread_in_wg = static_cast<int>(threadIdx.x % 128);
  // Work units (tile_schedule.h): a tile, or a cluster's kCluster neighbouring tiles along N.
  const TileSchedule schedule(args.m, args.n, Tile::kBm, Tile::kBn, Tile::kCluster);
  const int work = schedule.units();
  const int block_rank = Tile::kClusterBlocks == 1 ? 0 : static_cast<int>(ptx::cluster_ctarank());
  const int cluster_rank = Tile::kCluster == 1 ? 0 : block_rank;  // along N
  const int split_rank = Tile::kSplitK == 1 ? 0 : block_rank;     // along K
  const int cluster_id = static_cast<int>(blockIdx.x) / Tile::kClusterBlocks;
  const int clusters = static_cast<int>(gridDim.x) / Tile::kClusterBlocks;
  const int k_blocks = (args.k + Tile::kBk - 1) / Tile::kBk;  // TMA zero-fills a ragged K tail
  // This block's stages of K: all, or its share of a split (possibly none when K is short).
  const int kb_begin = k_blocks * split_rank / Tile::kSplitK;
  const int kb_end = k_blocks * (split_rank + 1) / Tile::kSplitK;
  const int k_groups = (args.k + Tile::kUnitK - 1) / Tile::kUnitK;  // scale blocks along K

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < Tile::kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      // One arrival per consumer warp of every block that writes into this stage.
      ptx::mbarrier_init(&empty[s], Tile::kConsumers * 4 * Tile::kCluster);
    }
    if constexpr (Tile::kSplitK > 1) {
      // One arrival per consumer thread of every block of the cluster.
      ptx::mbarrier_init(reduce_ready, Tile::kConsumerThreads * Tile::kSplitK);
      ptx::mbarrier_init(reduce_done, Tile::kConsumerThreads * Tile::kSplitK);
    }
    ptx::fence_barrier_init();
    ptx::fence_proxy_async_shared();
  }
  if constexpr (Tile::kClusterBlocks > 1) {
    ptx::cluster_sync();  // the peers' barriers are initialised before anything targets them
  } else {
    __syncthreads();
  }

  if (warpgroup == Tile::kConsumers) {
    // ---- producer warpgroup: one thread issues every TMA load ----
    ptx::setmaxnreg_dec<40>();
    if (thread_in_wg == 0) {
      ptx::prefetch_tensor_map(&map_a);
      ptx::prefetch_tensor_map(&map_w);
      ptx::prefetch_tensor_map(&map_a_scale);
      const int tx_bytes = Tile::tx_bytes(args.a_rows);
      int iteration = 0;
      for (int unit = cluster_id; unit < work; unit += clusters) {
        int m_tile = 0;
        int n_tile = 0;
        schedule.tile(unit, cluster_rank, m_tile, n_tile);
        // A stage's weight scales are loaded one stage ahead (the load's latency passes while
        // this thread waits for the previous stage to empty) and stored once the stage is empty.
        const float* scale_rows[Tile::kNSplit];
        StageWeightScales<Tile> next_scales;
        if constexpr (Tile::kStagedWScales) {
          tile_weight_scale_rows<Tile>(args, n_tile, scale_rows);
          if (kb_begin < kb_end) next_scales.load(scale_rows, kb_begin, k_groups);
        }
        for (int kb = kb_begin; kb < kb_end; ++kb, ++iteration) {
          const int s = iteration % Tile::kStages;
          const std::uint32_t phase = static_cast<std::uint32_t>(iteration / Tile::kStages) & 1U;
          const StageWeightScales<Tile> scales = next_scales;
          if constexpr (Tile::kStagedWScales) {
            if (kb + 1 < kb_end) next_scales.load(scale_rows, kb + 1, k_groups);
          }
          if constexpr (Tile::kCluster == 1) {
            ptx::mbarrier_wait(&empty[s], phase ^ 1U);
          } else {
            // The peer's consumers arrive too. CTA scope, as CUTLASS's producer acquire: the wait
            // only guards the TMA writes that follow, and `.acquire.cluster` costs an L1
            // invalidation (CCTL.IVALL) per stage.
            ptx::mbarrier_wait(&empty[s], phase ^ 1U);
          }
          if constexpr (Tile::kStagedWScales) {
            scales.store(
                reinterpret_cast<float*>(smem + Tile::kWScaleOffset + s * Tile::kWScaleBytes));
          }
          // Releases the stores above to the consumers, which acquire the full barrier.
          ptx::mbarrier_arrive_expect_tx(&full[s], tx_bytes);
          if constexpr (Tile::kCluster == 1) {
            ptx::tma_load_2d(smem + Tile::kAOffset + s * Tile::kABytes, &map_a, &full[s],
                             kb * Tile::kBk, m_tile * Tile::kBm);
          } else {
            constexpr int kSliceRows = Tile::kBm / Tile::kCluster;
            ptx::tma_load_2d_multicast(
                smem + Tile::kAOffset + s * Tile::kABytes + cluster_rank * kSliceRows * Tile::kBk,
                &map_a, &full[s], kb * Tile::kBk, m_tile * Tile::kBm + cluster_rank * kSliceRows,
                static_cast<std::uint16_t>((1U << Tile::kCluster) - 1U));
          }
          ptx::tma_load_2d(smem + Tile::kBOffset + s * Tile::kBBytes, &map_w, &full[s],
                           kb * Tile::kBk, n_tile * Tile::kBn);
          ptx::tma_load_2d(smem + Tile::kScaleOffset + s * Tile::kScaleBytes, &map_a_scale,
                           &full[s], m_tile * Tile::kBm, kb * Tile::kKSplit);
        }
      }
    }
  } else {
    // ---- consumer warpgroups: wgmma + promotion + epilogue ----
    ptx::setmaxnreg_inc<232>();
    const int warp_in_wg = thread_in_wg / 32;
    const int lane = thread_in_wg % 32;
    // Rows inside the tile of this thread's fragment in wave 0 (wave w: + 64 w).
    const int first_row = warpgroup * Tile::kRowsPerConsumer;
    const int row_lo = first_row + warp_in_wg * 16 + lane / 4;
    const int row_hi = row_lo + 8;
    std::uint8_t* d_tile = smem + Tile::kDOffset + warpgroup * Tile::kWaves * Tile::kWaveStoreBytes;
    const bool is_store_thread = thread_in_wg == 0;
    if (is_store_thread) ptx::prefetch_tensor_map(&map_out);

    int iteration = 0;
    int reductions = 0;  // split K: tiles reduced so far (the reduce barriers' phase)
    for (int unit = cluster_id; unit < work; unit += clusters) {
      int m_tile = 0;
      int n_tile = 0;
      schedule.tile(unit, cluster_rank, m_tile, n_tile);
      float result[Tile::kWaves][Tile::kAccumulators];
#pragma unroll
      for (int w = 0; w < Tile::kWaves; ++w) {
#pragma unroll
        for (int i = 0; i < Tile::kAccumulators; ++i) result[w][i] = 0.0F;
      }

      // The weight scale rows of this tile, when the consumers load the scales themselves.
      const float* w_scale_rows[Tile::kNSplit];
      if constexpr (!Tile::kStagedWScales) tile_weight_scale_rows<Tile>(args, n_tile, w_scale_rows);

      using Scales = UnitScales<Tile>;
      const int first = iteration;
      const int u_begin = kb_begin * Tile::kKSplit;  // this block's units (scale blocks of K)
      const int u_end = kb_end * Tile::kKSplit;
      // Waits for the stage of unit `u`, reads its scales (everything read from a stage is
      // read before it is handed back) and issues the unit's wgmma for the 64 rows of `wave`
      // into `acc` as one commit group (the first overwrites acc).
      auto issue_unit = [&](float(&acc)[Tile::kAccumulators], int u, int wave, Scales& scales) {
        const int it = first + (u - u_begin) / Tile::kKSplit;
        const int part = u % Tile::kKSplit;
        const int s = it % Tile::kStages;
        const std::uint32_t phase = static_cast<std::uint32_t>(it / Tile::kStages) & 1U;
        float w[Tile::kNSplit];
        if constexpr (!Tile::kStagedWScales) {
#pragma unroll
          for (int c = 0; c < Tile::kNSplit; ++c) {
            // A unit past K (ragged K, kKSplit > 1) has zero operands; its scale is not read.
            w[c] = u < k_groups ? __ldg(w_scale_rows[c] + u) : 0.0F;
          }
        }
        ptx::mbarrier_wait(&full[s], phase);
        const float* a_scale = reinterpret_cast<const float*>(
            smem + Tile::kScaleOffset + s * Tile::kScaleBytes + part * args.a_rows * 4);
        const float a_lo = a_scale[row_lo + 64 * wave];
        const float a_hi = a_scale[row_hi + 64 * wave];
        if constexpr (Tile::kStagedWScales) {
          const float* staged =
              reinterpret_cast<const float*>(smem + Tile::kWScaleOffset + s * Tile::kWScaleBytes) +
              part * Tile::kNSplit;
#pragma unroll
          for (int c = 0; c < Tile::kNSplit; ++c) w[c] = staged[c];
        }
#pragma unroll
        for (int c = 0; c < Tile::kNSplit; ++c) {
          scales.lo[c] = a_lo * w[c];
          scales.hi[c] = a_hi * w[c];
        }
        const std::uint32_t a_base = ptx::smem_addr(smem + Tile::kAOffset + s * Tile::kABytes) +
                                     (first_row + 64 * wave) * Tile::kBk;
        const std::uint32_t b_base = ptx::smem_addr(smem + Tile::kBOffset + s * Tile::kBBytes);
        ptx::wgmma_fence_operands(acc);
        ptx::wgmma_fence();
#pragma unroll
        for (int k = 0; k < Tile::kWgmmaPerUnit; ++k) {
          const int k_byte = part * Tile::kUnitK + k * 32;
          ptx::wgmma_m64k32_e4m3<Tile::kBn>(acc, ptx::wgmma_desc_k128_sw128(a_base + k_byte),
                                            ptx::wgmma_desc_k128_sw128(b_base + k_byte), k > 0);
        }
        ptx::wgmma_commit();
      };
      // After a stage's last unit completed: hands the stage back (one arrival per warp, on the
      // barrier of every block of the cluster, whose producers all write into this stage). The
      // warp sync orders every lane's reads of the stage before lane 0's release.
      auto release_unit = [&](int u) {
        if (u % Tile::kKSplit != Tile::kKSplit - 1) return;
        __syncwarp();
        if (lane == 0) {
          std::uint64_t* stage_empty =
              &empty[(first + (u - u_begin) / Tile::kKSplit) % Tile::kStages];
          if constexpr (Tile::kCluster == 1) {
            ptx::mbarrier_arrive(stage_empty);
          } else {
#pragma unroll
            for (int cta = 0; cta < Tile::kCluster; ++cta) {
              ptx::mbarrier_arrive_remote(stage_empty, static_cast<std::uint32_t>(cta));
            }
          }
        }
      };

      // The K loop, compiled for each boundary fragment this tile shape can have.
      with_weight_boundary<Tile>(n_tile, args.block_n, [&]<int kBoundary>() {
        if constexpr (!Tile::kOverlap) {
          float accumulator[Tile::kAccumulators];
          for (int u = u_begin; u < u_end; ++u) {
#pragma unroll
            for (int wave = 0; wave < Tile::kWaves; ++wave) {
              Scales scales;
              issue_unit(accumulator, u, wave, scales);
              ptx::wgmma_wait<0>();
              ptx::wgmma_fence_operands(accumulator);
              if (wave == Tile::kWaves - 1) release_unit(u);
              promote_unit<Tile, kBoundary>(accumulator, scales, result[wave]);
            }
          }
        } else if (u_begin < u_end) {
          // Software pipeline over two accumulators: unit u+1's wgmma run on the tensor cores
          // while unit u is promoted on the CUDA cores. wgmma_wait<1> leaves the newer group in
          // flight and guarantees the older one (the unit being promoted) is complete.
          float acc_even[Tile::kAccumulators];
          float acc_odd[Tile::kAccumulators];
          Scales even_scales;
          Scales odd_scales;
          issue_unit(acc_even, u_begin, 0, even_scales);
          for (int u = u_begin; u < u_end; u += 2) {
            // acc_even holds unit u.
            if (u + 1 < u_end) {
              issue_unit(acc_odd, u + 1, 0, odd_scales);
              ptx::wgmma_wait<1>();
            } else {
              ptx::wgmma_wait<0>();
            }
            ptx::wgmma_fence_operands(acc_even);
            release_unit(u);
            promote_unit<Tile, kBoundary>(acc_even, even_scales, result[0]);
            if (u + 1 >= u_end) break;
            // acc_odd holds unit u + 1.
            if (u + 2 < u_end) {
              issue_unit(acc_even, u + 2, 0, even_scales);
              ptx::wgmma_wait<1>();
            } else {
              ptx::wgmma_wait<0>();
            }
            ptx::wgmma_fence_operands(acc_odd);
            release_unit(u + 1);
            promote_unit<Tile, kBoundary>(acc_odd, odd_scales, result[0]);
          }
        }
      });
      iteration = first + (kb_end - kb_begin);
      if constexpr (Tile::kSplitK > 1) {
        reduce_split_k<Tile>(result[0], smem + Tile::kReduceOffset, reduce_ready, reduce_done,
                             reductions, warpgroup * 128 + thread_in_wg, split_rank);
        ++reductions;
      }

      // ---- epilogue: this warpgroup's kRowsPerConsumer x kBn block, 64 rows per wave ----
      const int named_barrier = 1 + warpgroup;
      if (is_store_thread) ptx::tma_store_wait_read();  // the previous tile's stores left d_tile
      ptx::named_barrier_sync(named_barrier, 128);
      const int col_in_group = 2 * (lane % 4);
#pragma unroll
      for (int i = 0; i < Tile::kFragments; ++i) {
        // Split K: this block stores fragments [split_rank, split_rank + 1) * kOutFragments.
        if (Tile::kSplitK > 1 && i / Tile::kOutFragments != split_rank) continue;
        const int col = (i % Tile::kOutFragments) * 8 + col_in_group;  // inside the stored part
        const int global_col = n_tile * Tile::kBn + split_rank * Tile::kOutCols + col;
        float bias0 = 0.0F;
        float bias1 = 0.0F;
        if (global_col < args.n) {  // N % 16 == 0: col and col + 1 are both in range or both out
          if (args.bias_f32 != nullptr) {
            bias0 = args.bias_f32[global_col];
            bias1 = args.bias_f32[global_col + 1];
          } else if (args.bias_bf16 != nullptr) {
            bias0 = ptx::bf16_bits_to_float(args.bias_bf16[global_col]);
            bias1 = ptx::bf16_bits_to_float(args.bias_bf16[global_col + 1]);
          }
        }
#pragma unroll
        for (int wave = 0; wave < Tile::kWaves; ++wave) {
          const float* r = result[wave];
          const __nv_bfloat162 lo =
              __floats2bfloat162_rn(r[4 * i + 0] + bias0, r[4 * i + 1] + bias1);
          const __nv_bfloat162 hi =
              __floats2bfloat162_rn(r[4 * i + 2] + bias0, r[4 * i + 3] + bias1);
          std::uint8_t* wave_tile = d_tile + wave * Tile::kWaveStoreBytes;
          const int r_lo = row_lo - first_row;  // row inside the wave's 64
          const int r_hi = r_lo + 8;
          if constexpr (Tile::kSwizzledStore) {
            // Staging box b holds tile columns [64b, 64b + 64) as [64 rows][128 bytes], with the
            // 16-byte unit u of row r stored at unit u ^ (r % 8) (TMA's 128-byte swizzle).
            const int box = col / Tile::kStoreBoxCols;
            const int unit = (col % Tile::kStoreBoxCols) / 8;
            const int byte_in_unit = (col % 8) * 2;
            std::uint8_t* box_base = wave_tile + box * Tile::kStoreBoxBytes;
            *reinterpret_cast<__nv_bfloat162*>(box_base + r_lo * 128 + ((unit ^ (r_lo % 8)) * 16) +
                                               byte_in_unit) = lo;
            *reinterpret_cast<__nv_bfloat162*>(box_base + r_hi * 128 + ((unit ^ (r_hi % 8)) * 16) +
                                               byte_in_unit) = hi;
          } else {
            // One box [64 rows][kOutCols columns], rows 2 kOutCols bytes apart.
            constexpr int kRowBytes = Tile::kOutCols * 2;
            *reinterpret_cast<__nv_bfloat162*>(wave_tile + r_lo * kRowBytes + col * 2) = lo;
            *reinterpret_cast<__nv_bfloat162*>(wave_tile + r_hi * kRowBytes + col * 2) = hi;
          }
        }
      }
      ptx::fence_proxy_async_shared();  // make the generic-proxy writes visible to TMA
      ptx::named_barrier_sync(named_barrier, 128);
      if (is_store_thread) {
#pragma unroll
        for (int wave = 0; wave < Tile::kWaves; ++wave) {
#pragma unroll
          for (int box = 0; box < Tile::kOutCols / Tile::kStoreBoxCols; ++box) {  // < 64: one box
            ptx::tma_store_2d(
                &map_out, d_tile + wave * Tile::kWaveStoreBytes + box * Tile::kStoreBoxBytes,
                n_tile * Tile::kBn + split_rank * Tile::kOutCols + box * Tile::kStoreBoxCols,
                m_tile * Tile::kBm + first_row + wave * 64);
          }
        }
        ptx::tma_store_commit();
      }
    }
    if (is_store_thread) ptx::tma_store_wait_all();
  }
  // A block leaves only when no peer still arrives on its barriers, copies into its shared memory
  // or reads its partial tile.
  if constexpr (Tile::kClusterBlocks > 1) ptx::cluster_sync();
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a features: never run silently as a no-op
#endif
}

}  // namespace mxq::linear::gpu::kernels
