// MoeGpuLayer: a MoeLayer's ranks uploaded to one CUDA device, run by the CUDA MoE tactics.
// All TP x EP ranks are simulated on the one GPU (each rank's partial output in fp32, summed in
// rank order, rounded to bf16 once), exactly as the CPU reference does. Workspace and device
// buffers are allocated up front for `max_tokens`, so forward() allocates nothing and can be
// captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "mxq/core/tensor.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/layer.h"

namespace mxq::moe {

class MoeGpuLayer {
 public:
  // Copies every rank's current weights (prepared or not) and the router to `device`.
  static MoeGpuLayer upload(const MoeLayer& layer, int max_tokens, Device device = Device::cuda(0),
                            cuda::GemmVariant gemm = cuda::GemmVariant::kRegisterStream);

  [[nodiscard]] int max_tokens() const;
  [[nodiscard]] const MoeConfig& config() const;
  [[nodiscard]] std::string tactic_name() const;

  // x: bf16 [T, H] on the device; out: bf16 [T, H] on the device. topk_ids (i32 [T, k]) and
  // topk_weights (f32 [T, k]) on the device when routing is precomputed, else empty views.
  void forward(const TensorView& x, const TensorView& out, cudaStream_t stream,
               const TensorView& topk_ids = {}, const TensorView& topk_weights = {}) const;

  // Host convenience with MoeLayer::forward's contract: x f32 (bf16 values) or bf16 [T, H] on
  // the host; returns f32 [T, H] (bf16 values). Synchronizes.
  [[nodiscard]] Tensor forward_host(const TensorView& x, const Routing* routing = nullptr) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace mxq::moe
