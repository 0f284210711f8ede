// MoeDistLayer: one rank of a TP x EP MoE layer per process (or per thread), one GPU per rank.
// Each rank holds only its own weights on its GPU (MoeGpuLayer::upload_rank), computes its fp32
// partial output for every token, and the ranks' partials are summed by an all-reduce of the
// communicator (NCCL: ncclAllReduce of floats on the forward's stream), then rounded to bf16
// once: the same sum as the single-process simulation of the ranks (MoeGpuLayer) and the CPU
// reference, up to the order of the fp32 additions.
//
// TP ranks hold a slice of the intermediate channels; EP ranks hold a range of experts. EP here
// runs with replicated tokens: every rank receives all tokens, routes them all (same router, same
// decisions on every rank) and computes its local experts' contributions; tokens routed to no
// local expert contribute 0. The results equal an all-to-all dispatch's, at the cost of running
// the router and the token lists on every rank (the expert GEMMs only see local pairs).
//
// The communicator's rank is the layer rank (ep_rank * tp_size + tp_rank), its size the number
// of ranks. Every rank calls forward() with the same token count, in the same order.
#pragma once

#include <cuda_runtime_api.h>

#include "mxq/core/tensor.h"
#include "mxq/dist/communicator.h"
#include "mxq/moe/gpu_layer.h"
#include "mxq/moe/layer.h"

namespace mxq::moe {

class MoeDistLayer {
 public:
  // Uploads rank comm.rank() of `layer` to `device`. layer.num_ranks() must equal comm.size().
  // The communicator (and `tuner`, when given) must outlive the layer. `gemm` as in
  // MoeGpuLayer::upload (kAuto: per call, decode or prefill kernels by the token count).
  static MoeDistLayer upload(const MoeLayer& layer, dist::Communicator& comm, int max_tokens,
                             Device device, gpu::GemmVariant gemm = gpu::GemmVariant::kAuto,
                             const tune::Autotuner* tuner = nullptr);

  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;
  [[nodiscard]] const MoeGpuLayer& local() const;

  // Collective. x bf16 [T, H] (the same tokens on every rank), out bf16 [T, H], both on this
  // rank's device; routing as MoeGpuLayer::forward. `events`, when given, are 3 events recorded
  // before the expert computation, before the all-reduce and after the rounding (to time the
  // all-reduce apart).
  void forward(const TensorView& x, const TensorView& out, cudaStream_t stream,
               const TensorView& topk_ids = {}, const TensorView& topk_weights = {},
               cudaEvent_t* events = nullptr) const;

  // Collective; host convenience with MoeLayer::forward's contract (x f32 or bf16 [T, H]),
  // returns f32 [T, H] (bf16 values). Synchronizes.
  [[nodiscard]] Tensor forward_host(const TensorView& x, const Routing* routing = nullptr) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace mxq::moe
