// JSON and text descriptions of an MoE layer's ranks, shared by `mxq moe` and `mxq run`.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "mxq/moe/layer.h"

namespace mxq::cli {

inline nlohmann::json shape_json(const Shape& shape) {
  return std::vector<std::int64_t>(shape.dims().begin(), shape.dims().end());
}

// One entry per rank: its shard and its parameter shapes (current layout).
inline nlohmann::json rank_shapes_json(const moe::MoeLayer& layer) {
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < layer.num_ranks(); ++r) {
    const moe::MoeRankWeights& weights = layer.rank(r);
    const moe::MoeRankShape& shape = weights.shape();
    nlohmann::json params;
    for (moe::MoeParam param : moe::kAllMoeParams) {
      if (weights.has(param))
        params[std::string(moe::to_string(param))] = shape_json(weights.view(param).shape());
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

}  // namespace mxq::cli
