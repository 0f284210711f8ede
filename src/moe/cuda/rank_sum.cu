// The TP/EP rank sum of simulated ranks: fp32 partials added in rank order, rounded to bf16 once
// (the CPU reference's order, so the result does not depend on how the ranks were scheduled).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "mxq/core/cuda_check.h"

namespace mxq::moe::gpu {
namespace {

__global__ void sum_ranks_kernel(const float* __restrict__ partials, int ranks,
                                 std::size_t elements, std::uint16_t* __restrict__ out) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < elements;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float sum = 0.0F;
    for (int r = 0; r < ranks; ++r) sum += partials[r * elements + i];
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(sum));
  }
}

}  // namespace

void sum_ranks_to_bf16(const float* partials, int ranks, std::size_t elements, std::uint16_t* out,
                       cudaStream_t stream) {
  const unsigned blocks =
      static_cast<unsigned>(std::min<std::size_t>((elements + 255) / 256, 4096));
  sum_ranks_kernel<<<blocks, 256, 0, stream>>>(partials, ranks, elements, out);
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace mxq::moe::gpu
