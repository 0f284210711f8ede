#include "mxq/moe/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mxq/core/enum_names.h"
#include "mxq/core/error.h"

namespace mxq::moe {

namespace {
constexpr EnumNames<Activation, 3> kActivationNames{{{{Activation::kSwigluOai, "swiglu_oai"},
                                                      {Activation::kSwigluClamp, "swiglu_clamp"},
                                                      {Activation::kSwiglu, "swiglu"}}}};
constexpr EnumNames<RouterKind, 2> kRouterNames{
    {{{RouterKind::kTopkSoftmax, "topk_softmax"}, {RouterKind::kPrecomputed, "precomputed"}}}};
constexpr EnumNames<ActivationQuant, 2> kActivationQuantNames{
    {{{ActivationQuant::kBf16, "bf16"}, {ActivationQuant::kFp8Group128, "fp8_g128"}}}};
}  // namespace

std::string_view to_string(Activation activation) { return kActivationNames.name(activation); }
std::string_view to_string(RouterKind router) { return kRouterNames.name(router); }
std::string_view to_string(ActivationQuant quant) { return kActivationQuantNames.name(quant); }

std::optional<ActivationQuant> activation_quant_from_name(std::string_view name) {
  return kActivationQuantNames.find(name);
}
std::optional<Activation> activation_from_name(std::string_view name) {
  return kActivationNames.find(name);
}
std::optional<RouterKind> router_from_name(std::string_view name) {
  return kRouterNames.find(name);
}

Activation parse_activation(std::string_view text, std::string_view argument) {
  return kActivationNames.parse(text, argument);
}
ActivationQuant parse_activation_quant(std::string_view text, std::string_view argument) {
  return kActivationQuantNames.parse(text, argument);
}

void MoeConfig::validate() const {
  const auto require_multiple_of_32 = [](std::string_view field, std::int64_t value) {
    if (value <= 0 || value % 32 != 0) {
      fail_argument(ErrorCode::kInvalidArgument, field,
                    "a positive multiple of 32 (the MXFP4 block size)", value);
    }
  };
  require_multiple_of_32("hidden_size", hidden_size);
  require_multiple_of_32("intermediate_size", intermediate_size);
  if (num_experts <= 0) {
    fail_argument(ErrorCode::kInvalidArgument, "num_experts", "at least 1", num_experts);
  }
  if (top_k < 1 || top_k > num_experts) {
    fail_argument(ErrorCode::kInvalidArgument, "top_k",
                  detail::concat("1 <= top_k <= num_experts (", num_experts, ")"), top_k);
  }
  if (!(std::isfinite(swiglu_limit) && swiglu_limit > 0)) {
    fail_argument(ErrorCode::kInvalidArgument, "swiglu_limit", "a finite positive number",
                  swiglu_limit);
  }
  if (!std::isfinite(swiglu_alpha)) {
    fail_argument(ErrorCode::kInvalidArgument, "swiglu_alpha", "a finite number", swiglu_alpha);
  }
  if (num_layers < 0) {
    fail_argument(ErrorCode::kInvalidArgument, "num_layers", ">= 0 (0 = unknown)", num_layers);
  }
}

namespace {

std::int64_t required_int(const nlohmann::json& json, std::string_view key,
                          std::string_view label) {
  const auto it = json.find(std::string(key));
  if (it == json.end()) {
    fail(ErrorCode::kFormat, label, ": missing key \"", key, "\"");
  }
  if (!it->is_number_integer()) {
    fail(ErrorCode::kFormat, label, ": key \"", key, "\": expected an integer, found ", it->dump());
  }
  return it->get<std::int64_t>();
}

}  // namespace

MoeConfig parse_moe_config_json(std::string_view text, std::string_view label) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    fail(ErrorCode::kFormat, label, ": not valid JSON: ", error.what());
  }
  if (!json.is_object()) fail(ErrorCode::kFormat, label, ": expected a JSON object");
  MoeConfig config;
  config.hidden_size = required_int(json, "hidden_size", label);
  config.intermediate_size = required_int(json, "intermediate_size", label);
  config.num_experts = required_int(json, "num_local_experts", label);
  config.top_k = json.contains("num_experts_per_tok")
                     ? required_int(json, "num_experts_per_tok", label)
                     : required_int(json, "experts_per_token", label);
  if (json.contains("swiglu_limit")) {
    const auto& limit = json["swiglu_limit"];
    if (!limit.is_number()) {
      fail(ErrorCode::kFormat, label, ": key \"swiglu_limit\": expected a number, found ",
           limit.dump());
    }
    config.swiglu_limit = limit.get<double>();
  }
  if (json.contains("num_hidden_layers")) {
    config.num_layers = required_int(json, "num_hidden_layers", label);
  }
  try {
    config.validate();
  } catch (const Error& error) {
    fail(ErrorCode::kFormat, label, ": ", error.what());
  }
  return config;
}

MoeConfig load_moe_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorCode::kIo, "cannot open ", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_moe_config_json(buffer.str(), path);
}

std::string moe_config_to_json(const MoeConfig& config) {
  nlohmann::json json = {
      {"architectures", {"GptOssForCausalLM"}},
      {"model_type", "gpt_oss"},
      {"hidden_size", config.hidden_size},
      {"intermediate_size", config.intermediate_size},
      {"num_local_experts", config.num_experts},
      {"num_experts_per_tok", config.top_k},
      {"experts_per_token", config.top_k},
      {"swiglu_limit", config.swiglu_limit},
      {"quantization_config", {{"quant_method", "mxfp4"}}},
  };
  if (config.num_layers > 0) json["num_hidden_layers"] = config.num_layers;
  return json.dump(2) + "\n";
}

}  // namespace mxq::moe
