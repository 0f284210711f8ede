#include "mxq/moe/layer.h"

#include <any>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "moe/cpu/expert_forward.h"
#include "moe/slice_writer.h"
#include "mxq/core/error.h"
#include "mxq/core/log.h"
#include "mxq/core/memory.h"
#include "mxq/core/parallel.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/footprint.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"

namespace mxq::moe {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

MoeLayer::MoeLayer(const MoeConfig& config, std::int64_t layer, const ShardOptions& shards)
    : config_(config), layer_(layer), shards_(shards) {}

MoeLayer MoeLayer::create(const MoeConfig& config, std::int64_t layer, const ShardOptions& shards) {
  config.validate();
  if (layer < 0) fail_argument(ErrorCode::kOutOfRange, "layer", ">= 0", layer);
  // Checked here, not only per rank below: with a size of 0 the loops would make no rank at all,
  // and a size the machine cannot hold would allocate until the OOM killer ends the process.
  check_layer_request(config, shards, 0);
  MoeLayer result(config, layer, shards);
  for (int ep = 0; ep < shards.ep_size; ++ep) {
    const EpShard ep_part = ep_shard(config.num_experts, shards.ep_size, ep);
    for (int tp = 0; tp < shards.tp_size; ++tp) {
      const TpShard tp_part =
          tp_shard(config.intermediate_size, shards.tp_size, tp, shards.intermediate_per_rank);
      result.ranks_.emplace_back(config.hidden_size, config.has_bias, tp_part, ep_part);
    }
  }
  if (config.router == RouterKind::kTopkSoftmax) {
    result.router_weight_ = Tensor::zeros(DType::kBF16, {config.num_experts, config.hidden_size});
    if (config.has_bias) result.router_bias_ = Tensor::zeros(DType::kBF16, {config.num_experts});
  }
  return result;
}

MoeLayer MoeLayer::load(const MoeCheckpoint& checkpoint, std::int64_t layer,
                        const MoeConfig& config, const ShardOptions& shards) {
  config.validate();
  const CheckpointLayout layout = checkpoint.layout(layer);
  const std::vector<MoeTensorName> names = required_tensor_names(config, layer, layout);
  std::vector<TensorView> views;
  views.reserve(names.size());
  for (const MoeTensorName& name : names) {
    const std::string label = format_tensor_name(name);
    if (!checkpoint.contains(label)) {
      fail(ErrorCode::kFormat, "checkpoint ", checkpoint.path(), ": layer ", layer, " (",
           to_string(layout), " layout) needs tensor ", label, ", which is missing");
    }
    views.push_back(checkpoint.view(label));
    check_tensor_against_spec(config, name.kind, views.back(), label);
  }
  MoeLayer result = create(config, layer, shards);
  for (std::size_t i = 0; i < names.size(); ++i) result.write_tensor(names[i], views[i]);
  return result;
}

const MoeRankWeights& MoeLayer::rank(int index) const {
  if (index < 0 || index >= num_ranks()) {
    fail_argument(ErrorCode::kOutOfRange, "rank", detail::concat("in [0, ", num_ranks(), ")"),
                  index);
  }
  return ranks_[static_cast<std::size_t>(index)];
}

std::int64_t MoeLayer::intermediate_size_per_partition() const {
  return ranks_.front().shape().tp.width;
}

std::int64_t MoeLayer::intermediate_size_per_partition_after_pad() const {
  return ranks_.front().shape().intermediate_size_per_partition_after_pad;
}

bool MoeLayer::prepared() const { return ranks_.front().shape().prepared(); }

PaddingSummary MoeLayer::padding_summary() const {
  const MoeRankShape& shape = ranks_.front().shape();
  return {config_.intermediate_size, shards_.tp_size, shape.tp.width,
          shape.intermediate_size_per_partition_after_pad};
}

PaddingSummary MoeLayer::prepare(std::int64_t alignment) {
  const std::unique_lock lock(lock_.mutex);
  return prepare_locked(alignment);
}

PaddingSummary MoeLayer::prepare_locked(std::int64_t alignment) {
  if (updating_) {
    fail(ErrorCode::kInvalidArgument, "MoE layer ", layer_,
         ": prepare() during a weight update; call end_update()");
  }
  validate_alignment(alignment);
  // The padded storage the first preparation grows into, against the machine's memory.
  if (const std::int64_t padded = padded_intermediate(ranks_.front().shape().tp.width, alignment);
      padded > ranks_.front().shape().tp.width) {
    std::uint64_t allocated = 0;
    for (const MoeRankWeights& rank : ranks_) {
      for (MoeParam param : kAllMoeParams)
        allocated = saturating_add(allocated, rank.capacity(param));
    }
    const std::uint64_t needed = layer_weight_bytes(config_, shards_.tp_size, padded);
    if (needed > allocated) {
      require_host_memory(needed - allocated, "alignment", std::to_string(alignment),
                          detail::concat("I_rank ", ranks_.front().shape().tp.width, " -> ", padded,
                                         " on ", shards_.tp_size, " TP rank(s) would allocate"));
    }
  }
  for (MoeRankWeights& rank : ranks_) (void)rank.pad_intermediate_to_alignment(alignment);
  const PaddingSummary summary = padding_summary();
  if (summary.after > summary.before && !padding_warned_) {
    log_warn(summary.message());
    padding_warned_ = true;
  }
  return summary;
}

void MoeLayer::restore_checkpoint_layout() {
  const std::unique_lock lock(lock_.mutex);
  restore_locked();
}

void MoeLayer::restore_locked() {
  for (MoeRankWeights& rank : ranks_) rank.restore_checkpoint_layout();
}

MoeTensorName MoeLayer::check_tensor(const std::string& name, const TensorView& tensor) const {
  const auto parsed = parse_tensor_name(name);
  const auto unknown = [&](std::string_view why) {
    fail(ErrorCode::kInvalidArgument, "MoE layer ", layer_, ": unknown tensor ", name, " (", why,
         ")");
  };
  if (!parsed) unknown("not an MoE tensor name");
  if (parsed->layer != layer_) unknown(detail::concat("belongs to layer ", parsed->layer));
  if (is_router(parsed->kind) && config_.router != RouterKind::kTopkSoftmax) {
    unknown("this layer takes precomputed routing and has no router");
  }
  if (is_bias(parsed->kind) && !config_.has_bias) unknown("this layer has no biases");
  if (parsed->kind == MoeTensorKind::kRouterBias && !config_.has_bias) {
    unknown("this layer has no biases");
  }
  if (is_per_expert(parsed->kind) && parsed->expert >= config_.num_experts) {
    unknown(detail::concat("expert ", parsed->expert, " of ", config_.num_experts));
  }
  check_tensor_against_spec(config_, parsed->kind, tensor, name);
  return *parsed;
}

void MoeLayer::write_tensor(const MoeTensorName& name, const TensorView& tensor) {
  if (is_router(name.kind)) {
    Tensor& target = name.kind == MoeTensorKind::kRouterWeight ? router_weight_ : router_bias_;
    std::memcpy(target.data(), tensor.data(), target.nbytes());
    return;
  }
  parallel_for(num_ranks(), 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      write_rank_slice(ranks_[static_cast<std::size_t>(r)], name, tensor);
    }
  });
}

void MoeLayer::begin_update() {
  const std::unique_lock lock(lock_.mutex);
  if (updating_) {
    fail(ErrorCode::kInvalidArgument, "MoE layer ", layer_,
         ": begin_update() while an update is already in progress");
  }
  alignment_before_update_ = ranks_.front().shape().alignment;
  restore_locked();
  updating_ = true;
}

void MoeLayer::load(const std::string& name, const TensorView& tensor) {
  const std::unique_lock lock(lock_.mutex);
  if (!updating_) {
    fail(ErrorCode::kInvalidArgument, "MoE layer ", layer_, ": load(", name,
         ") outside a weight update; call begin_update() first");
  }
  const MoeTensorName parsed = check_tensor(name, tensor);  // throws before any write
  write_tensor(parsed, tensor);
}

void MoeLayer::end_update() {
  const std::unique_lock lock(lock_.mutex);
  if (!updating_) {
    fail(ErrorCode::kInvalidArgument, "MoE layer ", layer_,
         ": end_update() without begin_update()");
  }
  updating_ = false;
  if (alignment_before_update_ != 0) (void)prepare_locked(alignment_before_update_);
}

std::shared_lock<std::shared_mutex> MoeLayer::lock_for_reading(std::string_view reader) const {
  std::shared_lock lock(lock_.mutex);
  if (updating_) {
    fail(ErrorCode::kInvalidArgument, "MoE layer ", layer_, ": ", reader,
         " during a weight update; call end_update() first");
  }
  return lock;
}

tune::Problem MoeLayer::tune_problem(int rank) const {
  MXQ_CHECK(rank >= 0 && rank < num_ranks(), ErrorCode::kOutOfRange,
            "MoeLayer::tune_problem: rank: expected 0..", num_ranks() - 1, ", found ", rank);
  const MoeRankShape& shape = ranks_[static_cast<std::size_t>(rank)].shape();
  return moe_expert_gemm_problem({config_.num_experts, shape.ep.count, shape.hidden, shape.tp.width,
                                  config_.top_k, shape.has_bias});
}

MoeForwardResult MoeLayer::forward(const TensorView& x, const Routing* routing,
                                   const tune::Autotuner* tuner) const {
  const auto start = std::chrono::steady_clock::now();
  const auto reading = lock_for_reading("forward()");
  if (tuner != nullptr && tuner->backend() != tune::Backend::kCpu) {
    fail_argument(ErrorCode::kInvalidArgument, "tuner", "an autotuner of the cpu backend",
                  detail::concat("one of the ", tune::to_string(tuner->backend()), " backend"));
  }
  require_rank(x, "x", 2);
  require_device(x, "x", Device::cpu());
  require_contiguous(x, "x");
  if (x.dtype() != DType::kF32 && x.dtype() != DType::kBF16) {
    fail_argument(ErrorCode::kDtypeMismatch, "x", "dtype f32 or bf16",
                  detail::concat("dtype ", x.dtype()));
  }
  const std::int64_t tokens = x.size(0);
  const std::int64_t hidden = config_.hidden_size;
  if (x.size(1) != hidden) {
    fail_argument(ErrorCode::kShapeMismatch, "x", detail::concat("shape [T, ", hidden, "]"),
                  detail::concat("shape ", x.shape()));
  }
  const std::int64_t top_k = config_.top_k;

  // Input: bf16 values (as f32 and as f64) and which rows are finite.
  Tensor x_bf16 = Tensor::empty(DType::kF32, {tokens, hidden});
  std::vector<double> x_f64(static_cast<std::size_t>(tokens * hidden));
  std::vector<std::uint8_t> finite(static_cast<std::size_t>(tokens), 1);
  auto* xs = x_bf16.data_as<float>();
  for (std::int64_t i = 0; i < tokens * hidden; ++i) {
    const float value = x.dtype() == DType::kF32
                            ? round_to_bf16(static_cast<const float*>(x.data())[i])
                            : bf16_to_float(static_cast<const std::uint16_t*>(x.data())[i]);
    xs[i] = value;
    x_f64[static_cast<std::size_t>(i)] = value;
    if (!std::isfinite(value)) finite[static_cast<std::size_t>(i / hidden)] = 0;
  }

  MoeForwardResult result;
  const auto routing_start = std::chrono::steady_clock::now();
  if (routing != nullptr) {
    validate_routing(*routing, tokens, top_k, config_.num_experts);
    result.routing.ids = Tensor::empty(DType::kI32, {tokens, top_k});
    result.routing.weights = Tensor::empty(DType::kF32, {tokens, top_k});
    std::memcpy(result.routing.ids.data(), routing->ids.data(), result.routing.ids.nbytes());
    std::memcpy(result.routing.weights.data(), routing->weights.data(),
                result.routing.weights.nbytes());
    auto* ids = result.routing.ids.data_as<std::int32_t>();
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (finite[static_cast<std::size_t>(t)] == 0)
        std::fill(ids + t * top_k, ids + (t + 1) * top_k, -1);
    }
  } else {
    if (config_.router != RouterKind::kTopkSoftmax) {
      fail(ErrorCode::kInvalidArgument, "MoE layer ", layer_,
           ": forward() needs routing (ids and weights): the layer has no router");
    }
    result.routing =
        route_topk_softmax(x_bf16, finite.data(), router_weight_,
                           router_bias_.defined() ? router_bias_.view() : TensorView(), top_k);
  }
  result.routing_seconds = seconds_since(routing_start);

  // Every rank's partial output, summed in rank order in fp32.
  result.accumulator = Tensor::zeros(DType::kF32, {tokens, hidden});
  result.magnitude = Tensor::zeros(DType::kF32, {tokens, hidden});
  std::vector<float> partial(static_cast<std::size_t>(tokens * hidden));
  cpu::RankForwardInput input;
  input.x = x_f64.data();
  input.tokens = tokens;
  input.ids = result.routing.ids.data_as<std::int32_t>();
  input.weights = result.routing.weights.data_as<float>();
  input.top_k = top_k;
  auto* accumulator = result.accumulator.data_as<float>();
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    const MoeRankWeights& rank = ranks_[r];
    // The tuner's tiling for this rank and token count, when its cache holds one.
    cpu::ExpertTiling tiling;
    std::string tactic = "reference";
    bool from_cache = false;
    if (tuner != nullptr) {
      const tune::Selection selection = tuner->lookup(tune_problem(static_cast<int>(r)), tokens);
      const auto* tuned = selection.tactic != nullptr
                              ? std::any_cast<cpu::ExpertTiling>(&selection.tactic->native)
                              : nullptr;
      if (selection.source == tune::SelectionSource::kTuned && tuned != nullptr) {
        tiling = *tuned;
        tactic = selection.tactic->id();
        from_cache = true;
      }
    }
    result.rank_tactics.push_back(tactic);
    result.rank_tactics_from_cache.push_back(from_cache);
    const auto rank_start = std::chrono::steady_clock::now();
    cpu::rank_expert_forward(rank, config_, input, partial.data(),
                             result.magnitude.data_as<float>(), tiling);
    for (std::size_t i = 0; i < partial.size(); ++i) accumulator[i] += partial[i];
    result.rank_seconds.push_back(seconds_since(rank_start));
  }

  // One rounding to bf16; non-finite input rows become NaN.
  result.output = Tensor::empty(DType::kF32, {tokens, hidden});
  auto* output = result.output.data_as<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t t = 0; t < tokens; ++t) {
    const bool ok = finite[static_cast<std::size_t>(t)] != 0;
    for (std::int64_t h = 0; h < hidden; ++h) {
      const std::int64_t i = t * hidden + h;
      if (!ok) accumulator[i] = nan;
      output[i] = ok ? round_to_bf16(accumulator[i]) : nan;
    }
  }
  result.total_seconds = seconds_since(start);
  return result;
}

}  // namespace mxq::moe
