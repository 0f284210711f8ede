#include "mxq/core/build_info.h"

#include "mxq/version.h"

#if MXQ_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mxq {

const BuildInfo& build_info() {
  static const BuildInfo info = [] {
    BuildInfo b;
    b.version = MXQ_VERSION;
#if MXQ_WITH_CUDA
    b.cuda = true;
    b.cuda_arch = MXQ_CUDA_ARCH;
    b.cuda_toolkit =
        std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
#endif
#if MXQ_WITH_NCCL
    b.nccl = true;
    b.nccl_version = MXQ_NCCL_VERSION;
#endif
#if defined(__clang__)
    b.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
    b.compiler = "gcc " __VERSION__;
#endif
    return b;
  }();
  return info;
}

GpuQuery query_gpus() {
  GpuQuery query;
#if MXQ_WITH_CUDA
  cudaDriverGetVersion(&query.driver_version);
  cudaRuntimeGetVersion(&query.runtime_version);
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    query.note = std::string("no GPU visible: ") + cudaGetErrorName(status) + " (" +
                 cudaGetErrorString(status) + ")";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return query;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    query.gpus.push_back({i, prop.name, prop.multiProcessorCount, prop.major, prop.minor,
                          static_cast<std::uint64_t>(prop.totalGlobalMem)});
  }
  if (count == 0) query.note = "no GPU visible";
#else
  query.note = "built without CUDA";
#endif
  return query;
}

}  // namespace mxq
