// Host launchers of the block-FP8 CUDA kernels (internal to mxq). Each checks the facts its
// kernel relies on and throws mxq::Error(kInternal) when dispatch let through a problem it
// cannot run; every CUDA call is checked.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <string>

#include "linear/cuda/kernel_params.h"

namespace mxq::linear::gpu {

// Tile shapes compiled for the mma.sync fallback: CTA tile kBm x kBn, K chunk kc bytes; f16_mma
// selects the variant that unpacks the E4M3 fragments to f16 for m16n8k16 (see mma_sync_gemm.cuh).
struct MmaSyncShape {
  int bm;
  int bn;
  int kc;
  int stages;
  int threads;
  bool f16_mma;
};
inline constexpr std::array<MmaSyncShape, 6> kMmaSyncShapes = {{
    {16, 64, 64, 6, 128, false},    // decode: many CTAs along N; warps 1x4 of 16x16
    {64, 128, 64, 4, 256, false},   // medium M; warps 2x4 of 32x32
    {64, 128, 32, 4, 256, false},   // block K extents not a multiple of 64 (16, 32, 48, 96...)
    {128, 128, 64, 4, 512, false},  // large M; warps 4x4 of 32x32
    {64, 128, 64, 4, 256, true},    // as above, f16 m16n8k16 on unpacked fragments
    {128, 128, 64, 4, 512, true},
}};

// Tile shapes compiled for the Hopper wgmma kernel; `overlap` selects the variant that promotes
// each K-block while the next block's wgmma run (two accumulators: 2 x 64 + 64 fp32 registers
// per consumer thread, which setmaxnreg's 232 hold with one or two consumer warpgroups).
// `cluster` > 1: that many blocks along N per cluster share their A tile by TMA multicast.
// `split_k` > 1: that many blocks per cluster split K and sum the tile in distributed shared
// memory.
struct WgmmaShape {
  int bm;
  int bn;
  int stages;
  bool overlap;
  int cluster = 1;
  int split_k = 1;
  friend constexpr bool operator==(const WgmmaShape&, const WgmmaShape&) = default;
};
inline constexpr std::array<WgmmaShape, 18> kWgmmaShapes = {{
    {64, 64, 8, false},
    {64, 128, 8, false},
    {128, 128, 5, false},
    {64, 128, 8, true},
    {128, 128, 5, true},
    // Narrow tiles for M <= 64: N / 32 or N / 16 CTAs, so that N = 2112 or 4096 stream their
    // weights on every SM (64-wide tiles leave 99 or 68 of 132 idle), with a deeper ring.
    {64, 32, 16, false},
    {64, 16, 16, false},
    // Wide tiles for large M: 256 rows (two consumer warpgroups of 128) read each weight tile
    // once per 256 rows; the cluster of two also reads each A tile once per 256 columns.
    {256, 128, 3, false},
    {256, 128, 3, false, 2},
    // Split K for small M: a problem of few wide tiles (N = 2112: 17 of 64x128; 4096: 32; 7168:
    // 56) on 2 or 4 blocks per tile, each streaming its share of K. A 64-row block streams about
    // 64 GB/s (its wgmma and promotion per K-block, not the memory, set the rate), so filling the
    // SMs is what brings these GEMMs to the HBM; narrowing the tiles instead makes every block
    // read the whole of A (N = 2112 with 64x16 tiles: 4x the weight bytes). The stage rings are
    // shorter than the unsplit tiles' to leave room for the fp32 partial tile.
    {64, 64, 8, false, 1, 2},
    {64, 64, 8, false, 1, 4},
    {64, 128, 6, true, 1, 2},
    {64, 128, 6, true, 1, 4},
    {128, 128, 4, true, 1, 2},
    // 128 x 64 for the middle M where the 128-wide tiles leave half the SMs idle and the 64-row
    // ones need two waves (N = 2112, M = 512: 68 tiles of 128 x 128, 136 of 64 x 128, 132 of
    // 128 x 64); for the tuner until a run has timed it.
    {128, 64, 8, false},
    // The 64 x 32 tile with two accumulators (a unit's wgmma in flight while the previous one is
    // promoted): 3-5% faster than m64n32 at M <= 64 of 4096 x 7168, the decode rule's 32-wide tile
    // (H100, 2026-12-06). The 64 x 16 one ran 5-7% slower than m64n16 and is not kept.
    {64, 32, 16, true},
    // 112-wide tiles for N = 7168: 64 of them along N where 56 of 128 leave 20 of an H100's 132
    // SMs idle. A tile may straddle two 128-wide weight blocks, at a column that depends on the
    // tile (wgmma_gemm.cuh). 3-6% faster than the 128-wide tiles at N = 7168, M = 1024 on an
    // H100, slower elsewhere (at M = 256 a K-block took as long as a 128-wide one's): for the
    // tuner, not the rule.
    {128, 112, 5, false},
    {256, 112, 3, false},
}};

// The fast path's tail splits: `head` tiles for the rows of M they fill whole waves with, `tail`
// tiles for the rest (linear/cuda/tile_schedule.h, tail_split_rows).
struct WgmmaTailSplit {
  WgmmaShape head;
  WgmmaShape tail;
};
inline constexpr std::array<WgmmaTailSplit, 1> kWgmmaTailSplits = {{
    {{256, 128, 3, false}, {64, 64, 8, false}},
}};

// Tile shapes compiled for the wgmma kernel on other weight blocks (the wgmma fallback): block K
// extent 64 or 128; block N extent a multiple of the tile width, or 64 with 128-wide tiles.
// The overlapping tiles matter most here: a 64-wide weight block halves the wgmma work between
// two promotions, so without a second accumulator the tensor cores idle during each one.
inline constexpr std::array<WgmmaShape, 10> kWgmmaAnyBlockShapes = {{
    {64, 64, 8, false},
    {64, 128, 8, false},
    {128, 128, 5, false},
    {64, 128, 8, true},
    {128, 128, 5, true},
    // The fast path's 256-row tile (1.16x its 128-row tile at M = 4096 on an H100): a weight
    // tile read once per 256 rows.
    {256, 128, 3, false},
    // The fast path's narrow tiles for small M (the decode rule's, as on the fast path): on
    // 64x64 blocks at N = 2112, M <= 64, 64x16 tiles ran 24.3 us where 64x64 ones (33 blocks on
    // 132 SMs) ran 29.5 (H100).
    {64, 32, 16, false},
    {64, 16, 16, false},
    // Their two-accumulator forms, the decode rule's narrow tiles here: a 64-deep block is two
    // units a stage, so the fallback waits a unit's wgmma twice as often per byte as the fast
    // path; 64x64 blocks, M <= 64: 2112 x 7168 24.4 -> 22.3 us, 4096 x 7168 27.7 -> 24.9 (H100).
    {64, 32, 16, true},
    {64, 16, 16, true},
}};

std::string to_string(const MmaSyncShape& shape);  // "m64n128k64"
// "m128n128", "m64n128_overlap", "m256n128_x2", "m64n128_overlap_splitk4"
std::string to_string(const WgmmaShape& shape);

// True when the mma.sync kernel can use 16-byte cp.async for both operands.
bool mma_sync_vector_loads(const BlockFp8GemmArgs& args);

void launch_mma_sync(const MmaSyncShape& shape, const BlockFp8GemmArgs& args, cudaStream_t stream);
// Whether launch_wgmma / launch_wgmma_any_block have a kernel whose template constants are
// `shape` (host-only: a test without a GPU checks every listed shape has its own kernel).
bool wgmma_tile_compiled(const WgmmaShape& shape);
bool wgmma_any_block_tile_compiled(const WgmmaShape& shape);

// The work units (blocks, or clusters of blocks) of the fast tile `shape` that the current device
// holds at once: the persistent grid's size (cudaOccupancyMaxActiveClusters for clusters).
long long resident_wgmma_units(const WgmmaShape& shape);

void launch_wgmma(const WgmmaShape& shape, const BlockFp8GemmArgs& args, cudaStream_t stream);
void launch_wgmma_any_block(const WgmmaShape& shape, const BlockFp8GemmArgs& args,
                            cudaStream_t stream);

void launch_quantize_activation(const QuantizeActivationArgs& args, cudaStream_t stream);
// f32 [mn, groups] with element strides (stride_mn, stride_g) -> [groups, out_ld] (rows past mn
// are 0).
void launch_transpose_scales(const float* in, int mn, int groups, std::int64_t stride_mn,
                             std::int64_t stride_g, float* out, std::int64_t out_ld,
                             cudaStream_t stream);
// Packed UE8M0 [ceil(groups/4), round_up(mn,4)] -> out[m * stride_mn + g * stride_g] for
// m < out_rows (rows past mn are 0).
void launch_unpack_ue8m0(const std::int32_t* packed, int mn, int groups, std::int64_t out_rows,
                         float* out, std::int64_t stride_mn, std::int64_t stride_g,
                         cudaStream_t stream);

}  // namespace mxq::linear::gpu
