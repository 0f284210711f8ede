// Copies a rank's part of one full checkpoint tensor into its weights (checkpoint layout). The
// one place where gpt-oss's interleaved gate/up rows (g0, u0, g1, u1, ...) are de-interleaved
// into the contract's [gate rows; up rows]. Used by the fresh load and by weight updates, so
// both write exactly the same bytes. Only the rows and columns of the rank are read from the
// source (for a memory-mapped file: only those pages are touched).
#pragma once

#include "mxq/core/tensor.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/rank_weights.h"

namespace mxq::moe {

// `source` must already have passed check_tensor_against_spec; `name` is an expert tensor
// (not a router tensor); the weights must be in checkpoint layout. Channels of the rank beyond
// its valid range are written with the padding bytes (zero fill), so every write establishes
// the whole region the tensor owns.
void write_rank_slice(MoeRankWeights& weights, const MoeTensorName& name, const TensorView& source);

// Whether a write of `name` touches this rank at all (its experts live on the rank's EP shard).
bool rank_holds(const MoeRankWeights& weights, const MoeTensorName& name);

}  // namespace mxq::moe
