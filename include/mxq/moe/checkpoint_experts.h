// One layer's expert and router tensors read from a checkpoint, in the form the engine-facing op
// prepares from (mxq/moe/mxfp4_moe.h): what `Mxfp4MoE.from_checkpoint` and a C++ caller without
// its own loader use.
#pragma once

#include <cstdint>

#include "mxq/core/tensor.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/config.h"
#include "mxq/moe/mxfp4_moe.h"

namespace mxq::moe {

// Owned, aligned host copies (the memory map is read-only and safetensors does not align): a
// gpt-oss layer in its stored layout, a native layer's per-expert tensors stacked into the native
// layout (w13 [E, 2I, H/32, 16] gate rows then up rows, ...); scales as u8. The biases and the
// router tensors are empty when the layer has none. A rank's read (the second overload below)
// holds E_local experts and tp.valid channels in the same layout (w13 [E_local, 2 tp.valid, ...],
// w2 [E_local, H, tp.valid/32, 16], ...), the whole router; config and layer_shape() stay the
// whole layer's, which is what prepare_mxfp4_moe takes with such inputs.
struct CheckpointExperts {
  MoeConfig config;
  CheckpointLayout layout = CheckpointLayout::kGptOss;
  Tensor w13, w13_scale, w13_bias, w2, w2_scale, w2_bias;
  Tensor router_weight, router_bias;

  [[nodiscard]] MoeExpertTensors expert_tensors() const {
    return {layout, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias};
  }
  [[nodiscard]] MoeLayerShape layer_shape() const {
    return {config.num_experts, config.hidden_size, config.intermediate_size, config.has_bias};
  }
};

// Throws mxq::Error (kOutOfRange for a missing layer, kShapeMismatch / kDtypeMismatch for a
// tensor that does not match the resolved config, kInvalidArgument for a missing one).
CheckpointExperts read_checkpoint_experts(const MoeCheckpoint& checkpoint, std::int64_t layer,
                                          const MoeConfigOverrides& overrides = {});
// Only rank `rank`'s experts (its EP shard) and channels (its TP shard; `rank.alignment` and
// `rank.activation_quant` play no part): what one process of a distributed layer reads, and all of
// the checkpoint it touches besides the router. Bad ranks are refused (as prepared_moe_shapes
// does) before anything is read. A TP rank past the last channel gets tensors of 0 channels.
CheckpointExperts read_checkpoint_experts(const MoeCheckpoint& checkpoint, std::int64_t layer,
                                          const MoeConfigOverrides& overrides, const MoeRank& rank);

}  // namespace mxq::moe
