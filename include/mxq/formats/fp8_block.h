// Block-scaled FP8 (DeepSeek-V3 style): a matrix [N, K] is cut into blocks of BlockShape{n, k}
// (weights: 128x128; activations: 1x128 groups along K); each block has one fp32 scale
//   scale = max(amax, 1e-4) / 448            (ScaleMode::kFp32)
//   scale = 2^ceil(log2(that))               (ScaleMode::kUe8m0: rounded up to a power of two)
// and its elements are q = E4M3 saturating(x / scale). Dequantization is q * scale (the scale
// is the dequant multiplier, DeepSeek's `weight_scale_inv`). Ragged edges: the last block row
// and column may be smaller; their amax covers only the elements that exist. A block holding a
// NaN or an Inf gets a NaN scale, so all its codes are NaN (0x7F) and it dequantizes to NaN.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "mxq/core/tensor.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/fp8_block_scale.h"

namespace mxq {

struct BlockShape {
  std::int64_t n = 128;  // rows (the N / M axis)
  std::int64_t k = 128;  // columns (the K axis)
  friend bool operator==(const BlockShape&, const BlockShape&) = default;
};

// "128x128" -> {128, 128}; "1x128" -> {1, 128}. Both extents must be positive integers; any
// other text throws mxq::Error naming `argument`, what was expected and what was found.
BlockShape parse_block_shape(std::string_view text, std::string_view argument = "block shape");
std::string to_string(const BlockShape& block);  // "128x64"
std::ostream& operator<<(std::ostream& out, const BlockShape& block);

std::string_view to_string(ScaleMode mode);  // "fp32" / "ue8m0"
ScaleMode parse_scale_mode(std::string_view text, std::string_view argument = "scale mode");

struct Fp8BlockTensor {
  Tensor q;          // e4m3 [N, K]
  Tensor scale;      // f32 [ceil(N / block.n), ceil(K / block.k)]
  BlockShape block;  // the block shape the scales belong to
};

// x: f32 or bf16 [N, K] on the host, contiguous.
Fp8BlockTensor quantize_fp8_block(const TensorView& x, BlockShape block,
                                  ScaleMode mode = ScaleMode::kFp32);
// The same into the caller's host memory (for ops that take a workspace and allocate nothing):
// q e4m3 [N, K] and scale f32 [ceil(N / block.n), ceil(K / block.k)], both contiguous.
void quantize_fp8_block_into(const TensorView& x, BlockShape block, ScaleMode mode,
                             const TensorView& q, const TensorView& scale);
// q: e4m3 [N, K]; scale: f32 [ceil(N / block.n), ceil(K / block.k)]. Returns f32 [N, K].
Tensor dequantize_fp8_block(const TensorView& q, const TensorView& scale, BlockShape block);
// Activation groups of 1 x group_k along K: quantize_fp8_block(x, {1, group_k}, mode).
Fp8BlockTensor quantize_fp8_groups(const TensorView& x, std::int64_t group_k,
                                   ScaleMode mode = ScaleMode::kFp32);

}  // namespace mxq
