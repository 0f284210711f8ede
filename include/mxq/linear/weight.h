// A block-FP8 weight (DeepSeek-V3 layout): E4M3 codes [N, K] and one scale per bn x bk block,
// stored as fp32 [ceil(N/bn), ceil(K/bk)] (a checkpoint's `weight_scale_inv`: the dequant
// multiplier) or as packed UE8M0 int32 [ceil(G/4), round_up(ceil(N/bn), 4)] with
// G = ceil(K/bk) (mxq/formats/ue8m0_pack.h). Dequantized weight = q * scale of its block.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mxq/core/tensor.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/linear/problem.h"

namespace mxq::linear {

struct BlockFp8Weight {
  Tensor q;      // e4m3 [N, K]
  Tensor scale;  // f32 [ceil(N/bn), ceil(K/bk)] or i32 packed UE8M0 (see above)
  BlockShape block{128, 128};

  [[nodiscard]] std::int64_t n() const { return q.shape().rank() == 2 ? q.shape()[0] : 0; }
  [[nodiscard]] std::int64_t k() const { return q.shape().rank() == 2 ? q.shape()[1] : 0; }
  [[nodiscard]] std::int64_t row_blocks() const;  // ceil(N / bn)
  [[nodiscard]] std::int64_t col_blocks() const;  // ceil(K / bk)
  [[nodiscard]] ScaleLayout scale_layout() const;
  [[nodiscard]] Device device() const { return q.device(); }

  // Throws mxq::Error naming `argument` when the parts disagree: q not e4m3 [N, K], a block
  // extent < 1, scale not f32 [ceil(N/bn), ceil(K/bk)] nor i32 [ceil(G/4), round_up(NB, 4)],
  // q and scale on different devices, non-contiguous parts.
  void validate(std::string_view argument = "weight") const;

  // Copies both parts to `device`.
  [[nodiscard]] BlockFp8Weight to(Device device) const;
  // The same weight with fp32 scales (packed UE8M0 is unpacked exactly; fp32 is shared as is).
  [[nodiscard]] BlockFp8Weight with_fp32_scales() const;
  // The same weight with packed UE8M0 scales; every scale must be a power of two (host only).
  [[nodiscard]] BlockFp8Weight with_packed_ue8m0_scales() const;
};

// Validates and assembles a weight from its parts.
BlockFp8Weight make_block_fp8_weight(Tensor q, Tensor scale, BlockShape block);

// Quantizes an f32 or bf16 host matrix [N, K] (mxq::quantize_fp8_block).
BlockFp8Weight quantize_weight(const TensorView& w, BlockShape block,
                               ScaleMode mode = ScaleMode::kFp32);

// Where a loaded weight came from, for messages and `mxq linear --json`.
struct WeightOrigin {
  std::string file;        // the .safetensors file holding `name`.weight
  std::string block_from;  // where the block shape was read ("config.json ...", "metadata ...")
};

// Loads `{name}.weight` (F8_E4M3 [N, K]) and `{name}.weight_scale_inv` (F32 [NB, G]) on the host.
// `checkpoint` is either
//  * a DeepSeek-V3 style directory: config.json gives quantization_config.weight_block_size
//    ([bn, bk]); the tensor's file comes from model.safetensors.index.json's weight_map, else
//    the one *.safetensors file holding it; or
//  * one .safetensors file, e.g. written by `mxq quantize fp8-block`: its metadata gives
//    weight_block_size ("128x128"), else a config.json in the same folder does.
// Every mismatch (missing tensor or block size, wrong dtype, scale shape not matching the block)
// is an mxq::Error naming the file, the tensor, what was expected and what was found.
BlockFp8Weight load_weight(const std::string& checkpoint, const std::string& name,
                           WeightOrigin* origin = nullptr);

}  // namespace mxq::linear
