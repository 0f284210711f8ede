// MXFP4 tensors: quantize the last axis of an f32 or bf16 tensor in blocks of 32 (E2M1 codes
// packed two per byte, one E8M0 scale per block) and back. The format, both scale rules and the
// per-block codec are in mxfp4_block.h; docs/formats.md has the full contract.
#pragma once

#include <string_view>

#include "mxq/core/tensor.h"
#include "mxq/formats/mxfp4_block.h"

namespace mxq {

// "floor" / "ceil". parse_scale_rule throws mxq::Error naming `argument` on any other text.
std::string_view to_string(ScaleRule rule);
ScaleRule parse_scale_rule(std::string_view text, std::string_view argument = "scale rule");

struct Mxfp4Tensor {
  Tensor blocks;  // u8 [..., K/32, 16]
  Tensor scales;  // e8m0 [..., K/32]
};

// x: f32 or bf16 [..., K] on the host, contiguous, K % 32 == 0, rank >= 1.
Mxfp4Tensor quantize_mxfp4(const TensorView& x, ScaleRule rule = ScaleRule::kFloor);
// blocks: u8 (or e2m1x2) [..., G, 16]; scales: e8m0 or u8 [..., G]; both host, contiguous.
// Returns f32 [..., G * 32].
Tensor dequantize_mxfp4(const TensorView& blocks, const TensorView& scales);

}  // namespace mxq
