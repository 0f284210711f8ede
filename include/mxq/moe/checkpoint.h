// MoE checkpoints on disk: tensor naming, the expected shape and dtype of every tensor, and a
// reader over one or more memory-mapped .safetensors files (plus config.json when present).
//
// Two layouts per layer L (E experts, hidden H, intermediate I):
//
// gpt-oss (as OpenAI ships it; gate and up rows interleaved g0, u0, g1, u1, ...):
//   model.layers.L.mlp.router.weight                   BF16 [E, H]
//   model.layers.L.mlp.router.bias                     BF16 [E]
//   model.layers.L.mlp.experts.gate_up_proj_blocks     U8   [E, 2I, H/32, 16]
//   model.layers.L.mlp.experts.gate_up_proj_scales     U8   [E, 2I, H/32]
//   model.layers.L.mlp.experts.gate_up_proj_bias       BF16 [E, 2I]
//   model.layers.L.mlp.experts.down_proj_blocks        U8   [E, H, I/32, 16]
//   model.layers.L.mlp.experts.down_proj_scales        U8   [E, H, I/32]
//   model.layers.L.mlp.experts.down_proj_bias          BF16 [E, H]
//
// native (mxq's per-expert layout, written by `mxq synth --layout native`; router as above):
//   model.layers.L.mlp.experts.e.gate.blocks   U8 [I, H/32, 16]   .gate.scales U8 [I, H/32]
//   model.layers.L.mlp.experts.e.gate.bias     BF16 [I]
//   model.layers.L.mlp.experts.e.up.{blocks,scales,bias}       same shapes as gate
//   model.layers.L.mlp.experts.e.down.blocks   U8 [H, I/32, 16]   .down.scales U8 [H, I/32]
//   model.layers.L.mlp.experts.e.down.bias     BF16 [H]
//
// Blocks hold two E2M1 codes per byte (element 2j in the low nibble), 32 elements per scale;
// scales are E8M0 bytes, stored as U8 (F8_E8M0 is accepted too). Biases exist only when the
// layer has them; router tensors only for RouterKind::kTopkSoftmax.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/core/tensor.h"
#include "mxq/moe/config.h"

namespace mxq::moe {

enum class CheckpointLayout { kGptOss, kNative };
std::string_view to_string(CheckpointLayout layout);
std::optional<CheckpointLayout> layout_from_name(std::string_view name);

enum class MoeTensorKind {
  kRouterWeight,
  kRouterBias,
  // gpt-oss, all experts in one tensor
  kGateUpBlocks,
  kGateUpScales,
  kGateUpBias,
  kDownBlocks,
  kDownScales,
  kDownBias,
  // native, one tensor per expert
  kGateBlocks,
  kGateScales,
  kGateBias,
  kUpBlocks,
  kUpScales,
  kUpBias,
  kExpertDownBlocks,
  kExpertDownScales,
  kExpertDownBias,
};

struct MoeTensorName {
  std::int64_t layer = 0;
  MoeTensorKind kind = MoeTensorKind::kRouterWeight;
  std::int64_t expert = -1;  // native per-expert tensors only
  friend bool operator==(const MoeTensorName&, const MoeTensorName&) = default;
};

bool is_per_expert(MoeTensorKind kind);
bool is_bias(MoeTensorKind kind);
bool is_router(MoeTensorKind kind);
bool is_scale(MoeTensorKind kind);

std::string format_tensor_name(const MoeTensorName& name);
// nullopt for names that are not MoE tensors of this naming scheme.
std::optional<MoeTensorName> parse_tensor_name(std::string_view name);

// Shape and dtype a checkpoint tensor must have (scales: U8, or E8M0 where allowed).
struct TensorSpec {
  Shape shape;
  DType dtype = DType::kU8;
};
TensorSpec expected_tensor_spec(const MoeConfig& config, MoeTensorKind kind);
// Throws mxq::Error naming `label` when `tensor` is not a contiguous host tensor of the
// expected shape and dtype (kShapeMismatch / kDtypeMismatch / kInvalidArgument).
void check_tensor_against_spec(const MoeConfig& config, MoeTensorKind kind,
                               const TensorView& tensor, std::string_view label);

// Every tensor a layer of this config needs, in a fixed order.
std::vector<MoeTensorName> required_tensor_names(const MoeConfig& config, std::int64_t layer,
                                                 CheckpointLayout layout);

// Explicit dimensions for a checkpoint without config.json (or overriding it).
struct MoeConfigOverrides {
  std::optional<std::int64_t> hidden_size;
  std::optional<std::int64_t> intermediate_size;
  std::optional<std::int64_t> num_experts;
  std::optional<std::int64_t> top_k;
  std::optional<double> swiglu_limit;
  std::optional<Activation> activation;
  std::optional<ActivationQuant> activation_quant;
};

class MoeCheckpoint {
 public:
  // `path`: a directory (every *.safetensors in it, plus config.json when present) or one
  // .safetensors file (plus a config.json next to it when present). A tensor name present in
  // two files is an error. Throws mxq::Error(kIo / kFormat).
  static MoeCheckpoint open(const std::string& path);

  [[nodiscard]] const std::string& path() const;
  [[nodiscard]] const std::vector<std::string>& files() const;
  [[nodiscard]] const std::optional<MoeConfig>& file_config() const;  // config.json
  [[nodiscard]] bool contains(const std::string& name) const;
  // Read-only memory-mapped view; kInvalidArgument naming the tensor and the path when absent.
  // The data of a multi-byte dtype may be unaligned (safetensors does not align): copy from it
  // with memcpy, never through a typed pointer.
  [[nodiscard]] TensorView view(const std::string& name) const;
  // Layers that hold MoE tensors, ascending.
  [[nodiscard]] std::vector<std::int64_t> layers() const;
  // The layout of layer `layer`; kOutOfRange when the checkpoint has no such layer.
  [[nodiscard]] CheckpointLayout layout(std::int64_t layer) const;
  // config.json (when present) with the overrides applied; without config.json H, I and E
  // come from the tensor shapes of `layer` and top_k must be given. Validated.
  [[nodiscard]] MoeConfig resolve_config(std::int64_t layer,
                                         const MoeConfigOverrides& overrides = {}) const;

 private:
  struct State;
  std::shared_ptr<const State> state_;
};

}  // namespace mxq::moe
