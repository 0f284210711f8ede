// The W4A8 activation quantization's launch (quantize_activations.cuh).
#include "cuda_common/pdl.cuh"
#include "launch.h"
#include "mxq/core/cuda_check.h"
#include "quantize_activations.cuh"

namespace mxq::moe::gpu::detail {

void launch_quantize_fp8(bool reads_predecessor, const std::uint16_t* src, int rows, int k,
                         std::uint8_t* q, float* scales, bool programmatic, cudaStream_t stream) {
  constexpr int kWarps = 8;
  const int items = rows * w4a8_act_groups(k);
  ptx::launch(
      reads_predecessor ? quantize_fp8_groups_kernel<true> : quantize_fp8_groups_kernel<false>,
      dim3((items + kWarps - 1) / kWarps), dim3(kWarps * 32), 0, stream, programmatic, src, rows, k,
      q, scales);
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace mxq::moe::gpu::detail
