// The combine kernel of the MoE forward: each token's output is the weighted sum of its k GEMM2
// rows (fp32), in the order of its choices, rounded to bf16 once.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "block_trace.cuh"
#include "cuda_common/pdl.cuh"
#include "mxq/moe/cuda_moe_trace.h"
#include "routing.cuh"
#include "workspace.cuh"

namespace mxq::moe::gpu::detail {

// out[t][h] = sum over the token's k choices, in order, of weight * y[slot][h]; a thread takes
// kVec consecutive h (4 when the outputs are aligned for it: H is a multiple of 32 and the
// workspace's rows are 16-byte aligned). It loads its slots and weights, then all k of its y
// vectors, before the first add: with one element a thread and the loads in the loop, each of the
// T x H / 256 short blocks waited for two dependent round trips per choice (82 us at T = 4096,
// 2.6 TB/s; docs/perf-log/moe-prefill.md). The sum's order and operations are the same for every
// kVec.
template <int kVec>
__global__ void combine_kernel(const float* __restrict__ y, const int* __restrict__ pair_slot,
                               const float* __restrict__ topk_w, int top_k, int hidden,
                               float* __restrict__ out_f32, std::uint16_t* __restrict__ out_bf16) {
  static_assert(kVec == 1 || kVec == 4, "one element or a float4");
  using Vec = std::conditional_t<kVec == 4, float4, float>;
  trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kStart);
  ptx::wait_for_predecessor();
  trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kReleased);
  const int t = blockIdx.y;
  const int h = (blockIdx.x * blockDim.x + threadIdx.x) * kVec;
  if (h >= hidden) return;
  int slot[kMaxTopK];
  float weight[kMaxTopK];
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) {
    slot[j] = j < top_k ? pair_slot[t * top_k + j] : -1;
    weight[j] = j < top_k ? topk_w[t * top_k + j] : 0.0F;
  }
  Vec v[kMaxTopK];
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) {
    if (slot[j] >= 0)
      v[j] = *reinterpret_cast<const Vec*>(y + static_cast<std::size_t>(slot[j]) * hidden + h);
  }
  float sum[kVec] = {};
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) {
    if (slot[j] < 0) continue;
    const auto* vj = reinterpret_cast<const float*>(&v[j]);
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum[i] += weight[j] * vj[i];
  }
  const std::size_t at = static_cast<std::size_t>(t) * hidden + h;
  if (out_f32 != nullptr) *reinterpret_cast<Vec*>(out_f32 + at) = *reinterpret_cast<Vec*>(sum);
  if (out_bf16 != nullptr) {
    std::uint16_t bits[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) bits[i] = __bfloat16_as_ushort(__float2bfloat16_rn(sum[i]));
    if constexpr (kVec == 4) {
      *reinterpret_cast<uint2*>(out_bf16 + at) =
          make_uint2(bits[0] | (static_cast<std::uint32_t>(bits[1]) << 16),
                     bits[2] | (static_cast<std::uint32_t>(bits[3]) << 16));
    } else {
      out_bf16[at] = bits[0];
    }
  }
  trace_block(MoeTraceKernel::kCombine, MoeTracePoint::kEnd);
}

}  // namespace mxq::moe::gpu::detail
