// MoeGpuLayer: a MoeLayer's ranks uploaded to one CUDA device, run by the CUDA MoE tactics.
// All TP x EP ranks are simulated on the one GPU (each rank's partial output in fp32, summed in
// rank order, rounded to bf16 once), exactly as the CPU reference does. Workspace and device
// buffers are allocated up front for `max_tokens`, so forward() allocates nothing and can be
// captured in a CUDA graph.
//
// Distributed execution (moe/dist_layer.h) holds one rank per process instead, through the
// engine-facing op (mxq/moe/mxfp4_moe.h), and sums the ranks' partials with an all-reduce.
//
// Autotuner: given a tune::Autotuner of backend cuda at upload, forward() asks its cache, per rank
// and per call, which GEMM variant to run for the call's token count (op moe_gpu_forward,
// mxq/moe/tune.h; the rank problems are built once at upload, and the lookup is
// allocation-free and safe under graph capture). Without a cached decision the variant given at
// upload runs. The tuner must outlive the layer.
//
// Devices: upload and forward make the layer's device current while they work
// and give the caller's current device back, also when they throw; `stream` must belong to the
// layer's device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mxq/core/tensor.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/layer.h"

namespace mxq::tune {
class Autotuner;
class Problem;
}  // namespace mxq::tune

namespace mxq::moe {

class MoeGpuLayer {
 public:
  // Copies every rank's current weights (prepared or not) and the router to `device`. `gemm`:
  // the variant that runs when `tuner` is null or its cache has no decision for a call (kAuto:
  // the dispatch rule of gpu::resolve_gemm_variant, per call).
  static MoeGpuLayer upload(const MoeLayer& layer, int max_tokens, Device device = Device::cuda(0),
                            gpu::GemmVariant gemm = gpu::GemmVariant::kAuto,
                            const tune::Autotuner* tuner = nullptr);

  [[nodiscard]] int max_tokens() const;
  [[nodiscard]] Device device() const;
  [[nodiscard]] const MoeConfig& config() const;
  // Ranks held: all of the layer's (rank id = ep_rank * tp_size + tp_rank).
  [[nodiscard]] int num_ranks() const;
  // The tactic of the variant given at upload, e.g. "cuda.moe.w4a16.auto" (a layer
  // of activation_quant fp8_g128: "cuda.moe.w4a8.*").
  [[nodiscard]] std::string tactic_name() const;

  // What forward() runs on `rank` for `tokens` tokens (kAuto resolved), and whether the tuner's
  // cache chose it.
  using GemmChoice = gpu::GemmChoice;
  [[nodiscard]] GemmChoice gemm_choice(std::int64_t tokens, int rank = 0) const noexcept;
  // The tactic name of gemm_choice(tokens, rank).
  [[nodiscard]] std::string tactic_name(std::int64_t tokens, int rank = 0) const;
  // The moe_gpu_forward problem of `rank` (what the tuner is asked); null for a rank without
  // channels.
  [[nodiscard]] const tune::Problem* tune_problem(int rank) const;

  // x: bf16 [T, H] on the device; out: bf16 [T, H] on the device. topk_ids (i32 [T, k]) and
  // topk_weights (f32 [T, k]) on the device when routing is precomputed, else empty views.
  void forward(const TensorView& x, const TensorView& out, cudaStream_t stream,
               const TensorView& topk_ids = {}, const TensorView& topk_weights = {}) const;

  // Host convenience with MoeLayer::forward's contract: x f32 (bf16 values) or bf16 [T, H] on
  // the host; returns f32 [T, H] (bf16 values). Synchronizes.
  [[nodiscard]] Tensor forward_host(const TensorView& x, const Routing* routing = nullptr) const;

 private:
  // Enqueues held rank `r`: its fp32 partial into `partial` and/or its bf16 output into
  // `out_bf16` (either may be null).
  void run_rank(std::size_t r, const TensorView& x, float* partial, std::uint16_t* out_bf16,
                cudaStream_t stream, const TensorView& topk_ids,
                const TensorView& topk_weights) const;

  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace mxq::moe
