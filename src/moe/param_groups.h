// How each MoE parameter's bytes depend on the per-rank intermediate width W: every parameter is
// `groups` consecutive runs of `group_bytes(W)` bytes, each run holding W channels. Padding,
// restoring and the loaders all walk parameters through this one description.
//   w13, w13_scale, w13_bias : groups = E_local * 2 (the gate half, then the up half)
//   w2, w2_scale             : groups = E_local * H (one run per output row)
//   w2_bias                  : independent of W (one run per expert)
#pragma once

#include <cstddef>
#include <cstdint>

#include "mxq/moe/rank_weights.h"

namespace mxq::moe {

inline bool depends_on_intermediate(MoeParam param) { return param != MoeParam::kW2Bias; }

inline std::int64_t param_groups(const MoeRankShape& shape, MoeParam param) {
  switch (param) {
    case MoeParam::kW13:
    case MoeParam::kW13Scale:
    case MoeParam::kW13Bias:
      return shape.experts_local() * 2;
    case MoeParam::kW2:
    case MoeParam::kW2Scale:
      return shape.experts_local() * shape.hidden;
    case MoeParam::kW2Bias:
      return shape.experts_local();
  }
  return 0;
}

// Bytes of one group at intermediate width `width` (a multiple of 32).
inline std::size_t group_bytes(const MoeRankShape& shape, MoeParam param, std::int64_t width) {
  std::int64_t bytes = 0;
  switch (param) {
    case MoeParam::kW13:
      bytes = width * (shape.hidden / 2);
      break;
    case MoeParam::kW13Scale:
      bytes = width * (shape.hidden / 32);
      break;
    case MoeParam::kW13Bias:
      bytes = width * 2;
      break;
    case MoeParam::kW2:
      bytes = width / 2;
      break;
    case MoeParam::kW2Scale:
      bytes = width / 32;
      break;
    case MoeParam::kW2Bias:
      bytes = shape.hidden * 2;
      break;
  }
  return static_cast<std::size_t>(bytes);
}

inline std::size_t param_bytes(const MoeRankShape& shape, MoeParam param, std::int64_t width) {
  return static_cast<std::size_t>(param_groups(shape, param)) * group_bytes(shape, param, width);
}

}  // namespace mxq::moe
