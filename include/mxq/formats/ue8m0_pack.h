// Packed UE8M0 scales (DeepGEMM's SM100 layout): the E8M0 bytes of four consecutive K-groups
// share one int32, K-group 4p+i in bits [8i, 8i+8) (little-endian, first group in the lowest
// byte). The int32 tensor is MN-major: element (p, m) sits at p * round_up(MN, 4) + m, so its
// shape is [ceil(G/4), round_up(MN, 4)]. Bytes of missing K-groups and padding rows are 0.
#pragma once

#include <cstdint>

#include "mxq/core/tensor.h"

namespace mxq {

// scales: f32 [MN, G], each an exact power of two in [2^-127, 2^127] (a power-of-two UE8M0
// scale, e.g. from ScaleMode::kUe8m0). Anything else (0, negative, NaN, Inf, not a power of two)
// throws mxq::Error naming the first offending index and its value.
// Returns i32 [ceil(G / 4), round_up(MN, 4)].
Tensor pack_ue8m0(const TensorView& scales);

// packed: i32 [ceil(groups / 4), round_up(mn, 4)]. Returns f32 [mn, groups]; byte 0 decodes to
// 2^-127 and 0xFF to NaN (e8m0_to_float).
Tensor unpack_ue8m0(const TensorView& packed, std::int64_t mn, std::int64_t groups);
// The same into the caller's host memory: out f32 [mn, groups], contiguous.
void unpack_ue8m0_into(const TensorView& packed, std::int64_t mn, std::int64_t groups,
                       const TensorView& out);

}  // namespace mxq
