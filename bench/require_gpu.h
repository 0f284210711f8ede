// The first check of every GPU bench after its options: a CUDA device must be visible, else the
// bench stops with kUnsupported naming itself (the same message on every machine without one).
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "mxq/core/error.h"

namespace mxq::bench {

inline void require_gpu(std::string_view bench) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    (void)cudaGetLastError();  // clear the error the query left
    fail(ErrorCode::kUnsupported, "mxq bench ", bench, " needs a CUDA GPU; none is visible");
  }
}

}  // namespace mxq::bench
