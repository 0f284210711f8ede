#include "mxq/moe/sharding.h"

#include <algorithm>

#include "mxq/core/error.h"

namespace mxq::moe {

TpShard tp_shard(std::int64_t intermediate_size, int tp_size, int tp_rank,
                 std::int64_t forced_width) {
  if (intermediate_size <= 0 || intermediate_size % 32 != 0) {
    fail_argument(ErrorCode::kInvalidArgument, "intermediate_size", "a positive multiple of 32",
                  intermediate_size);
  }
  if (tp_size < 1) fail_argument(ErrorCode::kInvalidArgument, "tp_size", ">= 1", tp_size);
  if (tp_rank < 0 || tp_rank >= tp_size) {
    fail_argument(ErrorCode::kOutOfRange, "tp_rank", detail::concat("in [0, ", tp_size, ")"),
                  tp_rank);
  }
  std::int64_t width = 0;
  if (forced_width == 0) {
    const std::int64_t blocks = intermediate_size / 32;
    width = (blocks + tp_size - 1) / tp_size * 32;
  } else {
    if (forced_width < 0 || forced_width % 32 != 0) {
      fail_argument(ErrorCode::kInvalidArgument, "intermediate_per_rank",
                    "a positive multiple of 32 (one E8M0 scale covers 32 channels of w2)",
                    forced_width);
    }
    if (forced_width * tp_size < intermediate_size) {
      fail_argument(ErrorCode::kInvalidArgument, "intermediate_per_rank",
                    detail::concat("at least ceil(I / tp_size) = ",
                                   (intermediate_size + tp_size - 1) / tp_size,
                                   " (I = ", intermediate_size, ", tp_size = ", tp_size, ")"),
                    forced_width);
    }
    width = forced_width;
  }
  TpShard shard;
  shard.rank = tp_rank;
  shard.size = tp_size;
  shard.width = width;
  shard.begin = std::min<std::int64_t>(tp_rank * width, intermediate_size);
  shard.valid = std::clamp<std::int64_t>(intermediate_size - shard.begin, 0, width);
  return shard;
}

EpShard ep_shard(std::int64_t num_experts, int ep_size, int ep_rank) {
  if (num_experts <= 0) {
    fail_argument(ErrorCode::kInvalidArgument, "num_experts", ">= 1", num_experts);
  }
  if (ep_size < 1 || ep_size > num_experts) {
    fail_argument(ErrorCode::kInvalidArgument, "ep_size",
                  detail::concat("1 <= ep_size <= num_experts (", num_experts, ")"), ep_size);
  }
  if (ep_rank < 0 || ep_rank >= ep_size) {
    fail_argument(ErrorCode::kOutOfRange, "ep_rank", detail::concat("in [0, ", ep_size, ")"),
                  ep_rank);
  }
  const std::int64_t base = num_experts / ep_size;
  const std::int64_t extra = num_experts % ep_size;
  EpShard shard;
  shard.rank = ep_rank;
  shard.size = ep_size;
  shard.begin = ep_rank * base + std::min<std::int64_t>(ep_rank, extra);
  shard.count = base + (ep_rank < extra ? 1 : 0);
  return shard;
}

std::ostream& operator<<(std::ostream& out, const TpShard& shard) {
  return out << "tp " << shard.rank << "/" << shard.size << " channels [" << shard.begin << ", "
             << shard.begin + shard.valid << ") width " << shard.width;
}

std::ostream& operator<<(std::ostream& out, const EpShard& shard) {
  return out << "ep " << shard.rank << "/" << shard.size << " experts [" << shard.begin << ", "
             << shard.begin + shard.count << ")";
}

}  // namespace mxq::moe
