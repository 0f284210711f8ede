#include "mxq/moe/checkpoint.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <map>
#include <set>

#include "mxq/core/enum_names.h"
#include "mxq/core/error.h"
#include "mxq/io/safetensors.h"

namespace mxq::moe {

namespace {
constexpr EnumNames<CheckpointLayout, 2> kCheckpointLayoutNames{
    {{{CheckpointLayout::kGptOss, "gpt-oss"}, {CheckpointLayout::kNative, "native"}}}};
}  // namespace

std::string_view to_string(CheckpointLayout layout) { return kCheckpointLayoutNames.name(layout); }

std::optional<CheckpointLayout> layout_from_name(std::string_view name) {
  return kCheckpointLayoutNames.find(name);
}

namespace {

struct KindName {
  MoeTensorKind kind;
  std::string_view suffix;  // after "model.layers.L.mlp." (per-expert: after "experts.e.")
};

constexpr std::array<KindName, 8> kLayerKinds = {{
    {MoeTensorKind::kRouterWeight, "router.weight"},
    {MoeTensorKind::kRouterBias, "router.bias"},
    {MoeTensorKind::kGateUpBlocks, "experts.gate_up_proj_blocks"},
    {MoeTensorKind::kGateUpScales, "experts.gate_up_proj_scales"},
    {MoeTensorKind::kGateUpBias, "experts.gate_up_proj_bias"},
    {MoeTensorKind::kDownBlocks, "experts.down_proj_blocks"},
    {MoeTensorKind::kDownScales, "experts.down_proj_scales"},
    {MoeTensorKind::kDownBias, "experts.down_proj_bias"},
}};

constexpr std::array<KindName, 9> kExpertKinds = {{
    {MoeTensorKind::kGateBlocks, "gate.blocks"},
    {MoeTensorKind::kGateScales, "gate.scales"},
    {MoeTensorKind::kGateBias, "gate.bias"},
    {MoeTensorKind::kUpBlocks, "up.blocks"},
    {MoeTensorKind::kUpScales, "up.scales"},
    {MoeTensorKind::kUpBias, "up.bias"},
    {MoeTensorKind::kExpertDownBlocks, "down.blocks"},
    {MoeTensorKind::kExpertDownScales, "down.scales"},
    {MoeTensorKind::kExpertDownBias, "down.bias"},
}};

constexpr std::string_view kPrefix = "model.layers.";

// Parses a non-negative decimal integer at the front of `text`, advancing it.
std::optional<std::int64_t> take_index(std::string_view& text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data() || value < 0) return std::nullopt;
  if (text.size() > 1 && text[0] == '0' && end - text.data() > 1) return std::nullopt;
  text.remove_prefix(static_cast<std::size_t>(end - text.data()));
  return value;
}

}  // namespace

bool is_per_expert(MoeTensorKind kind) { return kind >= MoeTensorKind::kGateBlocks; }

bool is_bias(MoeTensorKind kind) {
  switch (kind) {
    case MoeTensorKind::kGateUpBias:
    case MoeTensorKind::kDownBias:
    case MoeTensorKind::kGateBias:
    case MoeTensorKind::kUpBias:
    case MoeTensorKind::kExpertDownBias:
      return true;
    default:
      return false;
  }
}

bool is_router(MoeTensorKind kind) {
  return kind == MoeTensorKind::kRouterWeight || kind == MoeTensorKind::kRouterBias;
}

bool is_scale(MoeTensorKind kind) {
  switch (kind) {
    case MoeTensorKind::kGateUpScales:
    case MoeTensorKind::kDownScales:
    case MoeTensorKind::kGateScales:
    case MoeTensorKind::kUpScales:
    case MoeTensorKind::kExpertDownScales:
      return true;
    default:
      return false;
  }
}

std::string format_tensor_name(const MoeTensorName& name) {
  std::string out = detail::concat(kPrefix, name.layer, ".mlp.");
  if (is_per_expert(name.kind)) {
    for (const auto& entry : kExpertKinds) {
      if (entry.kind == name.kind)
        return out + detail::concat("experts.", name.expert, ".", entry.suffix);
    }
  } else {
    for (const auto& entry : kLayerKinds) {
      if (entry.kind == name.kind) return out + std::string(entry.suffix);
    }
  }
  fail(ErrorCode::kInternal, "format_tensor_name: unknown tensor kind");
}

std::optional<MoeTensorName> parse_tensor_name(std::string_view text) {
  if (!text.starts_with(kPrefix)) return std::nullopt;
  text.remove_prefix(kPrefix.size());
  MoeTensorName name;
  const auto layer = take_index(text);
  if (!layer || !text.starts_with(".mlp.")) return std::nullopt;
  text.remove_prefix(5);
  name.layer = *layer;
  for (const auto& entry : kLayerKinds) {
    if (text == entry.suffix) {
      name.kind = entry.kind;
      return name;
    }
  }
  if (!text.starts_with("experts.")) return std::nullopt;
  text.remove_prefix(8);
  const auto expert = take_index(text);
  if (!expert || !text.starts_with(".")) return std::nullopt;
  text.remove_prefix(1);
  for (const auto& entry : kExpertKinds) {
    if (text == entry.suffix) {
      name.kind = entry.kind;
      name.expert = *expert;
      return name;
    }
  }
  return std::nullopt;
}

TensorSpec expected_tensor_spec(const MoeConfig& config, MoeTensorKind kind) {
  const std::int64_t e = config.num_experts;
  const std::int64_t h = config.hidden_size;
  const std::int64_t i = config.intermediate_size;
  switch (kind) {
    case MoeTensorKind::kRouterWeight:
      return {{e, h}, DType::kBF16};
    case MoeTensorKind::kRouterBias:
      return {{e}, DType::kBF16};
    case MoeTensorKind::kGateUpBlocks:
      return {{e, 2 * i, h / 32, 16}, DType::kU8};
    case MoeTensorKind::kGateUpScales:
      return {{e, 2 * i, h / 32}, DType::kU8};
    case MoeTensorKind::kGateUpBias:
      return {{e, 2 * i}, DType::kBF16};
    case MoeTensorKind::kDownBlocks:
      return {{e, h, i / 32, 16}, DType::kU8};
    case MoeTensorKind::kDownScales:
      return {{e, h, i / 32}, DType::kU8};
    case MoeTensorKind::kDownBias:
      return {{e, h}, DType::kBF16};
    case MoeTensorKind::kGateBlocks:
    case MoeTensorKind::kUpBlocks:
      return {{i, h / 32, 16}, DType::kU8};
    case MoeTensorKind::kGateScales:
    case MoeTensorKind::kUpScales:
      return {{i, h / 32}, DType::kU8};
    case MoeTensorKind::kGateBias:
    case MoeTensorKind::kUpBias:
      return {{i}, DType::kBF16};
    case MoeTensorKind::kExpertDownBlocks:
      return {{h, i / 32, 16}, DType::kU8};
    case MoeTensorKind::kExpertDownScales:
      return {{h, i / 32}, DType::kU8};
    case MoeTensorKind::kExpertDownBias:
      return {{h}, DType::kBF16};
  }
  fail(ErrorCode::kInternal, "expected_tensor_spec: unknown tensor kind");
}

void check_tensor_against_spec(const MoeConfig& config, MoeTensorKind kind,
                               const TensorView& tensor, std::string_view label) {
  const TensorSpec spec = expected_tensor_spec(config, kind);
  const bool dtype_ok =
      tensor.dtype() == spec.dtype || (is_scale(kind) && tensor.dtype() == DType::kE8M0);
  if (!dtype_ok) {
    fail_argument(
        ErrorCode::kDtypeMismatch, label,
        is_scale(kind) ? std::string("dtype u8 (or e8m0)") : detail::concat("dtype ", spec.dtype),
        detail::concat("dtype ", tensor.dtype()));
  }
  if (!(tensor.shape() == spec.shape)) {
    fail_argument(ErrorCode::kShapeMismatch, label, detail::concat("shape ", spec.shape),
                  detail::concat("shape ", tensor.shape()));
  }
  if (!tensor.device().is_cpu()) {
    fail_argument(ErrorCode::kDeviceMismatch, label, "a host tensor",
                  detail::concat("device ", tensor.device()));
  }
  if (!tensor.is_contiguous()) {
    fail_argument(ErrorCode::kInvalidArgument, label, "a contiguous tensor",
                  detail::concat("strides ", tensor.strides()));
  }
  if (tensor.numel() > 0 && tensor.data() == nullptr) {
    fail_argument(ErrorCode::kInvalidArgument, label, "data", "a null pointer");
  }
}

std::vector<MoeTensorName> required_tensor_names(const MoeConfig& config, std::int64_t layer,
                                                 CheckpointLayout layout) {
  std::vector<MoeTensorName> names;
  const auto add = [&](MoeTensorKind kind, std::int64_t expert = -1) {
    if (is_bias(kind) && !config.has_bias) return;
    names.push_back({layer, kind, expert});
  };
  if (config.router == RouterKind::kTopkSoftmax) {
    names.push_back({layer, MoeTensorKind::kRouterWeight, -1});
    if (config.has_bias) names.push_back({layer, MoeTensorKind::kRouterBias, -1});
  }
  if (layout == CheckpointLayout::kGptOss) {
    for (auto kind :
         {MoeTensorKind::kGateUpBlocks, MoeTensorKind::kGateUpScales, MoeTensorKind::kGateUpBias,
          MoeTensorKind::kDownBlocks, MoeTensorKind::kDownScales, MoeTensorKind::kDownBias}) {
      add(kind);
    }
  } else {
    for (std::int64_t e = 0; e < config.num_experts; ++e) {
      for (const auto& entry : kExpertKinds) add(entry.kind, e);
    }
  }
  return names;
}

// ---- MoeCheckpoint --------------------------------------------------------------------------

struct MoeCheckpoint::State {
  std::string path;
  std::vector<std::string> file_paths;
  std::vector<io::SafetensorsFile> files;
  std::map<std::string, std::size_t> index;  // tensor name -> file
  std::optional<MoeConfig> config;
};

MoeCheckpoint MoeCheckpoint::open(const std::string& path) {
  namespace fs = std::filesystem;
  auto state = std::make_shared<State>();
  state->path = path;
  std::error_code error;
  fs::path config_path;
  if (fs::is_directory(path, error)) {
    for (const auto& item : fs::directory_iterator(path)) {
      if (item.path().extension() == ".safetensors") state->file_paths.push_back(item.path());
    }
    std::sort(state->file_paths.begin(), state->file_paths.end());
    if (state->file_paths.empty()) {
      fail(ErrorCode::kIo, "checkpoint ", path, ": no .safetensors files in this directory");
    }
    config_path = fs::path(path) / "config.json";
  } else if (fs::is_regular_file(path, error)) {
    state->file_paths.push_back(path);
    config_path = fs::path(path).parent_path() / "config.json";
  } else {
    fail(ErrorCode::kIo, "checkpoint ", path, ": no such file or directory");
  }
  for (const std::string& file : state->file_paths) {
    state->files.push_back(io::SafetensorsFile::open(file));
    for (const auto& entry : state->files.back().entries()) {
      const auto [it, inserted] = state->index.emplace(entry.name, state->files.size() - 1);
      if (!inserted) {
        fail(ErrorCode::kFormat, "checkpoint ", path, ": tensor ", entry.name, " appears in both ",
             state->file_paths[it->second], " and ", file);
      }
    }
  }
  if (fs::is_regular_file(config_path, error)) state->config = load_moe_config(config_path);
  MoeCheckpoint checkpoint;
  checkpoint.state_ = std::move(state);
  return checkpoint;
}

const std::string& MoeCheckpoint::path() const { return state_->path; }
const std::vector<std::string>& MoeCheckpoint::files() const { return state_->file_paths; }
const std::optional<MoeConfig>& MoeCheckpoint::file_config() const { return state_->config; }

bool MoeCheckpoint::contains(const std::string& name) const { return state_->index.contains(name); }

TensorView MoeCheckpoint::view(const std::string& name) const {
  const auto it = state_->index.find(name);
  if (it == state_->index.end()) {
    fail(ErrorCode::kInvalidArgument, "checkpoint ", state_->path, ": tensor ", name,
         " is missing");
  }
  // Built from bytes() rather than view(): safetensors does not align tensor data, and the MoE
  // loader only ever memcpy's from these views.
  const io::SafetensorsFile& file = state_->files[it->second];
  const io::SafetensorsEntry& entry = file.entry(name);
  return TensorView(const_cast<std::byte*>(file.bytes(name).data()), entry.dtype, entry.shape);
}

std::vector<std::int64_t> MoeCheckpoint::layers() const {
  std::set<std::int64_t> layers;
  for (const auto& [name, file] : state_->index) {
    if (const auto parsed = parse_tensor_name(name); parsed && !is_router(parsed->kind)) {
      layers.insert(parsed->layer);
    }
  }
  return {layers.begin(), layers.end()};
}

CheckpointLayout MoeCheckpoint::layout(std::int64_t layer) const {
  const std::vector<std::int64_t> present = layers();
  const bool known = std::find(present.begin(), present.end(), layer) != present.end();
  const std::int64_t configured = state_->config ? state_->config->num_layers : 0;
  if (layer < 0 || (configured > 0 && layer >= configured) || !known) {
    std::string held = present.empty() ? std::string("none")
                                       : detail::concat(present.front(), "..", present.back());
    fail(ErrorCode::kOutOfRange, "layer: expected one of the checkpoint's MoE layers (", held,
         configured > 0 ? detail::concat("; config.json: ", configured, " layers") : "",
         "), found ", layer);
  }
  if (contains(format_tensor_name({layer, MoeTensorKind::kGateUpBlocks, -1}))) {
    return CheckpointLayout::kGptOss;
  }
  return CheckpointLayout::kNative;
}

MoeConfig MoeCheckpoint::resolve_config(std::int64_t layer,
                                        const MoeConfigOverrides& overrides) const {
  MoeConfig config;
  if (state_->config) {
    config = *state_->config;
  } else {
    // Dimensions from the tensor shapes.
    const CheckpointLayout where = layout(layer);
    if (where == CheckpointLayout::kGptOss) {
      const Shape blocks = view(format_tensor_name({layer, MoeTensorKind::kGateUpBlocks})).shape();
      if (blocks.rank() != 4) {
        fail(ErrorCode::kFormat, "checkpoint ", path(), ": gate_up_proj_blocks has shape ", blocks,
             ", expected [E, 2I, H/32, 16]");
      }
      config.num_experts = blocks[0];
      config.intermediate_size = blocks[1] / 2;
      config.hidden_size = blocks[2] * 32;
    } else {
      const Shape gate = view(format_tensor_name({layer, MoeTensorKind::kGateBlocks, 0})).shape();
      if (gate.rank() != 3) {
        fail(ErrorCode::kFormat, "checkpoint ", path(), ": gate.blocks has shape ", gate,
             ", expected [I, H/32, 16]");
      }
      config.intermediate_size = gate[0];
      config.hidden_size = gate[1] * 32;
      std::int64_t experts = 0;
      while (contains(format_tensor_name({layer, MoeTensorKind::kGateBlocks, experts}))) ++experts;
      config.num_experts = experts;
    }
    if (!overrides.top_k) {
      fail(ErrorCode::kInvalidArgument, "checkpoint ", path(),
           ": no config.json, so the number of experts per token (top_k) must be given");
    }
  }
  if (overrides.hidden_size) config.hidden_size = *overrides.hidden_size;
  if (overrides.intermediate_size) config.intermediate_size = *overrides.intermediate_size;
  if (overrides.num_experts) config.num_experts = *overrides.num_experts;
  if (overrides.top_k) config.top_k = *overrides.top_k;
  if (overrides.swiglu_limit) config.swiglu_limit = *overrides.swiglu_limit;
  if (overrides.activation) config.activation = *overrides.activation;
  if (overrides.activation_quant) config.activation_quant = *overrides.activation_quant;
  config.has_bias = contains(format_tensor_name({layer, MoeTensorKind::kRouterBias})) ||
                    contains(format_tensor_name({layer, MoeTensorKind::kGateUpBias})) ||
                    contains(format_tensor_name({layer, MoeTensorKind::kGateBias, 0}));
  config.validate();
  return config;
}

}  // namespace mxq::moe
