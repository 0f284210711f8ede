// `mxq quantize mxfp4|fp8-block IN.npy OUT.safetensors`: quantizes an f32 .npy array into the
// layouts checkpoints use. Everything is validated before anything is written, and the writer
// renames a finished temporary file, so an error leaves no output behind.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "mxq/core/build_info.h"
#include "mxq/core/log.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/formats/mxfp4.h"
#include "mxq/io/npy.h"
#include "mxq/io/safetensors.h"

namespace mxq::cli {
namespace {

struct QuantizeOptions {
  std::string input;
  std::string output;
  std::string name;
  std::string scale_rule = "floor";
  std::string block = "128x128";
  bool ue8m0 = false;
  bool strict = false;
  bool json = false;
};

// The NaN and ±Inf values of an input. One of them makes its whole block NaN: the block's scale
// becomes NaN (docs/formats.md), so every value of the block dequantizes to NaN.
struct NonFinite {
  std::int64_t nan = 0;
  std::int64_t inf = 0;
  std::int64_t first = -1;  // flat index of the first one
  std::int64_t blocks = 0;  // blocks holding one or more
  std::int64_t total_blocks = 0;
  [[nodiscard]] std::int64_t count() const { return nan + inf; }
};

// `block_of(i)` maps a flat index to its block number (blocks numbered in the order met).
template <typename BlockOf>
NonFinite find_non_finite(const Tensor& x, std::int64_t total_blocks, BlockOf block_of) {
  NonFinite found;
  found.total_blocks = total_blocks;
  const float* data = x.data_as<float>();
  std::int64_t last_block = -1;
  std::vector<bool> seen;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (std::isfinite(data[i])) continue;
    (std::isnan(data[i]) ? found.nan : found.inf) += 1;
    if (found.first < 0) {
      found.first = i;
      seen.assign(static_cast<std::size_t>(total_blocks), false);
    }
    const std::int64_t block = block_of(i);
    if (block != last_block && !seen[static_cast<std::size_t>(block)]) {
      seen[static_cast<std::size_t>(block)] = true;
      ++found.blocks;
    }
    last_block = block;
  }
  return found;
}

// "[1, 37]": the multi-index of flat index `flat` in `shape`.
std::vector<std::int64_t> index_of(std::int64_t flat, const Shape& shape) {
  std::vector<std::int64_t> index(shape.dims().size());
  for (std::size_t d = index.size(); d-- > 0;) {
    index[d] = flat % shape.dims()[d];
    flat /= shape.dims()[d];
  }
  return index;
}

std::string index_text(const std::vector<std::int64_t>& index) {
  std::string text = "[";
  for (std::size_t d = 0; d < index.size(); ++d) {
    text += (d ? ", " : "") + std::to_string(index[d]);
  }
  return text + "]";
}

// Warns (or, with --strict, refuses naming the input) when the input holds NaN or ±Inf.
void check_finite(const QuantizeOptions& options, const Tensor& x, const NonFinite& found,
                  std::string_view block_text) {
  if (found.count() == 0) return;
  const std::string what =
      detail::concat(found.count(), " non-finite value(s) (", found.nan, " NaN, ", found.inf,
                     " Inf), the first at index ", index_text(index_of(found.first, x.shape())),
                     "; ", found.blocks, " of ", found.total_blocks, " blocks (", block_text,
                     ") hold one and dequantize to NaN in all their values");
  if (options.strict) {
    fail_argument(ErrorCode::kInvalidArgument, options.input, "finite values (--strict)", what);
  }
  log_warn(options.input, ": ", what, " (--strict refuses such an input)");
}

nlohmann::json non_finite_json(const Tensor& x, const NonFinite& found) {
  return {{"nan", found.nan},
          {"inf", found.inf},
          {"first_index", found.first < 0 ? nlohmann::json(nullptr)
                                          : nlohmann::json(index_of(found.first, x.shape()))},
          {"blocks", found.blocks},
          {"total_blocks", found.total_blocks}};
}

std::string default_name(const std::string& input) {
  return std::filesystem::path(input).stem().string();
}

Tensor read_f32_input(const std::string& path) {
  Tensor x = io::read_npy(path);
  if (x.dtype() != DType::kF32)
    fail_argument(ErrorCode::kDtypeMismatch, path, "an f32 array", x.dtype());
  return x;
}

void report(const QuantizeOptions& options, const std::vector<io::NamedTensor>& written,
            const nlohmann::json& non_finite) {
  if (options.json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& [name, view] : written) {
      tensors.push_back({{"name", name},
                         {"dtype", std::string(mxq::name(view.dtype()))},
                         {"shape", std::vector<std::int64_t>(view.shape().dims().begin(),
                                                             view.shape().dims().end())}});
    }
    print_json({{"output", options.output}, {"tensors", tensors}, {"non_finite", non_finite}});
    return;
  }
  for (const auto& [name, view] : written) {
    std::cout << options.output << ": " << name << " " << view.dtype() << " " << view.shape()
              << "\n";
  }
}

void quantize_mxfp4_command(const QuantizeOptions& options) {
  const ScaleRule rule = parse_scale_rule(options.scale_rule);
  require_writable_output(options.output, "output");
  const Tensor x = read_f32_input(options.input);
  if (x.shape().rank() < 1 || x.shape().dim(-1) % kMxfp4BlockSize != 0) {
    fail_argument(ErrorCode::kShapeMismatch, options.input,
                  "an array whose last dimension is a multiple of 32", x.shape());
  }
  const NonFinite found = find_non_finite(x, x.numel() / kMxfp4BlockSize,
                                          [](std::int64_t i) { return i / kMxfp4BlockSize; });
  check_finite(options, x, found, "32 values along the last axis");
  const Mxfp4Tensor q = quantize_mxfp4(x, rule);
  const std::string name = options.name.empty() ? default_name(options.input) : options.name;
  // Checkpoints store E8M0 scale bytes as U8.
  const TensorView scales_u8(q.scales.data(), DType::kU8, q.scales.shape());
  const std::vector<io::NamedTensor> tensors = {{name + ".blocks", q.blocks.view()},
                                                {name + ".scales", scales_u8}};
  io::write_safetensors(options.output, tensors,
                        {{"format", "mxfp4"},
                         {"scale_rule", std::string(to_string(rule))},
                         {"producer", "mxq " + build_info().version}});
  report(options, tensors, non_finite_json(x, found));
}

void quantize_fp8_block_command(const QuantizeOptions& options) {
  const BlockShape block = parse_block_shape(options.block);
  require_writable_output(options.output, "output");
  const Tensor x = read_f32_input(options.input);
  if (x.shape().rank() != 2) {
    fail_argument(ErrorCode::kShapeMismatch, options.input, "a 2-D array [N, K]", x.shape());
  }
  const std::int64_t cols = x.shape()[1];
  const std::int64_t block_cols = (cols + block.k - 1) / block.k;
  const std::int64_t block_rows = (x.shape()[0] + block.n - 1) / block.n;
  const NonFinite found = find_non_finite(x, block_rows * block_cols, [&](std::int64_t i) {
    return (i / cols) / block.n * block_cols + (i % cols) / block.k;
  });
  check_finite(options, x, found, to_string(block) + " values");
  const Fp8BlockTensor q =
      quantize_fp8_block(x, block, options.ue8m0 ? ScaleMode::kUe8m0 : ScaleMode::kFp32);
  const std::string name = options.name.empty() ? default_name(options.input) : options.name;
  const std::vector<io::NamedTensor> tensors = {{name + ".weight", q.q.view()},
                                                {name + ".weight_scale_inv", q.scale.view()}};
  io::write_safetensors(options.output, tensors,
                        {{"format", "fp8-block"},
                         {"weight_block_size", to_string(block)},
                         {"scale_mode", options.ue8m0 ? "ue8m0" : "fp32"},
                         {"producer", "mxq " + build_info().version}});
  report(options, tensors, non_finite_json(x, found));
}

void add_common(CLI::App* cmd, QuantizeOptions& options) {
  cmd->add_option("input", options.input, "Input .npy array (f32)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("output", options.output, "Output .safetensors file")->required();
  cmd->add_option("--name", options.name, "Tensor name prefix (default: the input file's stem)");
  cmd->add_flag("--strict", options.strict,
                "Refuse an input holding NaN or Inf (by default: a warning with their count and "
                "the first one's index, as one such value makes its whole block NaN)");
  cmd->add_flag("--json", options.json, "Print what was written as JSON");
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto* quantize =
      app.add_subcommand("quantize", "Quantize an f32 .npy array to MXFP4 or block-FP8");
  quantize->require_subcommand(1);
  auto options = std::make_shared<QuantizeOptions>();

  auto* mxfp4 = quantize->add_subcommand(
      "mxfp4",
      "MXFP4: blocks of 32 along the last axis; writes NAME.blocks (U8 [..., K/32, 16], two E2M1 "
      "per byte, low nibble first) and NAME.scales (U8 E8M0 bytes [..., K/32])");
  add_common(mxfp4, *options);
  mxfp4
      ->add_option("--scale-rule", options->scale_rule,
                   "floor (OCP MX: 2^(floor(log2 amax)-2), clamps to +-6) or ceil "
                   "(2^ceil(log2(amax/6)), never clamps)")
      ->check(CLI::IsMember({"floor", "ceil"}))
      ->capture_default_str();
  mxfp4->callback([options] { quantize_mxfp4_command(*options); });

  auto* fp8 = quantize->add_subcommand(
      "fp8-block",
      "Block-FP8 (DeepSeek-V3 layout) of a 2-D [N, K] array: NAME.weight (F8_E4M3 [N, K]) and "
      "NAME.weight_scale_inv (F32 [ceil(N/bn), ceil(K/bk)])");
  add_common(fp8, *options);
  fp8->add_option("--block", options->block, "Block shape NxK, e.g. 128x128 or 64x64")
      ->capture_default_str();
  fp8->add_flag("--ue8m0", options->ue8m0, "Round each scale up to a power of two");
  fp8->callback([options] { quantize_fp8_block_command(*options); });
}

}  // namespace mxq::cli
