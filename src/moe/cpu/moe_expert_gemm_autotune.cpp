// Registers the MoE expert computation's CPU tactics with the autotuner (see
// include/mxq/moe/tune.h): tilings of moe::cpu::rank_expert_forward's GEMMs.
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moe/cpu/expert_forward.h"
#include "mxq/core/error.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/config.h"
#include "mxq/moe/rank_weights.h"
#include "mxq/moe/sharding.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/registry.h"

namespace mxq::tune {

namespace {

// The layer's own tiling (moe::cpu::ExpertTiling{}): the default tactic and the reference output.
const moe::cpu::ExpertTiling kReferenceTiling{};

void run_forward(const moe::MoeExpertGemmArgs& args, const moe::cpu::ExpertTiling& tiling) {
  const moe::cpu::RankForwardInput input{args.x, args.tokens, args.ids, args.routing_weights,
                                         args.top_k};
  std::memset(args.magnitude, 0,
              static_cast<std::size_t>(args.tokens * args.weights->shape().hidden) * sizeof(float));
  moe::cpu::rank_expert_forward(*args.weights, *args.config, input, args.partial, args.magnitude,
                                tiling);
}

// Random weights (every E2M1 code, scales 2^-6 .. 2^1), bf16 tokens and top-k routing over the
// global experts (slots routed to other EP ranks are skipped, as in the layer).
class MoeWorkload final : public Workload {
 public:
  MoeWorkload(const Problem& problem, std::int64_t tokens)
      : tokens_(tokens),
        hidden_(problem.dim("H")),
        top_k_(problem.dim("top_k")),
        weights_(problem.dim("H"), problem.dim("bias") != 0,
                 moe::TpShard{0, 1, 0, problem.dim("I"), problem.dim("I")},
                 moe::EpShard{0, 1, 0, problem.dim("E_local")}) {
    MXQ_CHECK(tokens >= 1, ErrorCode::kInvalidArgument,
              "moe_expert_gemm workload: tokens=", tokens);
    const std::int64_t experts = problem.dim("E");
    config_.hidden_size = hidden_;
    config_.intermediate_size = problem.dim("I");
    config_.num_experts = experts;
    config_.top_k = top_k_;
    config_.has_bias = problem.dim("bias") != 0;
    std::mt19937_64 rng(problem.hash() ^ static_cast<std::uint64_t>(tokens));
    for (moe::MoeParam param : moe::kAllMoeParams) {
      if (!weights_.has(param)) continue;
      const TensorView view = weights_.view(param);
      auto* bytes = static_cast<std::uint8_t*>(view.data());
      const bool scale = param == moe::MoeParam::kW13Scale || param == moe::MoeParam::kW2Scale;
      const bool bias = param == moe::MoeParam::kW13Bias || param == moe::MoeParam::kW2Bias;
      if (bias) {
        auto* bits = static_cast<std::uint16_t*>(view.data());
        std::normal_distribution<float> dist(0.0F, 0.1F);
        for (std::int64_t i = 0; i < view.numel(); ++i) bits[i] = float_to_bf16(dist(rng));
        continue;
      }
      std::uniform_int_distribution<int> dist(scale ? 121 : 0, scale ? 128 : 255);
      for (std::size_t i = 0; i < view.nbytes(); ++i)
        bytes[i] = static_cast<std::uint8_t>(dist(rng));
    }
    std::normal_distribution<float> normal(0.0F, 1.0F);
    x_.resize(static_cast<std::size_t>(tokens * hidden_));
    for (double& v : x_) v = round_to_bf16(normal(rng));
    // Distinct experts per token, weights summing to 1.
    ids_.resize(static_cast<std::size_t>(tokens * top_k_));
    routing_.resize(ids_.size());
    std::vector<std::int32_t> order(static_cast<std::size_t>(experts));
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::size_t e = 0; e < order.size(); ++e) order[e] = static_cast<std::int32_t>(e);
      std::shuffle(order.begin(), order.end(), rng);
      float sum = 0;
      for (std::int64_t k = 0; k < top_k_; ++k) {
        const auto at = static_cast<std::size_t>(t * top_k_ + k);
        ids_[at] = order[static_cast<std::size_t>(k)];
        routing_[at] = std::uniform_real_distribution<float>(0.1F, 1.0F)(rng);
        sum += routing_[at];
      }
      for (std::int64_t k = 0; k < top_k_; ++k)
        routing_[static_cast<std::size_t>(t * top_k_ + k)] /= sum;
    }
    partial_.resize(x_.size());
    magnitude_.resize(x_.size());
    reference_partial_.resize(x_.size());
    reference_magnitude_.resize(x_.size());
    run_forward(args(reference_partial_.data(), reference_magnitude_.data()), kReferenceTiling);
  }

  void run(const Tactic& tactic) override { tactic.run(args(partial_.data(), magnitude_.data())); }

  // The tiling must not change a bit of either output.
  CheckResult check(const Tactic& tactic) override {
    std::fill(partial_.begin(), partial_.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(magnitude_.begin(), magnitude_.end(), std::numeric_limits<float>::quiet_NaN());
    run(tactic);
    for (std::size_t i = 0; i < partial_.size(); ++i) {
      if (std::memcmp(&partial_[i], &reference_partial_[i], sizeof(float)) != 0 ||
          std::memcmp(&magnitude_[i], &reference_magnitude_[i], sizeof(float)) != 0) {
        return {false, std::numeric_limits<double>::infinity(),
                "output element " + std::to_string(i) + " differs from the reference's bits"};
      }
    }
    return {true, 0.0, ""};
  }

 private:
  moe::MoeExpertGemmArgs args(float* partial, float* magnitude) {
    return {&weights_,       &config_, x_.data(), tokens_,  ids_.data(),
            routing_.data(), top_k_,   partial,   magnitude};
  }

  std::int64_t tokens_, hidden_, top_k_;
  moe::MoeRankWeights weights_;
  moe::MoeConfig config_;
  std::vector<double> x_;
  std::vector<std::int32_t> ids_;
  std::vector<float> routing_;
  std::vector<float> partial_, magnitude_, reference_partial_, reference_magnitude_;
};

Tactic make(std::string variant, TacticParams params, const moe::cpu::ExpertTiling& tiling) {
  Tactic t;
  t.op = std::string(moe::kMoeExpertGemmOp);
  t.backend = Backend::kCpu;
  t.variant = std::move(variant);
  t.params = std::move(params);
  t.native = tiling;  // what MoeLayer::forward runs when a tuner serves this tactic
  t.run = TacticRunner::of<moe::MoeExpertGemmArgs>(
      [tiling](const moe::MoeExpertGemmArgs& args) { run_forward(args, tiling); });
  return t;
}

}  // namespace

void register_moe_expert_gemm_autotune(TacticRegistry& registry) {
  OpSpec op;
  op.name = std::string(moe::kMoeExpertGemmOp);
  op.backend = Backend::kCpu;
  op.description = "MXFP4 MoE experts of one rank (GEMM1, activation, GEMM2, top-k sum), CPU";
  op.buckets = power_of_two_buckets(8192);
  op.default_tactic = "reference";
  op.make_workload = [](const Problem& problem, std::int64_t tokens) {
    return std::make_unique<MoeWorkload>(problem, tokens);
  };
  registry.add_op(std::move(op));
  registry.add_tactic(make("reference", {}, kReferenceTiling));
  for (const std::int64_t pairs : {4, 8, 32}) {
    for (const std::int64_t rows : {8, 64}) {
      for (const int threads : {1, 2}) {
        registry.add_tactic(make("tiled",
                                 {{"pairs", std::to_string(pairs)},
                                  {"rows", std::to_string(rows)},
                                  {"threads", std::to_string(threads)}},
                                 moe::cpu::ExpertTiling{pairs, rows, threads}));
      }
    }
  }
}

}  // namespace mxq::tune
