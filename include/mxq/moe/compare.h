// Comparing two forward passes of the same layer and input that were split differently
// (TP/EP sizes, padding). Each run's fp32 accumulator S' differs from the exact result S by at
// most (K + R + 2) u M, u = 2^-24, where K is top_k, R the number of ranks and M the run's
// magnitude (the sum of |fp32(weight * y)| over ranks and slots): two roundings per
// contribution (y to fp32, weight * y to fp32) and at most K + R - 2 fp32 additions. Two runs
// therefore agree to within (2K + R_a + R_b + 4) u max(M_a, M_b); their bf16 outputs may differ
// only where the accumulators straddle a rounding boundary, by one bf16 unit in the last place.
#pragma once

#include <cstdint>

#include "mxq/moe/layer.h"

namespace mxq::moe {

struct ForwardComparison {
  std::int64_t elements = 0;
  std::int64_t bitwise_different = 0;  // output elements whose bits differ
  std::int64_t beyond_one_ulp = 0;     // output elements more than one bf16 ulp apart
  std::int64_t beyond_bound = 0;       // accumulator elements beyond the fp32 bound
  std::int64_t nan_mismatches = 0;     // NaN in one run only
  double max_abs_difference = 0.0;     // of the outputs
  double max_bound_ratio = 0.0;        // max |acc_a - acc_b| / bound
  [[nodiscard]] bool bitwise_equal() const { return bitwise_different == 0; }
  [[nodiscard]] bool within_fp32_summation_error() const {
    return beyond_bound == 0 && beyond_one_ulp == 0 && nan_mismatches == 0;
  }
};

// The GPU-vs-reference metric of DESIGN.md: ||out - ref||_2 / ||ref||_2 over the elements where
// neither is NaN (f32 tensors of one shape); `nan_mismatches` counts elements that are NaN in one
// of them only.
double normalized_error(const TensorView& out, const TensorView& ref, std::int64_t* nan_mismatches);

// `ranks_a` / `ranks_b`: the number of ranks of each run.
ForwardComparison compare_forward(const MoeForwardResult& a, int ranks_a, const MoeForwardResult& b,
                                  int ranks_b, std::int64_t top_k);

}  // namespace mxq::moe
