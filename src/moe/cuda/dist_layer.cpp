#include "mxq/moe/dist_layer.h"

#include "host_forward.h"
#include "mxq/core/cuda_check.h"

namespace mxq::moe {

namespace gpu {
// rank_sum.cu: with one "rank" it is the rounding of the all-reduced sum to bf16.
void sum_ranks_to_bf16(const float* partials, int ranks, std::size_t elements, std::uint16_t* out,
                       cudaStream_t stream);
}  // namespace gpu

struct MoeDistLayer::State {
  MoeGpuLayer local;
  dist::Communicator* comm = nullptr;
  Tensor partial;  // f32 [max_tokens, H]: this rank's partial, then the all-reduced sum
};

MoeDistLayer MoeDistLayer::upload(const MoeLayer& layer, dist::Communicator& comm, int max_tokens,
                                  Device device, gpu::GemmVariant gemm,
                                  const tune::Autotuner* tuner) {
  MXQ_CHECK(layer.num_ranks() == comm.size(), ErrorCode::kInvalidArgument,
            "MoeDistLayer::upload: the layer's TP x EP ranks (", layer.shards().tp_size, " x ",
            layer.shards().ep_size, " = ", layer.num_ranks(),
            ") must equal the communicator's size; found ", comm.size());
  auto state = std::make_shared<State>(
      State{MoeGpuLayer::upload_rank(layer, comm.rank(), max_tokens, device, gemm, tuner), &comm,
            Tensor()});
  state->partial =
      Tensor::empty(DType::kF32, {max_tokens, layer.config().hidden_size}, state->local.device());
  MoeDistLayer out;
  out.state_ = std::move(state);
  return out;
}

int MoeDistLayer::rank() const { return state_->comm->rank(); }
int MoeDistLayer::size() const { return state_->comm->size(); }
const MoeGpuLayer& MoeDistLayer::local() const { return state_->local; }

void MoeDistLayer::forward(const TensorView& x, const TensorView& out, cudaStream_t stream,
                           const TensorView& topk_ids, const TensorView& topk_weights,
                           cudaEvent_t* events) const {
  const State& s = *state_;
  const std::int64_t hidden = s.local.config().hidden_size;
  require_rank(x, "x", 2);
  const std::int64_t tokens = x.size(0);
  require_shape(out, "out", {tokens, hidden});
  require_dtype(out, "out", DType::kBF16);
  require_device(out, "out", s.local.device());
  require_contiguous(out, "out");
  MXQ_CHECK(tokens <= s.local.max_tokens(), ErrorCode::kOutOfRange, "x: at most ",
            s.local.max_tokens(), " tokens (the layer's max_tokens), found ", tokens);
  const std::size_t elements = static_cast<std::size_t>(tokens * hidden);
  // The first T rows of the [max_tokens, H] buffer.
  const TensorView partial(s.partial.data(), DType::kF32, {tokens, hidden}, s.local.device());
  if (events != nullptr) MXQ_CUDA_CHECK(cudaEventRecord(events[0], stream));
  s.local.forward_partial(x, partial, stream, topk_ids, topk_weights);
  if (events != nullptr) MXQ_CUDA_CHECK(cudaEventRecord(events[1], stream));
  s.comm->all_reduce_device(static_cast<float*>(partial.data()), elements, dist::ReduceOp::kSum,
                            stream);
  gpu::sum_ranks_to_bf16(static_cast<const float*>(partial.data()), 1, elements,
                         static_cast<std::uint16_t*>(out.data()), stream);
  if (events != nullptr) MXQ_CUDA_CHECK(cudaEventRecord(events[2], stream));
}

Tensor MoeDistLayer::forward_host(const TensorView& x, const Routing* routing) const {
  return detail::forward_on_host(
      x, routing, state_->local.device(),
      [this](const TensorView& xd, const TensorView& out, cudaStream_t stream,
             const TensorView& ids,
             const TensorView& weights) { forward(xd, out, stream, ids, weights); });
}

}  // namespace mxq::moe
