// The host-tensor convenience forward shared by MoeGpuLayer and MoeDistLayer: f32 or bf16 [T, H]
// on the host in, f32 out (the bf16 result widened), through the device forward on a stream of
// its own, synchronized before returning.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

#include "mxq/core/tensor.h"
#include "mxq/moe/routing.h"

namespace mxq::moe::detail {

// forward(x, out, stream, topk_ids, topk_weights) enqueues the device forward.
using DeviceForward = std::function<void(const TensorView&, const TensorView&, cudaStream_t,
                                         const TensorView&, const TensorView&)>;

Tensor forward_on_host(const TensorView& x, const Routing* routing, Device device,
                       const DeviceForward& forward);

}  // namespace mxq::moe::detail
