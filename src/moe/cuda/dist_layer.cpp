#include "mxq/moe/dist_layer.h"

#include <utility>

#include "gemm_choice.h"
#include "host_forward.h"
#include "moe/mxfp4_moe_backend.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/device.h"
#include "mxq/moe/checkpoint_experts.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"

namespace mxq::moe {

namespace gpu {
// rank_sum.cu: with one "rank" it is the rounding of the all-reduced sum to bf16.
void sum_ranks_to_bf16(const float* partials, int ranks, std::size_t elements, std::uint16_t* out,
                       cudaStream_t stream);
}  // namespace gpu

struct MoeDistLayer::State {
  dist::Communicator* comm = nullptr;
  MoeConfig config;
  MoeLayerShape layer;
  MoeRank rank;
  PreparedMoeShapes shapes;
  Device device;
  int max_tokens = 0;
  Mxfp4MoeOptions options;  // options.gemm: the variant without a tuner's decision
  const tune::Autotuner* tuner = nullptr;
  tune::Problem problem;  // moe_gpu_forward of this rank; empty without channels
  Tensor w13, w13_scale, w13_bias, w2, w2_scale, w2_bias;  // prepared, on the device
  Tensor router_weight, router_bias;                       // undefined without a router
  Tensor workspace;  // the op's, for max_tokens; zeroed once, every forward leaves it zeroed
  Tensor partial;    // f32 [max_tokens, H]: this rank's partial, then the all-reduced sum
};

namespace {

constexpr const char* kFactory = "MoeDistLayer::from_checkpoint";

// The checks that need no reading: the group, the sizes, the device, the tuner.
void check_request(const dist::Communicator& comm, int tp_size, int ep_size, int max_tokens,
                   Device device, const tune::Autotuner* tuner) {
  if (tp_size < 1) fail_argument(ErrorCode::kInvalidArgument, "tp_size", ">= 1", tp_size);
  if (ep_size < 1) fail_argument(ErrorCode::kInvalidArgument, "ep_size", ">= 1", ep_size);
  const std::int64_t ranks = static_cast<std::int64_t>(tp_size) * ep_size;
  MXQ_CHECK(ranks == comm.size(), ErrorCode::kInvalidArgument, kFactory, ": tp_size x ep_size (",
            tp_size, " x ", ep_size, " = ", ranks, ") must equal the communicator's size; found ",
            comm.size());
  MXQ_CHECK(device.is_cuda(), ErrorCode::kDeviceMismatch, kFactory,
            ": device: expected a CUDA device, found ", device);
  MXQ_CHECK(max_tokens >= 1, ErrorCode::kInvalidArgument, kFactory,
            ": max_tokens: expected >= 1, found ", max_tokens);
  if (tuner != nullptr && tuner->backend() != tune::Backend::kCuda) {
    fail_argument(ErrorCode::kInvalidArgument, "MoeDistLayer::from_checkpoint: tuner",
                  "an autotuner of backend cuda", tune::to_string(tuner->backend()));
  }
}

}  // namespace

MoeDistLayer MoeDistLayer::from_checkpoint(const MoeCheckpoint& checkpoint, std::int64_t layer,
                                           const MoeConfigOverrides& overrides,
                                           dist::Communicator& comm, int tp_size, int ep_size,
                                           std::int64_t alignment, int max_tokens, Device device,
                                           gpu::GemmVariant gemm, const tune::Autotuner* tuner) {
  check_request(comm, tp_size, ep_size, max_tokens, device, tuner);
  auto state = std::make_shared<State>();
  State& s = *state;
  s.comm = &comm;
  s.config = checkpoint.resolve_config(layer, overrides);
  const MoeConfig& config = s.config;
  s.layer = {config.num_experts, config.hidden_size, config.intermediate_size, config.has_bias};
  s.rank = {comm.rank() % tp_size,  tp_size, comm.rank() / tp_size, ep_size, alignment,
            config.activation_quant};
  s.shapes = prepared_moe_shapes(s.layer, s.rank);  // the sizes, before anything is read
  s.device = device;
  s.max_tokens = max_tokens;
  s.tuner = tuner;
  s.options.top_k = config.top_k;
  s.options.activation = config.activation;
  s.options.swiglu_alpha = config.swiglu_alpha;
  s.options.swiglu_limit = config.swiglu_limit;
  s.options.add_down_bias = true;  // the prepared down bias is non-zero on TP rank 0 only
  s.options.max_tokens = max_tokens;
  s.options.gemm = gemm;
  if (const char* reason =
          detail::device_unsupported_reason(s.shapes, s.layer.num_experts, s.layer.hidden_size,
                                            s.rank.activation_quant, s.options, s.layer.has_bias)) {
    fail(ErrorCode::kUnsupported, kFactory, ": CUDA MoE: rank ", comm.rank(), ": ", reason);
  }
  if (s.shapes.tp.valid > 0) {
    MoeGpuForwardShape key;
    key.experts = config.num_experts;
    key.experts_local = s.shapes.ep.count;
    key.hidden = config.hidden_size;
    key.intermediate_valid = s.shapes.tp.valid;
    key.intermediate_after_pad = s.shapes.intermediate_size_per_partition_after_pad;
    key.top_k = config.top_k;
    key.has_bias = config.has_bias;
    key.activation = config.activation;
    key.activation_quant = s.rank.activation_quant;
    s.problem = moe_gpu_forward_problem(key);
  }

  // Only this rank's experts and channels leave the checkpoint; they are prepared on the device
  // from unprepared device copies, which are freed once the preparation has finished.
  const CheckpointExperts host = read_checkpoint_experts(checkpoint, layer, overrides, s.rank);
  const mxq::detail::DeviceScope on_device(device);
  s.w13 = Tensor::empty(DType::kU8, s.shapes.w13, device);
  s.w13_scale = Tensor::empty(DType::kU8, s.shapes.w13_scale, device);
  s.w2 = Tensor::empty(DType::kU8, s.shapes.w2, device);
  s.w2_scale = Tensor::empty(DType::kU8, s.shapes.w2_scale, device);
  if (config.has_bias) {
    s.w13_bias = Tensor::empty(DType::kBF16, s.shapes.w13_bias, device);
    s.w2_bias = Tensor::empty(DType::kBF16, s.shapes.w2_bias, device);
  }
  {
    const auto upload = [&](const Tensor& t) { return t.defined() ? t.to(device) : Tensor(); };
    const Tensor w13 = upload(host.w13);
    const Tensor w13_scale = upload(host.w13_scale);
    const Tensor w13_bias = upload(host.w13_bias);
    const Tensor w2 = upload(host.w2);
    const Tensor w2_scale = upload(host.w2_scale);
    const Tensor w2_bias = upload(host.w2_bias);
    // (An undefined Tensor is an empty view: no bias.)
    const MoeExpertTensors experts{host.layout, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias};
    // The legacy default stream, then a wait: the forwards may run on a non-blocking stream.
    prepare_mxfp4_moe(experts, s.layer, s.rank, MoeDistLayer::prepared_views(s), nullptr);
    MXQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  if (host.router_weight.defined()) s.router_weight = host.router_weight.to(device);
  if (host.router_bias.defined()) s.router_bias = host.router_bias.to(device);
  const std::size_t workspace_bytes = mxfp4_moe_workspace_bytes(s.layer, s.rank, s.options, device);
  s.workspace = Tensor::zeros(DType::kU8, {static_cast<std::int64_t>(workspace_bytes)}, device);
  s.partial = Tensor::empty(DType::kF32, {max_tokens, config.hidden_size}, device);
  MoeDistLayer out;
  out.state_ = std::move(state);
  return out;
}

int MoeDistLayer::rank() const { return state_->comm->rank(); }
int MoeDistLayer::size() const { return state_->comm->size(); }
const MoeConfig& MoeDistLayer::config() const { return state_->config; }
const MoeLayerShape& MoeDistLayer::layer_shape() const { return state_->layer; }
const MoeRank& MoeDistLayer::moe_rank() const { return state_->rank; }
const PreparedMoeShapes& MoeDistLayer::shapes() const { return state_->shapes; }
int MoeDistLayer::max_tokens() const { return state_->max_tokens; }
Device MoeDistLayer::device() const { return state_->device; }

PreparedMoe MoeDistLayer::prepared() const { return prepared_views(*state_); }

PreparedMoe MoeDistLayer::prepared_views(const State& s) {
  return {s.w13, s.w13_scale, s.w13_bias, s.w2, s.w2_scale, s.w2_bias};
}

gpu::GemmChoice MoeDistLayer::gemm_choice(std::int64_t tokens) const noexcept {
  const State& s = *state_;
  return detail::choose_gemm(
      s.tuner, s.problem, tokens,
      detail::device_gemm_variant(s.shapes, s.layer.num_experts, s.layer.hidden_size,
                                  s.rank.activation_quant, s.options, tokens));
}

std::string MoeDistLayer::tactic_name(std::int64_t tokens) const {
  return detail::moe_tactic_name(state_->rank.activation_quant == ActivationQuant::kFp8Group128,
                                 gemm_choice(tokens).gemm);
}

const tune::Problem* MoeDistLayer::tune_problem() const {
  return state_->problem.empty() ? nullptr : &state_->problem;
}

void MoeDistLayer::forward(const TensorView& x, const TensorView& out, cudaStream_t stream,
                           const TensorView& topk_ids, const TensorView& topk_weights,
                           cudaEvent_t* events) const {
  const State& s = *state_;
  const std::int64_t hidden = s.config.hidden_size;
  require_rank(x, "x", 2);
  require_device(x, "x", s.device);
  const std::int64_t tokens = x.size(0);
  MXQ_CHECK(tokens <= s.max_tokens, ErrorCode::kOutOfRange, "x: at most ", s.max_tokens,
            " tokens (the layer's max_tokens), found ", tokens);
  // The router and GEMM kernels read x in 16-byte vectors.
  const auto misalignment = reinterpret_cast<std::uintptr_t>(x.data()) % 16;
  MXQ_CHECK(misalignment == 0, ErrorCode::kInvalidArgument,
            "x: expected a 16-byte aligned address (the kernels read 16-byte vectors), found one ",
            misalignment, " bytes past a boundary (a view at an element offset: pass a copy)");
  require_shape(out, "out", {tokens, hidden});
  require_dtype(out, "out", DType::kBF16);
  require_device(out, "out", s.device);
  require_contiguous(out, "out");
  MoeRouting routing;
  if (topk_ids.data() != nullptr || topk_weights.data() != nullptr) {
    routing.topk_ids = topk_ids;
    routing.topk_weights = topk_weights;
  } else {
    MXQ_CHECK(s.router_weight.defined(), ErrorCode::kInvalidArgument,
              "topk_ids: this layer has no router; pass precomputed routing");
    routing.router_weight = s.router_weight;
    routing.router_bias = s.router_bias;
  }
  Mxfp4MoeOptions options = s.options;
  options.gemm = gemm_choice(tokens).gemm;
  const std::size_t elements = static_cast<std::size_t>(tokens * hidden);
  // The first T rows of the [max_tokens, H] buffer.
  const TensorView partial(s.partial.data(), DType::kF32, {tokens, hidden}, s.device);
  const mxq::detail::DeviceScope on_device(s.device);
  if (events != nullptr) MXQ_CUDA_CHECK(cudaEventRecord(events[0], stream));
  mxfp4_moe(x, prepared(), s.layer, s.rank, routing, options, partial, s.workspace, stream);
  if (events != nullptr) MXQ_CUDA_CHECK(cudaEventRecord(events[1], stream));
  if (elements > 0) {  // every rank has the same T: all of them skip, or none
    s.comm->all_reduce_device(static_cast<float*>(partial.data()), elements, dist::ReduceOp::kSum,
                              stream);
    gpu::sum_ranks_to_bf16(static_cast<const float*>(partial.data()), 1, elements,
                           static_cast<std::uint16_t*>(out.data()), stream);
  }
  if (events != nullptr) MXQ_CUDA_CHECK(cudaEventRecord(events[2], stream));
}

Tensor MoeDistLayer::forward_host(const TensorView& x, const Routing* routing) const {
  return detail::forward_on_host(
      x, routing, state_->device,
      [this](const TensorView& xd, const TensorView& out, cudaStream_t stream,
             const TensorView& ids,
             const TensorView& weights) { forward(xd, out, stream, ids, weights); });
}

}  // namespace mxq::moe
