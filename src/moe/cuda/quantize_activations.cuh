// W4A8: the activations of the MoE forward quantized to E4M3 groups of 128 along K, in the layout
// of w4a8_layout.h.
#pragma once

#include <cstdint>

#include "cuda_common/pdl.cuh"
#include "moe/layout/w4a8_layout.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/fp8_block_scale.h"

namespace mxq::moe::gpu::detail {

// One warp's 128-group of a bf16 row: lane l takes k0 = the group's first k + 4 l (zeros past k).
// Returns its 4 E4M3 codes (k0 first, in the low byte) and the group's scale (the same in every
// lane): value / scale saturating, round to nearest even, scale = max(amax, 1e-4) / 448 in fp32
// — the CPU reference's quantize_dequantize_fp8_groups, with the same codec functions. A NaN or
// Inf makes the scale NaN. Every lane of the warp must call it (a shuffle reduction).
struct Fp8GroupQuad {
  std::uint32_t codes;
  float scale;
};
__device__ __forceinline__ Fp8GroupQuad quantize_fp8_group_quad(const std::uint16_t* row, int k0,
                                                                int k) {
  float v[4] = {0.0F, 0.0F, 0.0F, 0.0F};
  std::uint32_t amax_bits = 0;
  if (k0 < k) {
    const uint2 quad = __ldg(reinterpret_cast<const uint2*>(row + k0));
    const std::uint32_t half[4] = {quad.x & 0xFFFFU, quad.x >> 16, quad.y & 0xFFFFU, quad.y >> 16};
    for (int i = 0; i < 4; ++i) {
      v[i] = __uint_as_float(half[i] << 16);
      amax_bits = max(amax_bits, (half[i] << 16) & 0x7FFFFFFFU);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2)
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFU, amax_bits, offset));
  Fp8GroupQuad out{0U, fp8_block_scale(__uint_as_float(amax_bits), ScaleMode::kFp32)};
  for (int i = 0; i < 4; ++i)
    out.codes |=
        static_cast<std::uint32_t>(float_to_e4m3(v[i] / out.scale, Fp8Saturation::kSatFinite))
        << (8 * i);
  return out;
}

// One warp per (row, 128-group) of bf16 rows [rows, k]: the group's E4M3 codes
// (quantize_fp8_group_quad) in the W4A8 activation layout (zeros past k), and its scale.
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
    const Fp8GroupQuad quad =
        quantize_fp8_group_quad(src + static_cast<std::size_t>(row) * k, k0, k);
    const std::size_t pitch = w4a8_act_pitch(k);
    *reinterpret_cast<std::uint32_t*>(q + row * pitch + w4a8_act_offset(k0)) = quad.codes;
    if (lane == 0) scales[static_cast<std::size_t>(item)] = quad.scale;
  }
  if constexpr (!kReadsPredecessor) ptx::wait_for_predecessor();
}

// GEMM1's activations: x quantized per slot (the pair's token row) into E4M3 groups of 128 in the
// wgmma K order, the scales [group][slot]; GEMM2's: the activation rows (already by slot). One
// warp per (pair, group), 4 values a lane: a quad of consecutive k is 4 consecutive bytes of the
// wgmma order (gemm_wgmma_w4a8.cuh reads them). The codes and the scale are
// quantize_fp8_group_quad's, as in quantize_fp8_groups_kernel.
template <bool kGather>
__global__ void quantize_fp8_groups_by_slot_kernel(const std::uint16_t* __restrict__ src,
                                                   const int* __restrict__ pair_slot, int pairs,
                                                   int top_k, int k, std::uint8_t* __restrict__ q,
                                                   float* __restrict__ scales,
                                                   std::size_t scale_pitch) {
  ptx::wait_for_predecessor();  // the routing's slots, or GEMM1's activations
  ptx::allow_dependents();
  const int groups = w4a8_act_groups(k);
  const int item = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= pairs * groups) return;
  const int pair = item / groups;
  const int group = item % groups;
  int slot = pair;
  const std::uint16_t* row = src + static_cast<std::size_t>(pair) * k;
  if constexpr (kGather) {
    slot = pair_slot[pair];
    if (slot < 0) return;  // an expert of another rank
    row = src + static_cast<std::size_t>(pair / top_k) * k;
  }
  const int k0 = group * kW4a8Chunk + 4 * lane;
  const Fp8GroupQuad quad = quantize_fp8_group_quad(row, k0, k);
  *reinterpret_cast<std::uint32_t*>(q + static_cast<std::size_t>(slot) * w4a8_act_pitch(k) +
                                    w4a8_wgmma_act_offset(k0)) = quad.codes;
  if (lane == 0) scales[static_cast<std::size_t>(group) * scale_pitch + slot] = quad.scale;
}

}  // namespace mxq::moe::gpu::detail
