// Registers the CUDA MoE forward's tactics with the autotuner (see include/mxq/moe/tune.h): the
// grouped GEMMs' variants, gpu::GemmVariant::kDecodeMma (the default) and kPrefillWgmma, for
// W4A16 and W4A8 problems (x=fp8_g128: the weights in the W4A8 device layout, the CPU reference
// with the activations quantized to E4M3 groups as the layer does).
//
// Workload: one rank's weights (random FP4 codes, scales mostly 2^-9..2^-6 with a few above 2,
// bf16 biases; padded to P as the layer's preparation does), bf16 tokens and precomputed top-k
// routing over all E experts (slots routed to other EP ranks are skipped, as in the layer). The
// whole input set (weights, tokens, routing) rotates through copies that together exceed twice
// the L2 size, one set per run() call (a set larger than that is not copied), so the timed calls
// stream their weights from HBM as a serving layer does; workspace and output are shared. The
// check poisons the output with NaN, runs, copies back and compares with the CPU reference
// (moe::cpu::rank_expert_forward, rounded to bf16 like the layer's output): normalized error
// <= 4e-3 and no NaN, on every token while that costs at most kMaxReferenceMacs multiply-adds
// and on an evenly spread subset of tokens beyond; every output element must be finite.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "moe/cpu/expert_forward.h"
#include "moe/layout/mxfp4_device_layout.h"
#include "moe/layout/w4a8_layout.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/core/prng.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/compare.h"
#include "mxq/moe/config.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/rank_weights.h"
#include "mxq/moe/synthetic.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/cuda_timer.h"
#include "mxq/tune/registry.h"

namespace mxq::tune {
namespace {

// About 1 s of the multi-threaded fp64 reference on a 16-core host.
constexpr double kMaxReferenceMacs = 4.0e9;
constexpr double kMaxNormalizedError = 4e-3;

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// What a moe_gpu_forward tactic runs on: one rank's forward with the GEMM variant left to the
// tactic.
struct MoeGpuForwardArgs {
  const moe::gpu::MoeDeviceWeights* weights = nullptr;
  const moe::gpu::MoeParams* params = nullptr;
  const moe::gpu::MoeRun* run = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  int max_tokens = 0;
};

moe::Activation activation_of(const Problem& problem) {
  return moe::parse_activation(problem.dtype("act"), "moe_gpu_forward act");
}

moe::ActivationQuant activation_quant_of(const Problem& problem) {
  return moe::parse_activation_quant(problem.dtype("x"), "moe_gpu_forward x");
}

// The kernels' view of a rank of `problem` (pointers left null).
moe::gpu::MoeDeviceWeights device_shape(const Problem& problem) {
  moe::gpu::MoeDeviceWeights w;
  w.num_local_experts = static_cast<int>(problem.dim("E_local"));
  w.first_local_expert = 0;
  w.num_global_experts = static_cast<int>(problem.dim("E"));
  w.hidden = static_cast<int>(problem.dim("H"));
  w.inter = static_cast<int>(problem.dim("I"));
  w.inter_padded = static_cast<int>(problem.dim("P"));
  return w;
}

moe::gpu::MoeParams params_of(const Problem& problem, const moe::MoeConfig& config) {
  moe::gpu::MoeParams p;
  p.top_k = static_cast<int>(problem.dim("top_k"));
  p.activation = moe::gpu::gpu_activation(config.activation);
  p.swiglu_alpha = static_cast<float>(config.swiglu_alpha);
  p.swiglu_limit = static_cast<float>(config.swiglu_limit);
  p.add_down_bias = true;
  p.activation_quant = config.activation_quant == moe::ActivationQuant::kFp8Group128
                           ? moe::gpu::GpuActivationQuant::kFp8Group128
                           : moe::gpu::GpuActivationQuant::kBf16;
  return p;
}

class MoeGpuWorkload final : public Workload {
 public:
  MoeGpuWorkload(const Problem& problem, std::int64_t tokens)
      : tokens_(tokens),
        hidden_(problem.dim("H")),
        top_k_(problem.dim("top_k")),
        weights_(problem.dim("H"), problem.dim("bias") != 0,
                 moe::TpShard{0, 1, 0, problem.dim("I"), problem.dim("I")},
                 moe::EpShard{0, 1, 0, problem.dim("E_local")}) {
    MXQ_CHECK(tokens >= 1 && tokens <= (std::int64_t{1} << 30), ErrorCode::kInvalidArgument,
              "moe_gpu_forward workload: tokens=", tokens);
    config_.hidden_size = hidden_;
    config_.intermediate_size = problem.dim("I");
    config_.num_experts = problem.dim("E");
    config_.top_k = top_k_;
    config_.activation = activation_of(problem);
    config_.activation_quant = activation_quant_of(problem);
    config_.has_bias = problem.dim("bias") != 0;
    config_.router = moe::RouterKind::kPrecomputed;
    fill_weights(problem.hash() ^ static_cast<std::uint64_t>(tokens));
    if (problem.dim("P") != problem.dim("I")) {
      (void)weights_.pad_intermediate_to_alignment(problem.dim("P"));
    }
    make_tokens_and_routing(problem.hash() + static_cast<std::uint64_t>(tokens));
    compute_reference();
    upload(problem);
  }

  void run(const Tactic& tactic) override {
    const Set& set = sets_[current_];
    tactic.run(MoeGpuForwardArgs{&set.weights, &params_, &set.run, workspace_.data(),
                                 workspace_.nbytes(), static_cast<int>(tokens_)});
    current_ = (current_ + 1) % sets_.size();
  }

  CheckResult check(const Tactic& tactic) override {
    MXQ_CUDA_CHECK(cudaMemset(out_.data(), 0xFF, out_.nbytes()));  // NaN poison
    run(tactic);
    MXQ_CUDA_CHECK(cudaDeviceSynchronize());  // a kernel fault is charged to this tactic
    const Tensor host = out_.to(Device::cpu());
    const auto* bits = static_cast<const std::uint16_t*>(host.data());
    for (std::int64_t i = 0; i < host.numel(); ++i) {
      if (!std::isfinite(bf16_to_float(bits[i]))) {
        return {false, std::numeric_limits<double>::infinity(),
                "output element " + std::to_string(i) + " (token " + std::to_string(i / hidden_) +
                    ") not written or not finite"};
      }
    }
    const auto rows = static_cast<std::int64_t>(reference_tokens_.size());
    Tensor sampled = Tensor::empty(DType::kF32, {rows, hidden_});
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t h = 0; h < hidden_; ++h) {
        sampled.data_as<float>()[r * hidden_ + h] =
            bf16_to_float(bits[reference_tokens_[static_cast<std::size_t>(r)] * hidden_ + h]);
      }
    }
    std::int64_t nan_mismatches = 0;
    const double error = moe::normalized_error(sampled, reference_, &nan_mismatches);
    if (nan_mismatches != 0 || !(error <= kMaxNormalizedError)) {
      return {false, error,
              "normalized error " + std::to_string(error) + " (bound " +
                  std::to_string(kMaxNormalizedError) + "), " + std::to_string(nan_mismatches) +
                  " NaN mismatches over " + std::to_string(rows) + " reference token(s)"};
    }
    return {true, error, ""};
  }

 private:
  struct Set {
    moe::gpu::MoeDeviceWeights weights;
    moe::gpu::MoeRun run;
  };

  // Random checkpoint-layout weights (as tests/cpp/moe/moe_forward_gpu_test.cu draws them).
  void fill_weights(std::uint64_t seed) {
    Xoshiro256 rng(seed);
    for (const moe::MoeParam param : moe::kAllMoeParams) {
      if (!weights_.has(param)) continue;
      const TensorView view = weights_.view(param);
      auto* bytes = static_cast<std::uint8_t*>(view.data());
      if (moe::is_scale(param)) {
        for (std::size_t i = 0; i < view.nbytes(); ++i) {
          const std::uint64_t r = rng.next();
          bytes[i] = r % 1000 == 0 ? static_cast<std::uint8_t>(129 + r % 2)
                                   : static_cast<std::uint8_t>(118 + r % 4);
        }
      } else if (param == moe::MoeParam::kW13Bias || param == moe::MoeParam::kW2Bias) {
        auto* bits = static_cast<std::uint16_t*>(view.data());
        for (std::int64_t i = 0; i < view.numel(); ++i)
          bits[i] = float_to_bf16(0.1F * rng.uniform_symmetric());
      } else {
        for (std::size_t i = 0; i < view.nbytes(); i += 8) {
          const std::uint64_t r = rng.next();
          std::memcpy(bytes + i, &r, std::min<std::size_t>(8, view.nbytes() - i));
        }
      }
    }
  }

  void make_tokens_and_routing(std::uint64_t seed) {
    const Tensor x = moe::synthetic_tokens(tokens_, hidden_, seed);
    x_bits_.resize(static_cast<std::size_t>(tokens_ * hidden_));
    for (std::size_t i = 0; i < x_bits_.size(); ++i)
      x_bits_[i] = float_to_bf16(x.data_as<float>()[i]);
    // Distinct experts per token out of all E, weights summing to 1.
    Xoshiro256 rng(seed ^ 0x726f757465ULL);
    ids_.resize(static_cast<std::size_t>(tokens_ * top_k_));
    routing_.resize(ids_.size());
    std::vector<std::int32_t> order(static_cast<std::size_t>(config_.num_experts));
    for (std::int64_t t = 0; t < tokens_; ++t) {
      for (std::size_t e = 0; e < order.size(); ++e) order[e] = static_cast<std::int32_t>(e);
      float sum = 0;
      for (std::int64_t k = 0; k < top_k_; ++k) {  // partial Fisher-Yates: the first k slots
        const auto slot = static_cast<std::size_t>(k);
        const std::size_t pick =
            slot + static_cast<std::size_t>(rng.next() % (order.size() - slot));
        std::swap(order[static_cast<std::size_t>(k)], order[pick]);
        const auto at = static_cast<std::size_t>(t * top_k_ + k);
        ids_[at] = order[static_cast<std::size_t>(k)];
        routing_[at] = 0.55F + 0.45F * rng.uniform_symmetric();
        sum += routing_[at];
      }
      for (std::int64_t k = 0; k < top_k_; ++k)
        routing_[static_cast<std::size_t>(t * top_k_ + k)] /= sum;
    }
  }

  // The reference output (bf16 values) of an evenly spread subset of tokens.
  void compute_reference() {
    const double per_token =
        3.0 * static_cast<double>(top_k_) * static_cast<double>(hidden_) *
        static_cast<double>(weights_.shape().intermediate_size_per_partition_after_pad);
    const auto count = static_cast<std::int64_t>(
        std::clamp(std::floor(kMaxReferenceMacs / per_token), 2.0, static_cast<double>(tokens_)));
    for (std::int64_t i = 0; i < count; ++i) {
      reference_tokens_.push_back(count == 1 ? 0 : i * (tokens_ - 1) / (count - 1));
    }
    reference_tokens_.erase(std::unique(reference_tokens_.begin(), reference_tokens_.end()),
                            reference_tokens_.end());
    const auto rows = static_cast<std::int64_t>(reference_tokens_.size());
    std::vector<double> x(static_cast<std::size_t>(rows * hidden_));
    std::vector<std::int32_t> ids(static_cast<std::size_t>(rows * top_k_));
    std::vector<float> weights(ids.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t t = reference_tokens_[static_cast<std::size_t>(r)];
      for (std::int64_t h = 0; h < hidden_; ++h) {
        x[static_cast<std::size_t>(r * hidden_ + h)] =
            bf16_to_float(x_bits_[static_cast<std::size_t>(t * hidden_ + h)]);
      }
      for (std::int64_t k = 0; k < top_k_; ++k) {
        ids[static_cast<std::size_t>(r * top_k_ + k)] =
            ids_[static_cast<std::size_t>(t * top_k_ + k)];
        weights[static_cast<std::size_t>(r * top_k_ + k)] =
            routing_[static_cast<std::size_t>(t * top_k_ + k)];
      }
    }
    std::vector<float> partial(x.size());
    std::vector<float> magnitude(x.size(), 0.0F);
    const moe::cpu::RankForwardInput input{x.data(), rows, ids.data(), weights.data(), top_k_};
    moe::cpu::rank_expert_forward(weights_, config_, input, partial.data(), magnitude.data());
    reference_ = Tensor::empty(DType::kF32, {rows, hidden_});
    for (std::size_t i = 0; i < partial.size(); ++i) {
      reference_.data_as<float>()[i] = round_to_bf16(partial[i]);  // the layer's one rounding
    }
  }

  void upload(const Problem& problem) {
    // One input set: the rank's parameters, then tokens, ids and routing weights.
    std::vector<std::pair<moe::MoeParam, std::size_t>> param_at;
    std::size_t bytes = 0;
    // Scales take their device layout's padded rows (moe_scale_pitch).
    const auto device_bytes = [&](moe::MoeParam param) -> std::size_t {
      const TensorView view = weights_.view(param);
      if (!moe::is_scale(param)) return view.nbytes();
      const std::int64_t width = view.shape().dim(-1);
      return static_cast<std::size_t>(view.numel() / width) *
             moe::gpu::moe_scale_pitch(static_cast<int>(32 * width));
    };
    for (const moe::MoeParam param : moe::kAllMoeParams) {
      if (!weights_.has(param)) continue;
      param_at.emplace_back(param, bytes);
      bytes += align256(device_bytes(param));
    }
    const std::size_t x_at = bytes;
    bytes += align256(x_bits_.size() * sizeof(std::uint16_t));
    const std::size_t ids_at = bytes;
    bytes += align256(ids_.size() * sizeof(std::int32_t));
    const std::size_t routing_at = bytes;
    bytes += routing_.size() * sizeof(float);
    std::vector<std::uint8_t> set(bytes, 0);
    for (const auto& [param, at] : param_at) {
      const TensorView view = weights_.view(param);
      // Packed FP4 and scales go to the GPU in the kernels' layout, as MoeGpuLayer uploads them.
      if (moe::is_scale(param)) {
        const auto width = static_cast<std::size_t>(view.shape().dim(-1));
        const auto pitch =
            static_cast<std::size_t>(moe::gpu::moe_scale_pitch(static_cast<int>(32 * width)));
        const auto* src = static_cast<const std::uint8_t*>(view.data());
        for (std::size_t row = 0; row < view.nbytes() / width; ++row)
          std::memcpy(set.data() + at + row * pitch, src + row * width, width);
        continue;
      }
      std::memcpy(set.data() + at, view.data(), view.nbytes());
      if (param == moe::MoeParam::kW13 || param == moe::MoeParam::kW2) {
        const auto row_bytes = static_cast<std::size_t>(view.shape().dim(-1));
        const std::size_t rows = view.nbytes() / row_bytes;
        const int k = static_cast<int>(2 * row_bytes);
        if (config_.activation_quant == moe::ActivationQuant::kFp8Group128) {
          moe::gpu::detail::to_w4a8_layout_host(set.data() + at, rows, k);
        } else {
          moe::gpu::detail::to_device_layout_host(set.data() + at, rows, k);
        }
      }
    }
    std::memcpy(set.data() + x_at, x_bits_.data(), x_bits_.size() * sizeof(std::uint16_t));
    std::memcpy(set.data() + ids_at, ids_.data(), ids_.size() * sizeof(std::int32_t));
    std::memcpy(set.data() + routing_at, routing_.data(), routing_.size() * sizeof(float));
    buffers_ = std::make_unique<RotatingBuffers>(set.size(), 2.0, 1);
    buffers_->fill_from_host(set.data());

    int device = 0;
    MXQ_CUDA_CHECK(cudaGetDevice(&device));
    out_ = Tensor::empty(DType::kBF16, {tokens_, hidden_}, Device::cuda(device));
    params_ = params_of(problem, config_);
    for (int i = 0; i < buffers_->sets(); ++i) {
      const auto* base = static_cast<const std::uint8_t*>(buffers_->set(i));
      Set s;
      s.weights = device_shape(problem);
      for (const auto& [param, at] : param_at) {
        const std::uint8_t* p = base + at;
        switch (param) {
          case moe::MoeParam::kW13:
            s.weights.w13 = p;
            break;
          case moe::MoeParam::kW13Scale:
            s.weights.w13_scale = p;
            break;
          case moe::MoeParam::kW2:
            s.weights.w2 = p;
            break;
          case moe::MoeParam::kW2Scale:
            s.weights.w2_scale = p;
            break;
          case moe::MoeParam::kW13Bias:
            s.weights.b13 = reinterpret_cast<const std::uint16_t*>(p);
            break;
          case moe::MoeParam::kW2Bias:
            s.weights.b2 = reinterpret_cast<const std::uint16_t*>(p);
            break;
        }
      }
      s.run.x = reinterpret_cast<const std::uint16_t*>(base + x_at);
      s.run.tokens = static_cast<int>(tokens_);
      s.run.topk_ids = reinterpret_cast<const int*>(base + ids_at);
      s.run.topk_weights = reinterpret_cast<const float*>(base + routing_at);
      s.run.out_bf16 = static_cast<std::uint16_t*>(out_.data());
      sets_.push_back(s);
    }
    if (const char* reason = moe::gpu::moe_forward_unsupported_reason(sets_[0].weights, params_)) {
      fail(ErrorCode::kUnsupported, "moe_gpu_forward ", problem.canonical(), ": ", reason);
    }
    const std::size_t workspace =
        moe::gpu::moe_workspace_bytes(sets_[0].weights, params_, static_cast<int>(tokens_));
    workspace_ =
        Tensor::empty(DType::kU8, {static_cast<std::int64_t>(workspace)}, Device::cuda(device));
    moe::gpu::moe_workspace_init(workspace_.data(), static_cast<int>(tokens_), nullptr);
    MXQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  std::int64_t tokens_, hidden_, top_k_;
  moe::MoeRankWeights weights_;
  moe::MoeConfig config_;
  std::vector<std::uint16_t> x_bits_;
  std::vector<std::int32_t> ids_;
  std::vector<float> routing_;
  std::vector<std::int64_t> reference_tokens_;
  Tensor reference_;  // f32 [reference tokens, H], bf16 values
  std::unique_ptr<RotatingBuffers> buffers_;
  std::vector<Set> sets_;
  std::size_t current_ = 0;
  moe::gpu::MoeParams params_;
  Tensor workspace_;
  Tensor out_;
};

Tactic make(moe::gpu::GemmVariant variant, bool with_predicate) {
  Tactic t;
  t.op = std::string(moe::kMoeGpuForwardOp);
  t.backend = Backend::kCuda;
  t.variant = moe::gpu::to_string(variant);
  if (with_predicate) {
    t.supports_fn = [](const Problem& problem) {
      moe::MoeConfig config;
      config.activation = activation_of(problem);
      config.activation_quant = activation_quant_of(problem);
      const char* reason = moe::gpu::moe_forward_unsupported_reason(device_shape(problem),
                                                                    params_of(problem, config));
      return reason == nullptr ? Support::yes() : Support::no(reason);
    };
  }
  t.run = TacticRunner::of<MoeGpuForwardArgs>([variant](const MoeGpuForwardArgs& args) {
    moe::gpu::MoeParams params = *args.params;
    params.gemm = variant;
    moe::gpu::moe_forward(*args.weights, params, *args.run, args.workspace, args.workspace_bytes,
                          args.max_tokens, nullptr);
  });
  t.native = variant;
  return t;
}

}  // namespace

void register_moe_gpu_forward_autotune(TacticRegistry& registry) {
  OpSpec op;
  op.name = std::string(moe::kMoeGpuForwardOp);
  op.backend = Backend::kCuda;
  op.description =
      "MXFP4 MoE forward of one rank on the GPU (lists, GEMM1 + SwiGLU, GEMM2, combine)";
  op.buckets = power_of_two_buckets(8192);
  op.default_tactic = moe::gpu::to_string(moe::gpu::GemmVariant::kDecodeMma);
  op.make_workload = [](const Problem& problem, std::int64_t tokens) {
    return std::make_unique<MoeGpuWorkload>(problem, tokens);
  };
  registry.add_op(std::move(op));
  // The default carries no predicate (the registry's rule); both variants support the same shapes.
  registry.add_tactic(make(moe::gpu::GemmVariant::kDecodeMma, false));
  registry.add_tactic(make(moe::gpu::GemmVariant::kPrefillWgmma, true));
}

}  // namespace mxq::tune
