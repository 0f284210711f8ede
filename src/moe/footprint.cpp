#include "mxq/moe/footprint.h"

#include <climits>

#include "moe/param_groups.h"
#include "mxq/core/error.h"
#include "mxq/core/memory.h"
#include "mxq/moe/prepare.h"

namespace mxq::moe {
namespace {

// Bytes of all E experts' weights (one TP rank's share of every EP rank together) per 32 channels
// of width, and the part that does not depend on the width: from the parameter groups the
// allocation itself uses (param_groups.h), so the estimate follows any change of the layout.
struct ExpertBytes {
  std::uint64_t per_block = 0;  // per 32 channels of I_rank
  std::uint64_t fixed = 0;
};

ExpertBytes expert_bytes(const MoeConfig& config) {
  MoeRankShape shape;
  shape.hidden = config.hidden_size;
  shape.has_bias = config.has_bias;
  shape.ep.count = config.num_experts;
  ExpertBytes out;
  for (MoeParam param : kAllMoeParams) {
    const bool bias = param == MoeParam::kW13Bias || param == MoeParam::kW2Bias;
    if (bias && !config.has_bias) continue;
    const auto bytes = static_cast<std::uint64_t>(param_bytes(shape, param, 32));
    if (depends_on_intermediate(param)) {
      out.per_block = saturating_add(out.per_block, bytes);
    } else {
      out.fixed = saturating_add(out.fixed, bytes);
    }
  }
  return out;
}

std::uint64_t router_bytes(const MoeConfig& config) {
  if (config.router != RouterKind::kTopkSoftmax) return 0;
  const auto experts = static_cast<std::uint64_t>(config.num_experts);
  return saturating_mul(experts, static_cast<std::uint64_t>(config.hidden_size) * 2) +
         (config.has_bias ? experts * 2 : 0);
}

std::int64_t tp_width(const MoeConfig& config, const ShardOptions& shards) {
  return tp_shard(config.intermediate_size, shards.tp_size, 0, shards.intermediate_per_rank).width;
}

std::string layer_text(const MoeConfig& config) {
  return detail::concat("E=", config.num_experts, ", H=", config.hidden_size,
                        ", I=", config.intermediate_size);
}

}  // namespace

std::uint64_t layer_weight_bytes(const MoeConfig& config, int tp_size, std::int64_t width) {
  const ExpertBytes experts = expert_bytes(config);
  const std::uint64_t per_rank = saturating_add(
      saturating_mul(experts.per_block, static_cast<std::uint64_t>(width / 32)), experts.fixed);
  return saturating_add(saturating_mul(per_rank, static_cast<std::uint64_t>(tp_size)),
                        router_bytes(config));
}

std::uint64_t layer_host_bytes(const MoeConfig& config, const ShardOptions& shards,
                               std::int64_t alignment) {
  const std::int64_t width = tp_width(config, shards);
  std::uint64_t bytes = layer_weight_bytes(config, shards.tp_size, width);
  if (alignment > 0) {
    const std::int64_t padded = padded_intermediate(width, alignment);
    if (padded > width) {
      bytes = saturating_add(bytes, layer_weight_bytes(config, shards.tp_size, padded));
    }
  }
  return bytes;
}

std::uint64_t forward_host_bytes(const MoeConfig& config, std::int64_t width, std::int64_t tokens) {
  const auto h = static_cast<std::uint64_t>(config.hidden_size);
  const auto k = static_cast<std::uint64_t>(config.top_k);
  const auto w = static_cast<std::uint64_t>(width);
  const std::uint64_t per_token = saturating_add(
      saturating_add(saturating_mul(36, h),
                     saturating_mul(k, saturating_add(saturating_mul(8, w), 4 * h + 16))),
      1);
  return saturating_mul(per_token, static_cast<std::uint64_t>(tokens < 0 ? 0 : tokens));
}

void check_layer_request(const MoeConfig& config, const ShardOptions& shards,
                         std::int64_t alignment, const SizeArgumentNames& names) {
  config.validate();
  const std::int64_t blocks = config.intermediate_size / 32;
  if (shards.tp_size < 1)
    fail_argument(ErrorCode::kInvalidArgument, names.tp_size, ">= 1", shards.tp_size);
  if (shards.tp_size > blocks) {
    fail_argument(ErrorCode::kInvalidArgument, names.tp_size,
                  detail::concat("at most ", blocks, " (the layer's I = ", config.intermediate_size,
                                 " channels make ", blocks,
                                 " blocks of 32 and a TP rank holds whole blocks: more ranks would "
                                 "hold only zero fill)"),
                  shards.tp_size);
  }
  if (shards.ep_size < 1)
    fail_argument(ErrorCode::kInvalidArgument, names.ep_size, ">= 1", shards.ep_size);
  if (shards.ep_size > config.num_experts) {
    fail_argument(ErrorCode::kInvalidArgument, names.ep_size,
                  detail::concat("at most ", config.num_experts,
                                 " (the layer's E: every EP rank holds at least one expert)"),
                  shards.ep_size);
  }
  if (static_cast<std::int64_t>(shards.tp_size) * shards.ep_size > INT_MAX) {
    fail_argument(ErrorCode::kOutOfRange, detail::concat(names.tp_size, " x ", names.ep_size),
                  detail::concat("at most ", INT_MAX, " ranks"),
                  detail::concat(shards.tp_size, " x ", shards.ep_size));
  }
  const std::int64_t forced = shards.intermediate_per_rank;
  if (forced < 0 || forced % 32 != 0) {
    fail_argument(ErrorCode::kInvalidArgument, names.intermediate_per_rank,
                  "0 (automatic) or a positive multiple of 32 (one E8M0 scale covers 32 channels "
                  "of w2)",
                  forced);
  }
  if (forced > 0 && forced < (config.intermediate_size + shards.tp_size - 1) / shards.tp_size) {
    fail_argument(ErrorCode::kInvalidArgument, names.intermediate_per_rank,
                  detail::concat("at least ceil(I / ", names.tp_size, ") = ",
                                 (config.intermediate_size + shards.tp_size - 1) / shards.tp_size,
                                 " (I = ", config.intermediate_size, ")"),
                  forced);
  }
  if (alignment < 0 || alignment % 32 != 0) {
    fail_argument(ErrorCode::kInvalidArgument, names.alignment,
                  "an alignment of 0 (no padding) or a positive multiple of 32 (the MXFP4 block "
                  "size)",
                  alignment);
  }

  // Memory: the first argument that takes the layer past what the machine has is named.
  const std::uint64_t alone = layer_weight_bytes(config, 1, config.intermediate_size);
  require_host_memory(alone, "layer", layer_text(config), "one unpadded rank would hold");
  const ShardOptions automatic{shards.tp_size, shards.ep_size, 0};
  const std::int64_t auto_width = tp_width(config, automatic);
  require_host_memory(layer_weight_bytes(config, shards.tp_size, auto_width), names.tp_size,
                      std::to_string(shards.tp_size),
                      detail::concat(shards.tp_size, " TP rank(s) of ", auto_width, " channels (",
                                     layer_text(config), ") would hold"));
  const ShardOptions unpadded{shards.tp_size, shards.ep_size, forced};
  const std::int64_t width = tp_width(config, unpadded);
  require_host_memory(layer_weight_bytes(config, shards.tp_size, width),
                      names.intermediate_per_rank, std::to_string(forced),
                      detail::concat(shards.tp_size, " TP rank(s) of ", width, " channels (",
                                     layer_text(config), ") would hold"));
  if (alignment > 0) {
    require_host_memory(
        layer_host_bytes(config, unpadded, alignment), names.alignment, std::to_string(alignment),
        detail::concat("I_rank ", width, " -> ", padded_intermediate(width, alignment), " on ",
                       shards.tp_size, " TP rank(s) (", layer_text(config),
                       ") would hold, with the unpadded copy,"));
  }
}

void check_forward_request(const MoeConfig& config, std::int64_t width, std::int64_t tokens,
                           std::uint64_t held_bytes, const SizeArgumentNames& names) {
  if (tokens < 0) fail_argument(ErrorCode::kInvalidArgument, names.tokens, ">= 0", tokens);
  require_host_memory(
      saturating_add(forward_host_bytes(config, width, tokens), held_bytes), names.tokens,
      detail::concat(tokens, " tokens"),
      detail::concat("the forward's buffers for ", tokens, " tokens (H=", config.hidden_size,
                     ", top-", config.top_k, ", I_rank ", width, "), with the ",
                     format_bytes(held_bytes), " held besides, would take"));
}

std::vector<MoeRankShape> layer_rank_shapes(const MoeConfig& config, const ShardOptions& shards,
                                            std::int64_t alignment) {
  std::vector<MoeRankShape> out;
  for (int ep = 0; ep < shards.ep_size; ++ep) {
    for (int tp = 0; tp < shards.tp_size; ++tp) {
      MoeRankShape shape;
      shape.hidden = config.hidden_size;
      shape.has_bias = config.has_bias;
      shape.tp =
          tp_shard(config.intermediate_size, shards.tp_size, tp, shards.intermediate_per_rank);
      shape.ep = ep_shard(config.num_experts, shards.ep_size, ep);
      shape.intermediate_size_per_partition_after_pad =
          alignment == 0 ? shape.tp.width : padded_intermediate(shape.tp.width, alignment);
      shape.alignment = alignment;
      out.push_back(shape);
    }
  }
  return out;
}

}  // namespace mxq::moe
