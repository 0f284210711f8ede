// The CUDA path of `mxq moe` / `mxq run`: runs a loaded (and prepared) MoeLayer on GPU 0 with
// the CUDA MoE tactic (the GEMM variant an autotuner's cache holds, when one is given) and
// compares outputs with the CPU reference's.
#pragma once

#include <string>
#include <vector>

#include "mxq/core/tensor.h"
#include "mxq/moe/layer.h"

namespace mxq::tune {
class Autotuner;
}  // namespace mxq::tune

namespace mxq::cli {

struct GpuMoeRun {
  Tensor output;            // f32 [T, H], bf16 values
  double forward_ms = 0.0;  // device time of one forward (median of repeats, CUDA events)
  std::string tactic;       // rank 0's
  bool from_tuner = false;  // rank 0's tactic came from the autotuner's cache
  struct RankTactic {
    std::string tactic;
    bool from_tuner = false;
    std::string problem;  // the moe_gpu_forward problem the tuner was asked (empty: no channels)
  };
  std::vector<RankTactic> ranks;
  std::string gpu;
};

// Throws mxq::Error(kUnsupported) naming --device cuda in builds without CUDA or without a
// visible GPU (commands call it before loading anything).
void require_gpu_for_device_cuda();

// Throws like require_gpu_for_device_cuda. `tuner` (optional, backend cuda): see
// moe::MoeGpuLayer.
GpuMoeRun run_moe_on_gpu(const moe::MoeLayer& layer, const Tensor& x,
                         const tune::Autotuner* tuner = nullptr);

}  // namespace mxq::cli
