#include "mxq/moe/gpu_layer.h"

#include <cstdint>

#include "gemm_choice.h"
#include "host_forward.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/device.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"

namespace mxq::moe {

namespace gpu {
// Sums `ranks` fp32 partials [T*H] in rank order and rounds to bf16 (rank_sum.cu).
void sum_ranks_to_bf16(const float* partials, int ranks, std::size_t elements, std::uint16_t* out,
                       cudaStream_t stream);
}  // namespace gpu

struct MoeGpuLayer::State {
  MoeConfig config;
  Device device;
  int max_tokens = 0;
  Tensor router_w;
  Tensor router_b;
  struct Rank {
    std::vector<Tensor> params;  // keeps the device copies alive
    gpu::MoeDeviceWeights weights;
    bool active = true;     // false when the rank holds no valid channels
    tune::Problem problem;  // moe_gpu_forward of this rank (active ranks), built once
  };
  std::vector<Rank> ranks;
  gpu::MoeParams params;  // params.gemm: the variant without a tuner's decision
  const tune::Autotuner* tuner = nullptr;
  Tensor workspace;  // u8, shared by the ranks (they run one after another on the stream)
  Tensor partials;   // f32 [ranks, max_tokens, H] when there is more than one rank
};

namespace {

bool is_w4a8(const gpu::MoeParams& params) {
  return params.activation_quant == gpu::GpuActivationQuant::kFp8Group128;
}

Tensor upload_view(const TensorView& view, Device device) {
  Tensor out = Tensor::empty(view.dtype(), view.shape(), device);
  MXQ_CUDA_CHECK(cudaMemcpy(out.data(), view.data(), view.nbytes(), cudaMemcpyHostToDevice));
  return out;
}

// E8M0 scales [..., K/32] as prepared -> the device layout [..., moe_scale_pitch(K)].
Tensor upload_scales(const TensorView& view, Device device) {
  Shape shape = view.shape();
  const int last = shape.rank() - 1;
  const int k = static_cast<int>(32 * shape[last]);
  const auto rows = static_cast<std::size_t>(view.numel() / shape[last]);
  shape[last] = gpu::moe_scale_pitch(k);
  Tensor out = Tensor::empty(view.dtype(), shape, device);
  gpu::moe_scales_to_device_layout(static_cast<const std::uint8_t*>(view.data()), rows, k,
                                   static_cast<std::uint8_t*>(out.data()), nullptr);
  MXQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return out;
}

}  // namespace

MoeGpuLayer MoeGpuLayer::upload(const MoeLayer& layer, int max_tokens, Device device,
                                gpu::GemmVariant gemm, const tune::Autotuner* tuner) {
  MXQ_CHECK(device.is_cuda(), ErrorCode::kDeviceMismatch,
            "MoeGpuLayer::upload: device: expected a CUDA device, found ", device);
  MXQ_CHECK(max_tokens >= 1, ErrorCode::kInvalidArgument,
            "MoeGpuLayer::upload: max_tokens: expected >= 1, found ", max_tokens);
  if (tuner != nullptr && tuner->backend() != tune::Backend::kCuda) {
    fail_argument(ErrorCode::kInvalidArgument, "MoeGpuLayer::upload: tuner",
                  "an autotuner of backend cuda", tune::to_string(tuner->backend()));
  }
  // No update may change the weights while they are copied (a torn copy would serve until the
  // next upload).
  const auto reading = layer.lock_for_reading("MoeGpuLayer::upload");
  const mxq::detail::DeviceScope on_device(device);
  auto state = std::make_shared<State>();
  state->tuner = tuner;
  const MoeConfig& config = layer.config();
  state->config = config;
  state->device = device;
  state->max_tokens = max_tokens;
  state->params.gemm = gemm;
  state->params.top_k = static_cast<int>(config.top_k);
  state->params.activation = gpu::gpu_activation(config.activation);
  state->params.swiglu_alpha = static_cast<float>(config.swiglu_alpha);
  state->params.swiglu_limit = static_cast<float>(config.swiglu_limit);
  state->params.add_down_bias = true;  // only TP rank 0 holds a non-zero down bias
  const bool w4a8 = config.activation_quant == ActivationQuant::kFp8Group128;
  state->params.activation_quant =
      w4a8 ? gpu::GpuActivationQuant::kFp8Group128 : gpu::GpuActivationQuant::kBf16;
  if (config.router == RouterKind::kTopkSoftmax) {
    state->router_w = upload_view(layer.router_weight(), device);
    if (layer.router_bias().defined()) state->router_b = upload_view(layer.router_bias(), device);
  }
  std::size_t workspace_bytes = 0;
  for (int r = 0; r < layer.num_ranks(); ++r) {
    const MoeRankWeights& rank = layer.rank(r);
    const MoeRankShape& shape = rank.shape();
    State::Rank out;
    out.active = shape.tp.valid > 0;
    gpu::MoeDeviceWeights& w = out.weights;
    for (const MoeParam param : kAllMoeParams) {
      if (!rank.has(param)) continue;
      out.params.push_back(is_scale(param) ? upload_scales(rank.view(param), device)
                                           : upload_view(rank.view(param), device));
      Tensor& uploaded = out.params.back();
      if (param == MoeParam::kW13 || param == MoeParam::kW2) {
        // The kernels read packed FP4 in the device layout of their activation quantization.
        // Legacy default stream, then a wait: the forward may run on a non-blocking stream.
        auto* packed = static_cast<std::uint8_t*>(uploaded.data());
        const Shape& shape_bytes = uploaded.shape();  // [..., K/2]
        const std::int64_t row_bytes = shape_bytes[shape_bytes.rank() - 1];
        const auto rows = static_cast<std::size_t>(uploaded.numel() / row_bytes);
        const int k = static_cast<int>(2 * row_bytes);
        if (w4a8) {
          gpu::moe_weights_to_w4a8_layout(packed, rows, k, nullptr);
        } else {
          gpu::moe_weights_to_device_layout(packed, rows, k, nullptr);
        }
        MXQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
      }
      const void* p = uploaded.data();
      switch (param) {
        case MoeParam::kW13:
          w.w13 = static_cast<const std::uint8_t*>(p);
          break;
        case MoeParam::kW13Scale:
          w.w13_scale = static_cast<const std::uint8_t*>(p);
          break;
        case MoeParam::kW2:
          w.w2 = static_cast<const std::uint8_t*>(p);
          break;
        case MoeParam::kW2Scale:
          w.w2_scale = static_cast<const std::uint8_t*>(p);
          break;
        case MoeParam::kW13Bias:
          w.b13 = static_cast<const std::uint16_t*>(p);
          break;
        case MoeParam::kW2Bias:
          w.b2 = static_cast<const std::uint16_t*>(p);
          break;
      }
    }
    if (state->router_w.defined()) {
      w.router_w = static_cast<const std::uint16_t*>(state->router_w.data());
      w.router_b = state->router_b.defined()
                       ? static_cast<const std::uint16_t*>(state->router_b.data())
                       : nullptr;
    }
    w.num_local_experts = static_cast<int>(shape.experts_local());
    w.first_local_expert = static_cast<int>(shape.ep.begin);
    w.num_global_experts = static_cast<int>(config.num_experts);
    w.hidden = static_cast<int>(shape.hidden);
    // The kernels stream only the channels that hold data; zero-filled and padded channels
    // contribute exactly 0.
    w.inter = static_cast<int>(shape.tp.valid);
    w.inter_padded = static_cast<int>(shape.intermediate_size_per_partition_after_pad);
    if (out.active) {
      if (const char* reason = gpu::moe_forward_unsupported_reason(w, state->params)) {
        fail(ErrorCode::kUnsupported, "CUDA MoE: rank ", r, ": ", reason);
      }
      workspace_bytes =
          std::max(workspace_bytes, gpu::moe_workspace_bytes(w, state->params, max_tokens));
      // The workspace does not depend on the GEMM variant, so a tuner may pick either per call.
      {
        MoeGpuForwardShape key;
        key.experts = config.num_experts;
        key.experts_local = shape.experts_local();
        key.hidden = shape.hidden;
        key.intermediate_valid = shape.tp.valid;
        key.intermediate_after_pad = shape.intermediate_size_per_partition_after_pad;
        key.top_k = config.top_k;
        key.has_bias = rank.has(MoeParam::kW13Bias);
        key.activation = config.activation;
        key.activation_quant = config.activation_quant;
        out.problem = moe_gpu_forward_problem(key);
      }
    }
    state->ranks.push_back(std::move(out));
  }
  state->workspace =
      Tensor::empty(DType::kU8, {static_cast<std::int64_t>(workspace_bytes)}, device);
  // The routing kernel's tickets start at zero; finished before any stream of the caller runs.
  gpu::moe_workspace_init(state->workspace.data(), max_tokens, nullptr);
  MXQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  if (state->ranks.size() > 1) {
    state->partials = Tensor::empty(
        DType::kF32,
        {static_cast<std::int64_t>(state->ranks.size()), max_tokens, config.hidden_size}, device);
  }
  MoeGpuLayer result;
  result.state_ = std::move(state);
  return result;
}

int MoeGpuLayer::max_tokens() const { return state_->max_tokens; }
const MoeConfig& MoeGpuLayer::config() const { return state_->config; }
int MoeGpuLayer::num_ranks() const { return static_cast<int>(state_->ranks.size()); }
std::string MoeGpuLayer::tactic_name() const {
  return detail::moe_tactic_name(is_w4a8(state_->params), state_->params.gemm);
}

MoeGpuLayer::GemmChoice MoeGpuLayer::gemm_choice(std::int64_t tokens, int rank) const noexcept {
  const State& s = *state_;
  if (rank < 0 || rank >= static_cast<int>(s.ranks.size())) return {s.params.gemm, false};
  const State::Rank& held = s.ranks[static_cast<std::size_t>(rank)];
  return detail::choose_gemm(
      s.tuner, held.problem, tokens,
      gpu::resolve_gemm_variant(held.weights, s.params, static_cast<int>(tokens)));
}

std::string MoeGpuLayer::tactic_name(std::int64_t tokens, int rank) const {
  return detail::moe_tactic_name(is_w4a8(state_->params), gemm_choice(tokens, rank).gemm);
}

const tune::Problem* MoeGpuLayer::tune_problem(int rank) const {
  MXQ_CHECK(rank >= 0 && rank < num_ranks(), ErrorCode::kOutOfRange,
            "MoeGpuLayer::tune_problem: rank: expected 0..", num_ranks() - 1, ", found ", rank);
  const tune::Problem& problem = state_->ranks[static_cast<std::size_t>(rank)].problem;
  return problem.empty() ? nullptr : &problem;
}

namespace {

// The checks of forward(): x bf16 [T, H] and routing on the layer's device. Returns T.
std::int64_t check_forward_inputs(const MoeConfig& config, Device device, int max_tokens,
                                  bool has_router, const TensorView& x, const TensorView& topk_ids,
                                  const TensorView& topk_weights) {
  const std::int64_t hidden = config.hidden_size;
  require_rank(x, "x", 2);
  require_dtype(x, "x", DType::kBF16);
  require_device(x, "x", device);
  require_contiguous(x, "x");
  // The router and GEMM kernels read x in 16-byte vectors.
  const auto misalignment = reinterpret_cast<std::uintptr_t>(x.data()) % 16;
  MXQ_CHECK(misalignment == 0, ErrorCode::kInvalidArgument,
            "x: expected a 16-byte aligned address (the kernels read 16-byte vectors), found one ",
            misalignment, " bytes past a boundary (a view at an element offset: pass a copy)");
  const std::int64_t tokens = x.size(0);
  MXQ_CHECK(x.size(1) == hidden, ErrorCode::kShapeMismatch, "x: expected [T, ", hidden, "], found ",
            x.shape());
  MXQ_CHECK(tokens <= max_tokens, ErrorCode::kOutOfRange, "x: at most ", max_tokens,
            " tokens (the layer's max_tokens), found ", tokens);
  if (topk_ids.data() != nullptr) {
    require_shape(topk_ids, "topk_ids", {tokens, config.top_k});
    require_dtype(topk_ids, "topk_ids", DType::kI32);
    require_device(topk_ids, "topk_ids", device);
    require_shape(topk_weights, "topk_weights", {tokens, config.top_k});
    require_dtype(topk_weights, "topk_weights", DType::kF32);
    require_device(topk_weights, "topk_weights", device);
  } else {
    MXQ_CHECK(has_router, ErrorCode::kInvalidArgument,
              "topk_ids: this layer has no router; pass precomputed routing");
  }
  return tokens;
}

}  // namespace

void MoeGpuLayer::run_rank(std::size_t r, const TensorView& x, float* partial,
                           std::uint16_t* out_bf16, cudaStream_t stream, const TensorView& topk_ids,
                           const TensorView& topk_weights) const {
  const State& s = *state_;
  const std::int64_t tokens = x.size(0);
  const std::size_t elements = static_cast<std::size_t>(tokens * s.config.hidden_size);
  if (!s.ranks[r].active) {  // no channels: an exact zero partial (or output)
    if (partial != nullptr) {
      MXQ_CUDA_CHECK(cudaMemsetAsync(partial, 0, elements * sizeof(float), stream));
    }
    if (out_bf16 != nullptr) {
      MXQ_CUDA_CHECK(cudaMemsetAsync(out_bf16, 0, elements * sizeof(std::uint16_t), stream));
    }
    return;
  }
  const bool precomputed = topk_ids.data() != nullptr;
  gpu::MoeRun run;
  run.x = static_cast<const std::uint16_t*>(x.data());
  run.tokens = static_cast<int>(tokens);
  run.topk_ids = precomputed ? static_cast<const int*>(topk_ids.data()) : nullptr;
  run.topk_weights = precomputed ? static_cast<const float*>(topk_weights.data()) : nullptr;
  run.out_f32 = partial;
  run.out_bf16 = out_bf16;
  gpu::MoeParams params = s.params;
  params.gemm = gemm_choice(tokens, static_cast<int>(r)).gemm;
  gpu::moe_forward(s.ranks[r].weights, params, run, s.workspace.data(), s.workspace.nbytes(),
                   s.max_tokens, stream);
}

void MoeGpuLayer::forward(const TensorView& x, const TensorView& out, cudaStream_t stream,
                          const TensorView& topk_ids, const TensorView& topk_weights) const {
  const State& s = *state_;
  const std::int64_t hidden = s.config.hidden_size;
  const std::int64_t tokens = check_forward_inputs(s.config, s.device, s.max_tokens,
                                                   s.router_w.defined(), x, topk_ids, topk_weights);
  require_shape(out, "out", {tokens, hidden});
  require_dtype(out, "out", DType::kBF16);
  require_device(out, "out", s.device);
  require_contiguous(out, "out");
  // The kernels launch on the current device; the caller's is given back.
  const mxq::detail::DeviceScope on_device(s.device);
  const bool single = s.ranks.size() == 1;
  const std::size_t elements = static_cast<std::size_t>(tokens * hidden);
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    float* partial = single ? nullptr : s.partials.data_as<float>() + r * elements;
    run_rank(r, x, partial, single ? static_cast<std::uint16_t*>(out.data()) : nullptr, stream,
             topk_ids, topk_weights);
  }
  if (!single) {
    // The partials of all ranks are laid out [rank][T*H] with stride `elements`.
    gpu::sum_ranks_to_bf16(s.partials.data_as<float>(), static_cast<int>(s.ranks.size()), elements,
                           static_cast<std::uint16_t*>(out.data()), stream);
  }
}

Device MoeGpuLayer::device() const { return state_->device; }

Tensor MoeGpuLayer::forward_host(const TensorView& x, const Routing* routing) const {
  return detail::forward_on_host(
      x, routing, state_->device,
      [this](const TensorView& xd, const TensorView& out, cudaStream_t stream,
             const TensorView& ids,
             const TensorView& weights) { forward(xd, out, stream, ids, weights); });
}

}  // namespace mxq::moe
