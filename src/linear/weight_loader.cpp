// Loading block-FP8 weights from DeepSeek-V3 checkpoints and `mxq quantize fp8-block` files.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/io/safetensors.h"
#include "mxq/linear/weight.h"

namespace mxq::linear {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

Json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorCode::kIo, path.string(), ": cannot open");
  try {
    return Json::parse(in);
  } catch (const Json::exception& error) {
    fail(ErrorCode::kFormat, path.string(), ": not valid JSON (", error.what(), ")");
  }
}

// quantization_config.weight_block_size = [bn, bk] in a Hugging Face config.json.
BlockShape block_from_config(const fs::path& config_path) {
  const Json config = read_json(config_path);
  const auto found = [&]() -> std::string {
    if (!config.is_object() || !config.contains("quantization_config")) {
      return "no quantization_config";
    }
    const Json& quant = config["quantization_config"];
    if (!quant.is_object() || !quant.contains("weight_block_size")) {
      return "quantization_config without weight_block_size";
    }
    return "weight_block_size " + quant["weight_block_size"].dump();
  };
  const Json* sizes = nullptr;
  if (config.is_object() && config.contains("quantization_config") &&
      config["quantization_config"].is_object() &&
      config["quantization_config"].contains("weight_block_size")) {
    sizes = &config["quantization_config"]["weight_block_size"];
  }
  if (sizes == nullptr || !sizes->is_array() || sizes->size() != 2 ||
      !(*sizes)[0].is_number_integer() || !(*sizes)[1].is_number_integer() ||
      (*sizes)[0].get<std::int64_t>() < 1 || (*sizes)[1].get<std::int64_t>() < 1) {
    fail_argument(ErrorCode::kFormat, config_path.string(),
                  "quantization_config.weight_block_size = [bn, bk] (positive integers)", found());
  }
  return BlockShape{(*sizes)[0].get<std::int64_t>(), (*sizes)[1].get<std::int64_t>()};
}

// The file of a directory checkpoint that holds `tensor`.
fs::path file_holding(const fs::path& directory, const std::string& tensor) {
  const fs::path index_path = directory / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    const Json index = read_json(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      fail(ErrorCode::kFormat, index_path.string(), ": expected an object with a weight_map");
    }
    const Json& map = index["weight_map"];
    if (!map.contains(tensor) || !map[tensor].is_string()) {
      fail(ErrorCode::kInvalidArgument, index_path.string(), ": weight_map has no tensor '", tensor,
           "'");
    }
    return directory / map[tensor].get<std::string>();
  }
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(directory)) {
    if (item.is_regular_file() && item.path().extension() == ".safetensors") {
      files.push_back(item.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    if (io::SafetensorsFile::open(file.string()).contains(tensor)) return file;
  }
  fail(ErrorCode::kInvalidArgument, directory.string(), ": no .safetensors file holds '", tensor,
       "' (searched ", files.size(), " files; no model.safetensors.index.json)");
}

// An owned host copy of a tensor of the file, checked for dtype and rank.
Tensor read_tensor(const io::SafetensorsFile& file, const std::string& tensor, DType dtype) {
  if (!file.contains(tensor)) {
    fail(ErrorCode::kInvalidArgument, file.path(), ": no tensor '", tensor, "'");
  }
  const TensorView view = file.view(tensor);
  const std::string label = file.path() + ": " + tensor;
  if (view.dtype() != dtype) fail_argument(ErrorCode::kDtypeMismatch, label, dtype, view.dtype());
  require_rank(view, label, 2);
  Tensor owned = Tensor::empty(dtype, view.shape());
  std::memcpy(owned.data(), view.data(), view.nbytes());
  return owned;
}

}  // namespace

BlockFp8Weight load_weight(const std::string& checkpoint, const std::string& name,
                           WeightOrigin* origin) {
  const fs::path path(checkpoint);
  const std::string weight_name = name + ".weight";
  const std::string scale_name = name + ".weight_scale_inv";
  WeightOrigin where;
  BlockShape block;
  fs::path weight_file;
  fs::path scale_file;
  if (fs::is_directory(path)) {
    const fs::path config = path / "config.json";
    if (!fs::exists(config)) {
      fail(ErrorCode::kInvalidArgument, checkpoint,
           ": a checkpoint directory needs config.json with "
           "quantization_config.weight_block_size");
    }
    block = block_from_config(config);
    where.block_from = config.string() + " quantization_config.weight_block_size";
    weight_file = file_holding(path, weight_name);
    scale_file = file_holding(path, scale_name);
  } else if (fs::is_regular_file(path)) {
    weight_file = path;
    scale_file = path;
    const io::SafetensorsFile file = io::SafetensorsFile::open(path.string());
    const auto& metadata = file.metadata();
    if (const auto it = metadata.find("weight_block_size"); it != metadata.end()) {
      block = parse_block_shape(it->second, checkpoint + ": metadata weight_block_size");
      where.block_from = path.string() + " metadata weight_block_size";
    } else if (const fs::path config = path.parent_path() / "config.json"; fs::exists(config)) {
      block = block_from_config(config);
      where.block_from = config.string() + " quantization_config.weight_block_size";
    } else {
      fail(ErrorCode::kFormat, checkpoint,
           ": no block size: expected metadata weight_block_size (e.g. \"128x128\") or a "
           "config.json beside the file");
    }
  } else {
    fail(ErrorCode::kIo, checkpoint, ": no such file or directory");
  }
  where.file = weight_file.string();

  const io::SafetensorsFile weights = io::SafetensorsFile::open(weight_file.string());
  Tensor q = read_tensor(weights, weight_name, DType::kE4M3);
  const io::SafetensorsFile scales =
      scale_file == weight_file ? weights : io::SafetensorsFile::open(scale_file.string());
  Tensor scale = read_tensor(scales, scale_name, DType::kF32);
  const Shape expected{(q.shape()[0] + block.n - 1) / block.n,
                       (q.shape()[1] + block.k - 1) / block.k};
  if (!(scale.shape() == expected)) {
    fail_argument(ErrorCode::kShapeMismatch, scale_file.string() + ": " + scale_name,
                  detail::concat(expected, " for ", weight_name, " ", q.shape(), " in blocks of ",
                                 to_string(block), " (", where.block_from, ")"),
                  scale.shape());
  }
  if (origin != nullptr) *origin = where;
  return make_block_fp8_weight(std::move(q), std::move(scale), block);
}

}  // namespace mxq::linear
