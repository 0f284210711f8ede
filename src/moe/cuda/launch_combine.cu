// The combine kernel's launch (combine.cuh).
#include <cstdint>

#include "combine.cuh"
#include "cuda_common/pdl.cuh"
#include "launch.h"
#include "mxq/core/cuda_check.h"

namespace mxq::moe::gpu::detail {

// The caller's outputs decide the vector width: float4 needs 16-byte aligned fp32 rows, 4 bf16 an
// 8-byte aligned row (H is a multiple of 32, so the row starts keep the base's alignment).
void launch_combine(const Workspace& ws, const float* weights, const MoeParams& p, int hidden,
                    const MoeRun& run, cudaStream_t stream) {
  const auto aligned = [](const void* ptr, std::uintptr_t bytes) {
    return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
  };
  constexpr int kThreads = 256;
  if (aligned(run.out_f32, 16) && aligned(run.out_bf16, 8) && aligned(ws.y, 16)) {
    ptx::launch(combine_kernel<4>, dim3((hidden / 4 + kThreads - 1) / kThreads, run.tokens),
                dim3(kThreads), 0, stream, p.programmatic_launch, ws.y, ws.pair_slot, weights,
                p.top_k, hidden, run.out_f32, run.out_bf16);
  } else {
    ptx::launch(combine_kernel<1>, dim3((hidden + kThreads - 1) / kThreads, run.tokens),
                dim3(kThreads), 0, stream, p.programmatic_launch, ws.y, ws.pair_slot, weights,
                p.top_k, hidden, run.out_f32, run.out_bf16);
  }
  MXQ_CUDA_CHECK_LAUNCH();
}

void take_combine_block_trace(MoeBlockTraceRecord* all) { take_translation_unit_trace(all); }

}  // namespace mxq::moe::gpu::detail
