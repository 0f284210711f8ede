#include "mxq/core/device.h"

#include "mxq/core/error.h"
#if MXQ_WITH_CUDA
#include <cuda_runtime_api.h>

#include "mxq/core/cuda_check.h"
#endif

namespace mxq::detail {

DeviceScope::DeviceScope(Device device) {
  if (!device.is_cuda()) return;
#if MXQ_WITH_CUDA
  int current = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device.index) {
    MXQ_CUDA_CHECK(cudaSetDevice(device.index));
    previous_ = current;
  }
#else
  fail(ErrorCode::kUnsupported,
       "this build of mxq has no CUDA support (configure with -DMXQ_CUDA=ON)");
#endif
}

DeviceScope::~DeviceScope() {
#if MXQ_WITH_CUDA
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // no throwing from a destructor
#endif
}

}  // namespace mxq::detail
