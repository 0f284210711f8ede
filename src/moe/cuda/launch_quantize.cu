// The W4A8 activation quantization's launch (quantize_activations.cuh).
#include "cuda_common/pdl.cuh"
#include "launch.h"
#include "mxq/core/cuda_check.h"
#include "quantize_activations.cuh"

namespace mxq::moe::gpu::detail {

void launch_quantize_fp8(bool reads_predecessor, const std::uint16_t* src, int rows, int k,
                         std::uint8_t* q, float* scales, bool programmatic, cudaStream_t stream) {
  ptx::launch(
      reads_predecessor ? quantize_fp8_groups_kernel<true> : quantize_fp8_groups_kernel<false>,
      dim3(fp8_quantize_blocks(rows, k)), dim3(kFp8QuantizeThreads), 0, stream, programmatic, src,
      rows, k, q, scales);
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace mxq::moe::gpu::detail
