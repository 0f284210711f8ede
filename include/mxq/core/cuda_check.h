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

namespace mxq::detail {
// Makes `device` current for a scope and gives the caller back its own current device on every
// exit, exceptions included: a library call must not move the caller's later launches and
// allocations to another GPU.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) {
    int current = 0;
    MXQ_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device) {
      MXQ_CUDA_CHECK(cudaSetDevice(device));
      previous_ = current;
    }
  }
  ~CudaDeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);  // no throwing from a destructor
  }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int previous_ = -1;  // -1: the device was current already
};
}  // namespace mxq::detail
