// Loading block-FP8 weights: DeepSeek-V3 checkpoint directories (config.json block size,
// sharded with an index, or found by scanning), single files with `weight_block_size` metadata
// (what `mxq quantize fp8-block` writes), and the error contract.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "linear/linear_test_support.h"
#include "mxq/io/safetensors.h"
#include "mxq/linear/weight.h"

namespace mxq::linear {
namespace {

using testing::code_of;
using testing::message_of;
using testing::random_f32;

class Scratch {
 public:
  Scratch() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "mxq-linear-load-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }
  [[nodiscard]] std::string dir() const { return path_.string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
  }

 private:
  std::filesystem::path path_;
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

constexpr const char* kConfig128 =
    R"({"model_type": "deepseek_v3", "quantization_config": {"activation_scheme": "dynamic",
        "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}})";

TEST(LoadWeight, ShardedDeepSeekCheckpoint) {
  const Scratch dir;
  const BlockFp8Weight w = quantize_weight(random_f32(300, 256, 1), BlockShape{128, 128});
  const std::string name = "model.layers.0.self_attn.q_a_proj";
  // The codes and the scales in different shards, as large checkpoints have them.
  io::write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                        {{name + ".weight_scale_inv", w.scale.view()}});
  io::write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                        {{name + ".weight", w.q.view()}});
  dir.write("model.safetensors.index.json",
            R"({"metadata": {}, "weight_map": {")" + name +
                R"(.weight": "model-00002-of-00002.safetensors", ")" + name +
                R"(.weight_scale_inv": "model-00001-of-00002.safetensors"}})");
  dir.write("config.json", kConfig128);

  WeightOrigin origin;
  const BlockFp8Weight loaded = load_weight(dir.dir(), name, &origin);
  EXPECT_EQ(loaded.block, (BlockShape{128, 128}));
  EXPECT_TRUE(same_bytes(loaded.q, w.q));
  EXPECT_TRUE(same_bytes(loaded.scale, w.scale));
  EXPECT_EQ(origin.file, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_NE(origin.block_from.find("config.json"), std::string::npos);
}

TEST(LoadWeight, DirectoryWithoutIndexIsScanned) {
  const Scratch dir;
  const BlockFp8Weight w = quantize_weight(random_f32(64, 96, 2), BlockShape{32, 32});
  io::write_safetensors(dir.file("other.safetensors"), {{"unrelated", w.scale.view()}});
  io::write_safetensors(dir.file("model.safetensors"),
                        {{"proj.weight", w.q.view()}, {"proj.weight_scale_inv", w.scale.view()}});
  dir.write("config.json", R"({"quantization_config": {"weight_block_size": [32, 32]}})");
  const BlockFp8Weight loaded = load_weight(dir.dir(), "proj");
  EXPECT_EQ(loaded.block, (BlockShape{32, 32}));
  EXPECT_TRUE(same_bytes(loaded.q, w.q));
}

TEST(LoadWeight, SingleFileWithBlockMetadata) {
  const Scratch dir;
  const BlockFp8Weight w = quantize_weight(random_f32(100, 200, 3), BlockShape{64, 64});
  io::write_safetensors(dir.file("w.safetensors"),
                        {{"w.weight", w.q.view()}, {"w.weight_scale_inv", w.scale.view()}},
                        {{"format", "fp8-block"}, {"weight_block_size", "64x64"}});
  WeightOrigin origin;
  const BlockFp8Weight loaded = load_weight(dir.file("w.safetensors"), "w", &origin);
  EXPECT_EQ(loaded.block, (BlockShape{64, 64}));
  EXPECT_TRUE(same_bytes(loaded.scale, w.scale));
  EXPECT_NE(origin.block_from.find("metadata weight_block_size"), std::string::npos);
}

TEST(LoadWeight, SingleFileTakesTheBlockFromAConfigBesideIt) {
  const Scratch dir;
  const BlockFp8Weight w = quantize_weight(random_f32(128, 128, 4), BlockShape{128, 128});
  io::write_safetensors(dir.file("shard.safetensors"),
                        {{"a.weight", w.q.view()}, {"a.weight_scale_inv", w.scale.view()}});
  dir.write("config.json", kConfig128);
  EXPECT_EQ(load_weight(dir.file("shard.safetensors"), "a").block, (BlockShape{128, 128}));
}

TEST(LoadWeight, ErrorsNameTheFileTheTensorAndWhatWasFound) {
  const Scratch dir;
  const BlockFp8Weight w = quantize_weight(random_f32(128, 256, 5), BlockShape{128, 128});
  // Scales that belong to 64x64 blocks, declared as 128x128.
  const BlockFp8Weight w64 = quantize_weight(random_f32(128, 256, 5), BlockShape{64, 64});
  io::write_safetensors(dir.file("mismatch.safetensors"),
                        {{"m.weight", w.q.view()}, {"m.weight_scale_inv", w64.scale.view()}},
                        {{"weight_block_size", "128x128"}});
  const std::string mismatch =
      message_of([&] { (void)load_weight(dir.file("mismatch.safetensors"), "m"); });
  EXPECT_NE(mismatch.find("m.weight_scale_inv: expected [1, 2]"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("found [2, 4]"), std::string::npos) << mismatch;
  EXPECT_EQ(code_of([&] { (void)load_weight(dir.file("mismatch.safetensors"), "m"); }),
            ErrorCode::kShapeMismatch);

  // Codes stored as f32 instead of F8_E4M3.
  const Tensor f32 = random_f32(128, 256, 6);
  io::write_safetensors(dir.file("dtype.safetensors"),
                        {{"d.weight", f32.view()}, {"d.weight_scale_inv", w.scale.view()}},
                        {{"weight_block_size", "128x128"}});
  EXPECT_EQ(code_of([&] { (void)load_weight(dir.file("dtype.safetensors"), "d"); }),
            ErrorCode::kDtypeMismatch);

  // No tensor of that name; no block size anywhere; nothing at the path.
  EXPECT_NE(message_of([&] {
              (void)load_weight(dir.file("dtype.safetensors"), "x");
            }).find("no tensor 'x.weight'"),
            std::string::npos);
  const Scratch bare;
  io::write_safetensors(bare.file("bare.safetensors"),
                        {{"b.weight", w.q.view()}, {"b.weight_scale_inv", w.scale.view()}});
  EXPECT_EQ(code_of([&] { (void)load_weight(bare.file("bare.safetensors"), "b"); }),
            ErrorCode::kFormat);
  EXPECT_EQ(code_of([&] { (void)load_weight(bare.file("missing.safetensors"), "b"); }),
            ErrorCode::kIo);

  // A config.json whose block size is not two positive integers.
  const Scratch bad_config;
  io::write_safetensors(bad_config.file("model.safetensors"),
                        {{"c.weight", w.q.view()}, {"c.weight_scale_inv", w.scale.view()}});
  bad_config.write("config.json", R"({"quantization_config": {"weight_block_size": "128x128"}})");
  const std::string config = message_of([&] { (void)load_weight(bad_config.dir(), "c"); });
  EXPECT_NE(config.find("quantization_config.weight_block_size = [bn, bk]"), std::string::npos)
      << config;
}

}  // namespace
}  // namespace mxq::linear
