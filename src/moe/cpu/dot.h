// The fp64 dot product every GEMM of the MoE CPU reference uses, with a fixed summation order
// so results do not depend on the instruction set or the thread count: element i goes to lane
// i % 8, lanes are summed as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
// The products the MoE layer forms (bf16 x E2M1 x power of two, bf16 x bf16) are exact in fp64,
// so fused and unfused multiply-adds give the same bits.
#pragma once

#include <cstdint>

namespace mxq::moe::cpu {

inline constexpr int kDotLanes = 8;

// `n` must be a multiple of 8.
inline double dot_fp64(const double* a, const double* b, std::int64_t n) {
  double lane[kDotLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::int64_t i = 0; i < n; i += kDotLanes) {
    for (int l = 0; l < kDotLanes; ++l) lane[l] += a[i + l] * b[i + l];
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace mxq::moe::cpu
