// Device kernels that bring activations into the layout the block-FP8 GEMMs read:
//  * quantize_activation_kernel: bf16 [M, K] -> e4m3 [M, ldq] + f32 scales [G, scale_ld]
//    (one scale per 1 x group_k group, K-group major so a tile's scales are contiguous);
//    bit-identical to the CPU quantizer (mxq::quantize_fp8_groups): scale from the group's amax
//    (mxq::fp8_block_scale), q = E4M3-satfinite(x / scale) with IEEE division.
//  * transpose_scales_kernel: f32 [M, G] with any element strides -> [G, ld].
//  * unpack_ue8m0_kernel: packed UE8M0 int32 [ceil(G/4), round_up(MN, 4)] -> f32 at
//    out[mn * stride_mn + g * stride_g] (exact: every byte is a power of two).
#pragma once

#include <cstdint>

#include "cuda_common/fp8_groups.cuh"
#include "cuda_common/smem.cuh"
#include "linear/cuda/kernel_params.h"
#include "mxq/formats/e8m0.h"
#include "mxq/formats/fp8_block.h"

namespace mxq::linear::gpu::kernels {

constexpr int kQuantizeWarpsPerBlock = 8;

using ptx::float2_to_e4m3x2;

// One warp per (row, K-group). kVec = 4: 8-byte loads (K, ldx multiples of 4, x 8-byte
// aligned); kVec = 1: any layout.
template <int kVec>
__global__ void __launch_bounds__(kQuantizeWarpsPerBlock * 32)
    quantize_activation_kernel(const gpu::QuantizeActivationArgs args) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t task =
      static_cast<std::int64_t>(blockIdx.x) * kQuantizeWarpsPerBlock + threadIdx.x / 32;
  const int groups = (args.k + args.group_k - 1) / args.group_k;
  if (task >= static_cast<std::int64_t>(groups) * args.scale_ld) return;
  const int g = static_cast<int>(task % groups);
  const std::int64_t m = task / groups;
  float* scale_out = args.scale + static_cast<std::int64_t>(g) * args.scale_ld + m;
  if (m >= args.m) {  // padding rows of the scale tensor
    if (lane == 0) *scale_out = 0.0F;
    return;
  }
  const int k_begin = g * args.group_k;
  const int k_end = min(args.k, k_begin + args.group_k);
  // The last group also zero-fills the row padding [K, ldq).
  const std::int64_t store_end =
      g == groups - 1 ? args.ldq : static_cast<std::int64_t>(k_begin + args.group_k);
  const std::uint16_t* row = args.x + m * args.ldx;
  std::uint8_t* q_row = args.q + m * args.ldq;

  // amax as the integer max of |bits| (ptx::bf16x2_abs_max_bits: a NaN or Inf gives a NaN scale).
  std::uint32_t amax_bits = 0;
  for (int j = k_begin + lane * kVec; j < k_end; j += 32 * kVec) {
    if constexpr (kVec == 4) {
      const uint2 packed = *reinterpret_cast<const uint2*>(row + j);
      const std::uint32_t words[2] = {packed.x, packed.y};
#pragma unroll
      for (int w = 0; w < 2; ++w) amax_bits = max(amax_bits, ptx::bf16x2_abs_max_bits(words[w]));
    } else {
      amax_bits = max(amax_bits, (static_cast<std::uint32_t>(row[j]) & 0x7FFFU) << 16);
    }
  }
  amax_bits = __reduce_max_sync(0xFFFFFFFFU, amax_bits);
  const float scale = fp8_block_scale(__uint_as_float(amax_bits),
                                      args.ue8m0 ? ScaleMode::kUe8m0 : ScaleMode::kFp32);
  if (lane == 0) *scale_out = scale;

  for (std::int64_t j = k_begin + lane * kVec; j < store_end; j += 32 * kVec) {
    if constexpr (kVec == 4) {
      std::uint32_t codes = 0;  // columns >= K stay 0
      if (j < k_end) {
        const uint2 packed = *reinterpret_cast<const uint2*>(row + j);
        const float v0 = ptx::bf16_bits_to_float(static_cast<std::uint16_t>(packed.x & 0xFFFFU));
        const float v1 = ptx::bf16_bits_to_float(static_cast<std::uint16_t>(packed.x >> 16));
        const float v2 = ptx::bf16_bits_to_float(static_cast<std::uint16_t>(packed.y & 0xFFFFU));
        const float v3 = ptx::bf16_bits_to_float(static_cast<std::uint16_t>(packed.y >> 16));
        codes =
            float2_to_e4m3x2(__fdiv_rn(v0, scale), __fdiv_rn(v1, scale)) |
            static_cast<std::uint32_t>(float2_to_e4m3x2(__fdiv_rn(v2, scale), __fdiv_rn(v3, scale)))
                << 16;
      }
      *reinterpret_cast<std::uint32_t*>(q_row + j) = codes;
    } else {
      std::uint8_t code = 0;
      if (j < k_end) {
        code = static_cast<std::uint8_t>(
            float2_to_e4m3x2(__fdiv_rn(ptx::bf16_bits_to_float(row[j]), scale), 0.0F) & 0xFFU);
      }
      q_row[j] = code;
    }
  }
}

// in f32 [mn, groups], element (m, g) at in[m * stride_mn + g * stride_g] -> out[g * out_ld + m];
// rows [mn, out_ld) are 0.
__global__ void transpose_scales_kernel(const float* in, int mn, int groups, std::int64_t stride_mn,
                                        std::int64_t stride_g, float* out, std::int64_t out_ld) {
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= out_ld * groups) return;
  const std::int64_t g = index / out_ld;
  const std::int64_t m = index % out_ld;
  out[index] = m < mn ? in[m * stride_mn + g * stride_g] : 0.0F;
}

// packed int32 [ceil(groups/4), round_up(mn, 4)] -> out[m * stride_mn + g * stride_g] for
// m < out_rows (rows >= mn are written as 0).
__global__ void unpack_ue8m0_kernel(const std::int32_t* packed, int mn, int groups,
                                    std::int64_t out_rows, float* out, std::int64_t stride_mn,
                                    std::int64_t stride_g) {
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= out_rows * groups) return;
  const std::int64_t m = index % out_rows;
  const std::int64_t g = index / out_rows;
  const std::int64_t packed_ld = (mn + 3) / 4 * 4;
  float value = 0.0F;
  if (m < mn) {
    const auto word = static_cast<std::uint32_t>(packed[(g / 4) * packed_ld + m]);
    value = e8m0_to_float(static_cast<std::uint8_t>(word >> (8 * (g % 4))));
  }
  out[m * stride_mn + g * stride_g] = value;
}

}  // namespace mxq::linear::gpu::kernels
