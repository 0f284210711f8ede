// JSON and text descriptions of an MoE layer's ranks, shared by `mxq moe` and `mxq run`.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "mxq/moe/layer.h"
#include "mxq/moe/prepare.h"

namespace mxq::cli {

inline nlohmann::json shape_json(const Shape& shape) {
  return std::vector<std::int64_t>(shape.dims().begin(), shape.dims().end());
}

// The shapes of a loaded layer's ranks (current layout). A process that loads only its own rank
// (one rank per process) describes the others with moe::layer_rank_shapes instead.
inline std::vector<moe::MoeRankShape> rank_shapes(const moe::MoeLayer& layer) {
  std::vector<moe::MoeRankShape> out;
  for (int r = 0; r < layer.num_ranks(); ++r) out.push_back(layer.rank(r).shape());
  return out;
}

// One entry per rank: its shard and its parameter shapes.
inline nlohmann::json rank_shapes_json(const std::vector<moe::MoeRankShape>& shapes) {
  nlohmann::json ranks = nlohmann::json::array();
  for (std::size_t r = 0; r < shapes.size(); ++r) {
    const moe::MoeRankShape& shape = shapes[r];
    nlohmann::json params;
    for (moe::MoeParam param : moe::kAllMoeParams) {
      const bool bias = param == moe::MoeParam::kW13Bias || param == moe::MoeParam::kW2Bias;
      if (shape.has_bias || !bias)
        params[std::string(moe::to_string(param))] = shape_json(shape.shape_of(param));
    }
    ranks.push_back({{"rank", r},
                     {"tp_rank", shape.tp.rank},
                     {"ep_rank", shape.ep.rank},
                     {"experts", {shape.ep.begin, shape.ep.begin + shape.ep.count}},
                     {"channels", {shape.tp.begin, shape.tp.begin + shape.tp.valid}},
                     {"intermediate_size_per_partition_after_pad",
                      shape.intermediate_size_per_partition_after_pad},
                     {"shapes", params}});
  }
  return ranks;
}

// The padding of every rank (they all store the same widths), as MoeLayer::padding_summary.
inline moe::PaddingSummary padding_summary(const moe::MoeConfig& config, int tp_size,
                                           const moe::MoeRankShape& rank) {
  return {config.intermediate_size, tp_size, rank.tp.width,
          rank.intermediate_size_per_partition_after_pad};
}

}  // namespace mxq::cli
