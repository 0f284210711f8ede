#include "mxq/moe/dist_layer.h"

#include <cstring>

#include "mxq/core/cuda_check.h"
#include "mxq/formats/bf16.h"

namespace mxq::moe {

namespace cuda {
// rank_sum.cu: with one "rank" it is the rounding of the all-reduced sum to bf16.
void sum_ranks_to_bf16(const float* partials, int ranks, std::size_t elements, std::uint16_t* out,
                       cudaStream_t stream);
}  // namespace cuda

struct MoeDistLayer::State {
  MoeGpuLayer local;
  dist::Communicator* comm = nullptr;
  Tensor partial;  // f32 [max_tokens, H]: this rank's partial, then the all-reduced sum
};

MoeDistLayer MoeDistLayer::upload(const MoeLayer& layer, dist::Communicator& comm, int max_tokens,
                                  Device device, cuda::GemmVariant gemm,
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
  cuda::sum_ranks_to_bf16(static_cast<const float*>(partial.data()), 1, elements,
                          static_cast<std::uint16_t*>(out.data()), stream);
  if (events != nullptr) MXQ_CUDA_CHECK(cudaEventRecord(events[2], stream));
}

Tensor MoeDistLayer::forward_host(const TensorView& x, const Routing* routing) const {
  const Device device = state_->local.device();
  require_rank(x, "x", 2);
  require_device(x, "x", Device::cpu());
  require_contiguous(x, "x");
  const std::int64_t tokens = x.size(0);
  Tensor x_bf16 = Tensor::empty(DType::kBF16, x.shape());
  auto* xb = static_cast<std::uint16_t*>(x_bf16.data());
  if (x.dtype() == DType::kBF16) {
    std::memcpy(xb, x.data(), x.nbytes());
  } else {
    require_dtype(x, "x", DType::kF32);
    const float* xf = x.data_as<float>();
    for (std::int64_t i = 0; i < x.numel(); ++i) xb[i] = float_to_bf16(xf[i]);
  }
  MXQ_CUDA_CHECK(cudaSetDevice(device.index));
  const Tensor x_dev = x_bf16.to(device);
  Tensor out_dev = Tensor::empty(DType::kBF16, {tokens, x.size(1)}, device);
  Tensor ids_dev;
  Tensor weights_dev;
  if (routing != nullptr) {
    ids_dev = routing->ids.to(device);
    weights_dev = routing->weights.to(device);
  }
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    forward(x_dev, out_dev, stream, routing ? ids_dev.view() : TensorView{},
            routing ? weights_dev.view() : TensorView{});
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
  const Tensor out_bf16 = out_dev.to(Device::cpu());
  Tensor out = Tensor::empty(DType::kF32, out_bf16.shape());
  const auto* ob = static_cast<const std::uint16_t*>(out_bf16.data());
  for (std::int64_t i = 0; i < out.numel(); ++i) out.data_as<float>()[i] = bf16_to_float(ob[i]);
  return out;
}

}  // namespace mxq::moe
