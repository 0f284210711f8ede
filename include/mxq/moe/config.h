// MoeConfig: the dimensions and options of one MXFP4 Mixture-of-Experts layer, read from a
// Hugging Face config.json (gpt-oss keys) or given explicitly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mxq::moe {

// The gated activation between the two expert GEMMs (g = gate, u = up, L = swiglu_limit):
// - kSwigluOai (gpt-oss): g = min(g, L), u = clamp(u, -L, L),
//   out = (u + 1) * g * sigmoid(alpha * g)
// - kSwigluClamp (DeepSeek-V4): out = silu(min(g, L)) * clamp(u, -L, L)
// - kSwiglu (plain): out = silu(g) * u
enum class Activation { kSwigluOai, kSwigluClamp, kSwiglu };

// How tokens pick experts:
//   kTopkSoftmax  gpt-oss: logits = x . Wr^T + br, top-k of the logits, softmax over those k.
//   kPrecomputed  the caller passes expert ids and weights to forward(); no router weights.
enum class RouterKind { kTopkSoftmax, kPrecomputed };

// What the expert GEMMs multiply the MXFP4 weights with:
// - kBf16 (W4A16): the bf16 activations as they are;
// - kFp8Group128 (W4A8): each GEMM input row (a token's x for GEMM1, a pair's bf16 activation
//   for GEMM2) quantized to E4M3 in groups of 128 along K, scale = max(amax, 1e-4) / 448 in fp32
//   (the block-FP8 activation rule), saturating round-to-nearest-even; the GEMMs use q * scale.
//   Groups start at channel 0 of each TP rank's slice, so TP splits change the GEMM2 groups.
enum class ActivationQuant { kBf16, kFp8Group128 };

std::string_view to_string(Activation activation);
std::string_view to_string(RouterKind router);
std::string_view to_string(ActivationQuant quant);  // "bf16" / "fp8_g128"
std::optional<Activation> activation_from_name(std::string_view name);
std::optional<ActivationQuant> activation_quant_from_name(std::string_view name);
std::optional<RouterKind> router_from_name(std::string_view name);
// The value named `text`, or mxq::Error(kInvalidArgument) naming `argument` and the choices.
Activation parse_activation(std::string_view text, std::string_view argument);
ActivationQuant parse_activation_quant(std::string_view text, std::string_view argument);

struct MoeConfig {
  std::int64_t hidden_size = 0;        // H, a multiple of 32
  std::int64_t intermediate_size = 0;  // I (per expert, before TP), a multiple of 32
  std::int64_t num_experts = 0;        // E (global)
  std::int64_t top_k = 0;              // experts per token, 1 <= top_k <= E
  double swiglu_limit = 7.0;           // L
  double swiglu_alpha = 1.702;         // alpha of kSwigluOai
  Activation activation = Activation::kSwigluOai;
  bool has_bias = true;  // gate/up bias [E, 2I] and down bias [E, H]
  RouterKind router = RouterKind::kTopkSoftmax;
  std::int64_t num_layers = 0;  // num_hidden_layers when known, else 0
  // A run-time choice, not part of config.json.
  ActivationQuant activation_quant = ActivationQuant::kBf16;

  // Throws mxq::Error(kInvalidArgument) naming the first field that is out of range.
  void validate() const;
  friend bool operator==(const MoeConfig&, const MoeConfig&) = default;
};

// Parses config.json text: hidden_size, intermediate_size, num_local_experts,
// num_experts_per_tok (or experts_per_token), swiglu_limit (optional, default 7),
// num_hidden_layers (optional). Other keys are ignored. The result is validated.
MoeConfig parse_moe_config_json(std::string_view text, std::string_view label = "config.json");
MoeConfig load_moe_config(const std::string& path);
// The config.json text `parse_moe_config_json` reads back (gpt-oss keys plus model_type).
std::string moe_config_to_json(const MoeConfig& config);

}  // namespace mxq::moe
