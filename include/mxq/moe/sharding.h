// How a layer is split over ranks. TP splits the intermediate dimension I, EP splits the experts;
// a TP x EP grid of tp_size * ep_size ranks, rank id = ep_rank * tp_size + tp_rank.
//
// TP rule (intermediate channels): every rank stores the same width W (a multiple of 32, the
// MXFP4 block size, because w2's scales cover 32 channels each):
//   W = ceil(I / 32 / tp_size) * 32   (or a user-forced W, which must be a multiple of 32 and
//                                      satisfy W * tp_size >= I).
// Rank r holds the global channels [r*W, min((r+1)*W, I)); when that range is shorter than W
// (the last ranks when I is not a multiple of 32 * tp_size; possibly empty, e.g. I = 128 over
// 3 ranks: W = 64 and rank 2 holds nothing) the missing channels are zero-filled: zero weights,
// scale byte 127 (1.0), zero biases. Zero-filled channels contribute exactly 0 to the output.
// tp_shard describes the rule for any tp_size; a layer (MoeLayer, footprint.h's
// check_layer_request) takes at most I / 32 TP ranks, beyond which ranks hold only zero fill.
//
// EP rule (experts): contiguous ranges; with q = E / ep_size and m = E % ep_size, ranks
// [0, m) take q + 1 experts and the others q, so ep rank r starts at r * q + min(r, m).
// ep_size must not exceed E (every rank holds at least one expert).
#pragma once

#include <cstdint>
#include <ostream>

namespace mxq::moe {

struct TpShard {
  int rank = 0;
  int size = 1;
  std::int64_t begin = 0;  // first global intermediate channel held
  std::int64_t valid = 0;  // channels [begin, begin + valid) hold checkpoint data
  std::int64_t width = 0;  // channels stored (checkpoint layout I_rank); valid <= width
  friend bool operator==(const TpShard&, const TpShard&) = default;
};

struct EpShard {
  int rank = 0;
  int size = 1;
  std::int64_t begin = 0;  // first global expert held
  std::int64_t count = 0;  // E_local
  friend bool operator==(const EpShard&, const EpShard&) = default;
};

struct ShardOptions {
  int tp_size = 1;
  int ep_size = 1;
  // 0 = the automatic width above; otherwise the per-rank width W the user forces.
  std::int64_t intermediate_per_rank = 0;
};

// Throw mxq::Error(kInvalidArgument) naming the argument on bad sizes or ranks.
TpShard tp_shard(std::int64_t intermediate_size, int tp_size, int tp_rank,
                 std::int64_t forced_width = 0);
EpShard ep_shard(std::int64_t num_experts, int ep_size, int ep_rank);

std::ostream& operator<<(std::ostream& out, const TpShard& shard);
std::ostream& operator<<(std::ostream& out, const EpShard& shard);

}  // namespace mxq::moe
