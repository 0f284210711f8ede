// MoeDistLayer: one rank of a TP x EP MoE layer per process (or per thread), one GPU per rank: the
// engine-facing op (mxq/moe/mxfp4_moe.h) plus the communicator's all-reduce, as an engine would
// run it (docs/engines.md).
//
// from_checkpoint reads only this rank's experts and channels of the layer from the checkpoint
// (read_checkpoint_experts with the rank, on the host), copies them to the GPU, prepares them there
// (prepare_mxfp4_moe) into tensors the layer owns and frees the copies. A forward runs mxfp4_moe
// into this rank's fp32 partial for every token, the communicator sums the ranks' partials
// (NCCL: ncclAllReduce of floats on the forward's stream), and the sum is rounded to bf16 once:
// the same sum as the single-process simulation of the ranks (MoeGpuLayer) and the CPU
// reference, up to the order of the fp32 additions.
//
// TP ranks hold a slice of the intermediate channels; EP ranks hold a range of experts. EP here
// runs with replicated tokens: every rank receives all tokens, routes them all (same router, same
// decisions on every rank) and computes its local experts' contributions; tokens routed to no
// local expert contribute 0. The results equal an all-to-all dispatch's, at the cost of running
// the router and the token lists on every rank (the expert GEMMs only see local pairs).
//
// The communicator's rank is the layer rank (ep_rank * tp_size + tp_rank), its size tp_size *
// ep_size. Every rank calls forward() with the same token count, in the same order.
//
// GEMM variant: per call, the decision a `tuner` (backend cuda) holds in its cache for this
// rank's moe_gpu_forward problem and the call's token count, as MoeGpuLayer asks it
// (mxq/moe/tune.h); without one, `gemm` (kAuto: decode or prefill kernels by the token count).
//
// Memory: the prepared weights, the router, the op's workspace for max_tokens (zeroed once) and
// the fp32 partial [max_tokens, H] are allocated by from_checkpoint; forward() allocates nothing.
// forward() makes the layer's device current while it works and gives the caller's back.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "mxq/core/tensor.h"
#include "mxq/dist/communicator.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/config.h"
#include "mxq/moe/gemm_variant.h"
#include "mxq/moe/mxfp4_moe.h"
#include "mxq/moe/routing.h"

namespace mxq::tune {
class Autotuner;
class Problem;
}  // namespace mxq::tune

namespace mxq::moe {

class MoeDistLayer {
 public:
  // Rank comm.rank() of layer `layer` of `checkpoint` (config from the checkpoint and
  // `overrides`, activation_quant included) split over tp_size x ep_size ranks, its intermediate
  // size padded to `alignment` (a positive multiple of 32, or 0: unpadded), on `device` (this
  // rank's GPU), for forwards of up to `max_tokens` tokens. tp_size * ep_size must equal
  // comm.size(). Sizes, ranks, the device and the tuner are checked before anything is read.
  // The communicator (and `tuner`, when given) must outlive the layer.
  static MoeDistLayer from_checkpoint(const MoeCheckpoint& checkpoint, std::int64_t layer,
                                      const MoeConfigOverrides& overrides, dist::Communicator& comm,
                                      int tp_size, int ep_size, std::int64_t alignment,
                                      int max_tokens, Device device,
                                      gpu::GemmVariant gemm = gpu::GemmVariant::kAuto,
                                      const tune::Autotuner* tuner = nullptr);

  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;
  [[nodiscard]] const MoeConfig& config() const;
  [[nodiscard]] const MoeLayerShape& layer_shape() const;
  // This rank's place (tp/ep rank and size, alignment, activation quantization) and its shards
  // and prepared shapes, as the op computes them.
  [[nodiscard]] const MoeRank& moe_rank() const;
  [[nodiscard]] const PreparedMoeShapes& shapes() const;
  // Views of the prepared tensors on the device (the bias views empty without biases).
  [[nodiscard]] PreparedMoe prepared() const;
  [[nodiscard]] int max_tokens() const;
  [[nodiscard]] Device device() const;

  // What forward() runs for `tokens` tokens (kAuto resolved), and whether the tuner's cache chose
  // it; its tactic name ("cuda.moe.w4a16.<variant>", W4A8 "cuda.moe.w4a8.<variant>"); the
  // moe_gpu_forward problem the tuner is asked (null: a rank without channels).
  [[nodiscard]] gpu::GemmChoice gemm_choice(std::int64_t tokens) const noexcept;
  [[nodiscard]] std::string tactic_name(std::int64_t tokens) const;
  [[nodiscard]] const tune::Problem* tune_problem() const;

  // Collective. x bf16 [T, H] (the same tokens on every rank, 16-byte aligned), out bf16 [T, H],
  // both on this rank's device, T <= max_tokens. topk_ids (i32 [T, top_k], global expert ids)
  // and topk_weights (f32 [T, top_k]) on the device when routing is precomputed, else empty
  // views (the checkpoint's router). `events`, when given, are 3 events recorded before the
  // expert computation, before the all-reduce and after the rounding (to time the all-reduce
  // apart).
  void forward(const TensorView& x, const TensorView& out, cudaStream_t stream,
               const TensorView& topk_ids = {}, const TensorView& topk_weights = {},
               cudaEvent_t* events = nullptr) const;

  // Collective; host convenience with MoeLayer::forward's contract (x f32 or bf16 [T, H]),
  // returns f32 [T, H] (bf16 values). Synchronizes.
  [[nodiscard]] Tensor forward_host(const TensorView& x, const Routing* routing = nullptr) const;

 private:
  struct State;
  static PreparedMoe prepared_views(const State& state);
  std::shared_ptr<State> state_;
};

}  // namespace mxq::moe
