// The toy_gemm kernels (see toy_gemm.h): one function per variant.
#pragma once

#include <cstdint>

#include "tune/toy_gemm/toy_gemm.h"

namespace mxq::tune::toy_gemm {

// One dot product per output, in order. Valid everywhere (the default tactic).
void rowwise(const ToyGemmArgs& args);
// `lanes` independent accumulators per dot product (vectorizes). Needs k % lanes == 0.
void unrolled(const ToyGemmArgs& args, int lanes);
// Tiles of `bn` output columns per pass over a row of a, split over `threads` threads by
// column tile. Needs n % bn == 0.
void column_tiled(const ToyGemmArgs& args, int bn, int threads);
// All rows at once per weight row: `kMaxSmallBatchRows` accumulators on the stack, so it is
// valid only for tokens <= kMaxSmallBatchRows. Split over `threads` threads by column.
inline constexpr std::int64_t kMaxSmallBatchRows = 16;
void small_batch(const ToyGemmArgs& args, int threads);
// Rows split over `threads` threads, each row by `unrolled(8)`. Needs tokens >= threads (each
// thread owns at least one row) and k % 8 == 0.
void row_parallel(const ToyGemmArgs& args, int threads);

}  // namespace mxq::tune::toy_gemm
