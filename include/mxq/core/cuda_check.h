// MXQ_CUDA_CHECK: every CUDA runtime call goes through it; a failure becomes mxq::Error(kCuda)
// naming the call, the file and line, and CUDA's own message.
#pragma once

#include <cuda_runtime_api.h>

#include "mxq/core/error.h"

namespace mxq::detail {
[[noreturn]] inline void cuda_fail(cudaError_t status, const char* call, const char* file,
                                   int line) {
  fail(ErrorCode::kCuda, call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), " (",
       cudaGetErrorString(status), ")");
}
}  // namespace mxq::detail

#define MXQ_CUDA_CHECK(call)                                                 \
  do {                                                                       \
    const cudaError_t mxq_cuda_status_ = (call);                             \
    if (mxq_cuda_status_ != cudaSuccess)                                     \
      ::mxq::detail::cuda_fail(mxq_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here.
#define MXQ_CUDA_CHECK_LAUNCH() MXQ_CUDA_CHECK(cudaGetLastError())
