// Host launchers of the block-FP8 CUDA kernels (internal to mxq). Each checks the facts its
// kernel relies on and throws mxq::Error(kInternal) when dispatch let through a problem it
// cannot run; every CUDA call is checked.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <string>

#include "cuda/linear/kernel_params.h"

namespace mxq::linear::cuda {

// Tile shapes compiled for the mma.sync fallback: CTA tile kBm x kBn, K chunk kc bytes.
struct MmaSyncShape {
  int bm;
  int bn;
  int kc;
  int stages;
  int threads;
};
inline constexpr std::array<MmaSyncShape, 4> kMmaSyncShapes = {{
    {16, 64, 64, 6, 128},    // decode: many CTAs along N; warps 1x4 of 16x16
    {64, 128, 64, 4, 256},   // medium M; warps 2x4 of 32x32
    {64, 128, 32, 4, 256},   // blocks whose K extent is not a multiple of 64 (16, 32, 48, 96...)
    {128, 128, 64, 4, 512},  // large M; warps 4x4 of 32x32
}};

// Tile shapes compiled for the Hopper wgmma kernel.
struct WgmmaShape {
  int bm;
  int bn;
  int stages;
};
inline constexpr std::array<WgmmaShape, 3> kWgmmaShapes = {{
    {64, 64, 8},
    {64, 128, 8},
    {128, 128, 5},
}};

std::string to_string(const MmaSyncShape& shape);  // "m64n128k64"
std::string to_string(const WgmmaShape& shape);    // "m128n128"

// True when the mma.sync kernel can use 16-byte cp.async for both operands.
bool mma_sync_vector_loads(const BlockFp8GemmArgs& args);

void launch_mma_sync(const MmaSyncShape& shape, const BlockFp8GemmArgs& args, cudaStream_t stream);
void launch_wgmma(const WgmmaShape& shape, const BlockFp8GemmArgs& args, cudaStream_t stream);

void launch_quantize_activation(const QuantizeActivationArgs& args, cudaStream_t stream);
// f32 [mn, groups] row-major -> [groups, out_ld] (rows past mn are 0).
void launch_transpose_scales(const float* in, int mn, int groups, float* out, std::int64_t out_ld,
                             cudaStream_t stream);
// Packed UE8M0 [ceil(groups/4), round_up(mn,4)] -> out[m * stride_mn + g * stride_g] for
// m < out_rows (rows past mn are 0).
void launch_unpack_ue8m0(const std::int32_t* packed, int mn, int groups, std::int64_t out_rows,
                         float* out, std::int64_t stride_mn, std::int64_t stride_g,
                         cudaStream_t stream);

}  // namespace mxq::linear::cuda
