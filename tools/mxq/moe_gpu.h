// The CUDA path of `mxq moe` / `mxq run`: runs a loaded (and prepared) MoeLayer on GPU 0 with
// the CUDA MoE tactic and compares outputs with the CPU reference's.
#pragma once

#include <string>

#include "mxq/core/tensor.h"
#include "mxq/moe/layer.h"

namespace mxq::cli {

struct GpuMoeRun {
  Tensor output;            // f32 [T, H], bf16 values
  double forward_ms = 0.0;  // device time of one forward (median of repeats, CUDA events)
  std::string tactic;
  std::string gpu;
};

// Throws mxq::Error(kUnsupported) naming --device cuda in builds without CUDA or without a
// visible GPU (commands call it before loading anything).
void require_gpu_for_device_cuda();

// Throws like require_gpu_for_device_cuda.
GpuMoeRun run_moe_on_gpu(const moe::MoeLayer& layer, const Tensor& x);

}  // namespace mxq::cli
