// W4A8: the activations of the MoE forward quantized to E4M3 groups of 128 along K, in the layout
// of w4a8_layout.h.
#pragma once

#include <cstdint>

#include "cuda_common/pdl.cuh"
#include "moe/layout/w4a8_layout.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/fp8_block_scale.h"

namespace mxq::moe::gpu::detail {

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
  if constexpr (kReadsPredecessor) ptx::wait_for_predecessor();
  ptx::allow_dependents();
  const int groups = w4a8_act_groups(k);
  const int item = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item < rows * groups) {
    const int row = item / groups;
    const int k0 = (item % groups) * kW4a8Chunk + 4 * lane;
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
    const std::size_t pitch = w4a8_act_pitch(k);
    *reinterpret_cast<std::uint32_t*>(q + row * pitch + w4a8_act_offset(k0)) = codes;
    if (lane == 0) scales[static_cast<std::size_t>(item)] = scale;
  }
  if constexpr (!kReadsPredecessor) ptx::wait_for_predecessor();
}

}  // namespace mxq::moe::gpu::detail
