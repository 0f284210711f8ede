// The CUDA path of `mxq moe` / `mxq run`: runs a loaded (and prepared) MoeLayer on GPU 0 with
// the CUDA MoE tactic (the GEMM variant an autotuner's cache holds, when one is given) and
// compares outputs with the CPU reference's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mxq/core/tensor.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/layer.h"

namespace mxq::tune {
class Autotuner;
}  // namespace mxq::tune
namespace mxq::dist {
class Communicator;
}  // namespace mxq::dist

namespace mxq::cli {

struct GpuMoeRun {
  Tensor output;            // f32 [T, H], bf16 values
  double forward_ms = 0.0;  // device time of one forward (median of repeats, CUDA events)
  std::string tactic;       // rank 0's
  bool from_tuner = false;  // every rank this process ran took its tactic from the cache
  struct RankTactic {
    std::string tactic;
    bool from_tuner = false;
    std::string problem;  // the moe_gpu_forward problem the tuner was asked (empty: no channels)
  };
  std::vector<RankTactic> ranks;  // distributed: only this process's rank is filled in
  std::string gpu;
  // Distributed (one rank per process): device time of the all-reduce + bf16 rounding within
  // forward_ms (median of repeats); 0 when the ranks were simulated in one process.
  double allreduce_ms = 0.0;
  int world = 1;               // processes the forward ran on
  double setup_seconds = 0.0;  // distributed: this rank's read and preparation of its weights
};

// Throws mxq::Error(kUnsupported) naming --device cuda in builds without CUDA or without a
// visible GPU (commands call it before loading anything).
void require_gpu_for_device_cuda();

// Throws like require_gpu_for_device_cuda. `tuner` (optional, backend cuda): see
// moe::MoeGpuLayer.
GpuMoeRun run_moe_on_gpu(const moe::MoeLayer& layer, const Tensor& x,
                         const tune::Autotuner* tuner = nullptr);

// What one rank of a distributed run reads and prepares: layer `layer` of `checkpoint` (config
// from the checkpoint and `overrides`) split over tp_size x ep_size ranks, padded to `alignment`
// (0: unpadded).
struct DistributedMoeLayer {
  const moe::MoeCheckpoint* checkpoint = nullptr;
  std::int64_t layer = 0;
  moe::MoeConfigOverrides overrides;
  int tp_size = 1;
  int ep_size = 1;
  std::int64_t alignment = 0;
};

// Collective over `comm` (one rank of the layer per process, comm.size() == tp_size x ep_size):
// this process reads and prepares only rank comm.rank() of the layer on GPU `device`
// (moe::MoeDistLayer::from_checkpoint) and the ranks' partials are all-reduced. Every rank
// returns the same output; setup_seconds is this rank's read + preparation.
GpuMoeRun run_moe_distributed(const DistributedMoeLayer& layer, const Tensor& x,
                              dist::Communicator& comm, int device,
                              const tune::Autotuner* tuner = nullptr);

}  // namespace mxq::cli
