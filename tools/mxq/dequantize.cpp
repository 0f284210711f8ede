// `mxq dequantize IN.safetensors OUT.npy [--name W]`: the inverse of `mxq quantize` for both
// layouts (MXFP4 NAME.blocks/NAME.scales, block-FP8 NAME.weight/NAME.weight_scale_inv).
#include <cstring>
#include <iostream>
#include <memory>
#include <set>

#include "cli_util.h"
#include "commands.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/formats/mxfp4.h"
#include "mxq/io/npy.h"
#include "mxq/io/safetensors.h"

namespace mxq::cli {
namespace {

struct DequantizeOptions {
  std::string input;
  std::string output;
  std::string name;
  std::string block;
  bool json = false;
};

constexpr std::string_view kMxfp4Suffix = ".blocks";
constexpr std::string_view kFp8Suffix = ".weight_scale_inv";

// Names of the quantized tensor groups in the file (prefixes before the known suffixes).
std::set<std::string> quantized_groups(const io::SafetensorsFile& file) {
  std::set<std::string> groups;
  for (const auto& entry : file.entries()) {
    for (const std::string_view suffix : {kMxfp4Suffix, kFp8Suffix}) {
      if (entry.name.ends_with(suffix)) {
        groups.insert(entry.name.substr(0, entry.name.size() - suffix.size()));
      }
    }
  }
  return groups;
}

std::string pick_name(const io::SafetensorsFile& file, const std::string& requested) {
  const auto groups = quantized_groups(file);
  if (!requested.empty()) {
    if (groups.count(requested) == 0) {
      std::string known;
      for (const auto& g : groups) known += (known.empty() ? "" : ", ") + g;
      fail(ErrorCode::kInvalidArgument, "--name: no quantized tensor '", requested, "' in ",
           file.path(), " (found: ", known.empty() ? "none" : known, ")");
    }
    return requested;
  }
  if (groups.size() != 1) {
    std::string known;
    for (const auto& g : groups) known += (known.empty() ? "" : ", ") + g;
    fail(ErrorCode::kInvalidArgument, file.path(),
         ": expected exactly one quantized tensor, found ", groups.size(),
         known.empty() ? "" : " (" + known + "): choose one with --name");
  }
  return *groups.begin();
}

// Copies a mapped tensor into aligned host memory (safetensors data need not be aligned).
Tensor load(const io::SafetensorsFile& file, const std::string& name) {
  const TensorView view = file.view(name);
  Tensor out = Tensor::empty(view.dtype(), view.shape());
  std::memcpy(out.data(), view.data(), view.nbytes());
  return out;
}

BlockShape fp8_block_of(const io::SafetensorsFile& file, const DequantizeOptions& options,
                        const Shape& q, const Shape& scale) {
  std::string spec = options.block;
  if (spec.empty()) {
    const auto it = file.metadata().find("weight_block_size");
    spec = it != file.metadata().end() ? it->second : "128x128";
  }
  const BlockShape block = parse_block_shape(spec);
  const Shape expected{(q[0] + block.n - 1) / block.n, (q[1] + block.k - 1) / block.k};
  if (!(expected == scale)) {
    fail(ErrorCode::kShapeMismatch, "block ", to_string(block), ": weight ", q,
         " needs scales of shape ", expected, ", found ", scale,
         " (give the block shape with --block)");
  }
  return block;
}

void dequantize_command(const DequantizeOptions& options) {
  require_writable_output(options.output, "output");
  const io::SafetensorsFile file = io::SafetensorsFile::open(options.input);
  const std::string name = pick_name(file, options.name);
  Tensor out;
  std::string layout;
  if (file.contains(name + std::string(kMxfp4Suffix))) {
    if (!options.block.empty()) {
      fail(ErrorCode::kInvalidArgument, "--block: '", name,
           "' is MXFP4 (blocks of 32 along K, no block shape to give); --block is for block-FP8");
    }
    layout = "mxfp4";
    out = dequantize_mxfp4(load(file, name + ".blocks"), load(file, name + ".scales"));
  } else {
    layout = "fp8-block";
    const Tensor q = load(file, name + ".weight");
    const Tensor scale = load(file, name + ".weight_scale_inv");
    require_rank(q, name + ".weight", 2);
    require_rank(scale, name + ".weight_scale_inv", 2);
    out = dequantize_fp8_block(q, scale, fp8_block_of(file, options, q.shape(), scale.shape()));
  }
  io::write_npy(options.output, out);
  if (options.json) {
    print_json({{"input", options.input},
                {"name", name},
                {"layout", layout},
                {"output", options.output},
                {"shape",
                 std::vector<std::int64_t>(out.shape().dims().begin(), out.shape().dims().end())}});
  } else {
    std::cout << options.output << ": " << name << " (" << layout << ") -> f32 " << out.shape()
              << "\n";
  }
}

}  // namespace

void register_dequantize(CLI::App& app) {
  auto options = std::make_shared<DequantizeOptions>();
  auto* cmd = app.add_subcommand(
      "dequantize", "Dequantize an MXFP4 or block-FP8 tensor from a .safetensors file to f32 .npy");
  cmd->add_option("input", options->input, "Input .safetensors file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("output", options->output, "Output .npy file (f32)")->required();
  cmd->add_option("--name", options->name,
                  "Tensor name prefix (default: the only quantized tensor in the file)");
  cmd->add_option("--block", options->block,
                  "Block-FP8 block shape NxK (default: the file's weight_block_size metadata, "
                  "else 128x128)");
  cmd->add_flag("--json", options->json, "Print what was written as JSON");
  cmd->callback([options] { dequantize_command(*options); });
}

}  // namespace mxq::cli
