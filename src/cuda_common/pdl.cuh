// Programmatic dependent launch (PDL) between the kernels of a forward (the MoE's today).
//
// Each kernel after the first is launched as a programmatic dependent of its predecessor: its
// blocks may be scheduled while the predecessor's last blocks run, and wait in
// griddepcontrol.wait (before reading anything an earlier kernel wrote) until the predecessor
// has completed and flushed its writes. A predecessor allows that early launch with
// griddepcontrol.launch_dependents: the routing kernel at once (its dependents then sit resident
// and start the moment routing ends), the GEMMs after their main loop (so the next GEMM's blocks
// do not take SM slots from this one's last wave). Without the launch attribute both
// instructions are no-ops, so the kernels are correct either way.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "mxq/core/cuda_check.h"

namespace mxq::ptx {

__device__ __forceinline__ void wait_for_predecessor() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void allow_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

template <typename... KernelArgs, typename... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t smem,
            cudaStream_t stream, bool dependent, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = dependent ? &attribute : nullptr;
  config.numAttrs = dependent ? 1 : 0;
  MXQ_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace mxq::ptx
