// Host launchers of the activation quantization and scale-layout kernels.
#include <cstdint>

#include "linear/cuda/launch.h"
#include "linear/cuda/quantize_activation.cuh"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"

namespace mxq::linear::gpu {
namespace {

constexpr int kElementwiseThreads = 256;

unsigned blocks_for(std::int64_t work, std::int64_t per_block) {
  return static_cast<unsigned>((work + per_block - 1) / per_block);
}

}  // namespace

void launch_quantize_activation(const QuantizeActivationArgs& args, cudaStream_t stream) {
  if (args.group_k <= 0 || args.ldq < args.k || args.scale_ld < args.m) {
    fail(ErrorCode::kInternal, "activation quantization: group ", args.group_k, ", ldq ", args.ldq,
         " for K ", args.k, ", scale_ld ", args.scale_ld, " for M ", args.m);
  }
  const int groups = (args.k + args.group_k - 1) / args.group_k;
  const std::int64_t tasks = static_cast<std::int64_t>(groups) * args.scale_ld;
  if (tasks == 0) return;
  const unsigned grid = blocks_for(tasks, kernels::kQuantizeWarpsPerBlock);
  const unsigned threads = kernels::kQuantizeWarpsPerBlock * 32;
  const bool vec4 = args.k % 4 == 0 && args.group_k % 4 == 0 && args.ldx % 4 == 0 &&
                    args.ldq % 4 == 0 && reinterpret_cast<std::uintptr_t>(args.x) % 8 == 0 &&
                    reinterpret_cast<std::uintptr_t>(args.q) % 4 == 0;
  if (vec4) {
    kernels::quantize_activation_kernel<4><<<grid, threads, 0, stream>>>(args);
  } else {
    kernels::quantize_activation_kernel<1><<<grid, threads, 0, stream>>>(args);
  }
  MXQ_CUDA_CHECK_LAUNCH();
}

void launch_transpose_scales(const float* in, int mn, int groups, std::int64_t stride_mn,
                             std::int64_t stride_g, float* out, std::int64_t out_ld,
                             cudaStream_t stream) {
  const std::int64_t work = out_ld * groups;
  if (work == 0) return;
  kernels::transpose_scales_kernel<<<blocks_for(work, kElementwiseThreads), kElementwiseThreads, 0,
                                     stream>>>(in, mn, groups, stride_mn, stride_g, out, out_ld);
  MXQ_CUDA_CHECK_LAUNCH();
}

void launch_unpack_ue8m0(const std::int32_t* packed, int mn, int groups, std::int64_t out_rows,
                         float* out, std::int64_t stride_mn, std::int64_t stride_g,
                         cudaStream_t stream) {
  const std::int64_t work = out_rows * groups;
  if (work == 0) return;
  kernels::unpack_ue8m0_kernel<<<blocks_for(work, kElementwiseThreads), kElementwiseThreads, 0,
                                 stream>>>(packed, mn, groups, out_rows, out, stride_mn, stride_g);
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace mxq::linear::gpu
