// Checkpoint loading: de-interleave and sharding on a hand-built checkpoint, both layouts,
// multi-file checkpoints, config resolution, and every load error.
#include "mxq/moe/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moe_test_util.h"
#include "mxq/io/safetensors.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe {
namespace {

using testing::error_of;

constexpr std::int64_t kE = 2;
constexpr std::int64_t kH = 32;
constexpr std::int64_t kI = 64;

// Recognizable contents: every byte says where it came from.
std::uint8_t block_byte(std::int64_t e, std::int64_t row, std::int64_t j) {
  return static_cast<std::uint8_t>((e * 131 + row * 7 + j) & 0xFF);
}
std::uint8_t scale_byte(std::int64_t e, std::int64_t row, std::int64_t j) {
  return static_cast<std::uint8_t>(100 + (e * 13 + row * 3 + j) % 50);
}
std::uint16_t bias_bits(std::int64_t e, std::int64_t i) {
  return static_cast<std::uint16_t>(0x3C00 + e * 300 + i);
}

Tensor u8(const Shape& shape) { return Tensor::empty(DType::kU8, shape); }

struct HandBuilt {
  std::vector<std::pair<std::string, Tensor>> gpt_oss;
  std::vector<std::pair<std::string, Tensor>> native;
};

// The gpt-oss tensors with rows interleaved (row 2c = gate c, row 2c + 1 = up c), and the
// same weights as native per-expert tensors.
HandBuilt hand_built() {
  HandBuilt out;
  const auto name = [](MoeTensorKind kind, std::int64_t e = -1) {
    return format_tensor_name({0, kind, e});
  };
  Tensor router = Tensor::empty(DType::kBF16, {kE, kH});
  Tensor router_bias = Tensor::empty(DType::kBF16, {kE});
  auto* rb = static_cast<std::uint16_t*>(router.data());
  for (std::int64_t i = 0; i < kE * kH; ++i) rb[i] = static_cast<std::uint16_t>(0x3F00 + i);
  static_cast<std::uint16_t*>(router_bias.data())[0] = 0x3F80;
  static_cast<std::uint16_t*>(router_bias.data())[1] = 0xBF80;
  Tensor gu_blocks = u8({kE, 2 * kI, kH / 32, 16});
  Tensor gu_scales = u8({kE, 2 * kI, kH / 32});
  Tensor gu_bias = Tensor::empty(DType::kBF16, {kE, 2 * kI});
  Tensor d_blocks = u8({kE, kH, kI / 32, 16});
  Tensor d_scales = u8({kE, kH, kI / 32});
  Tensor d_bias = Tensor::empty(DType::kBF16, {kE, kH});
  for (std::int64_t e = 0; e < kE; ++e) {
    for (std::int64_t r = 0; r < 2 * kI; ++r) {
      for (std::int64_t j = 0; j < 16; ++j) {
        gu_blocks.data_as<std::uint8_t>()[(e * 2 * kI + r) * 16 + j] = block_byte(e, r, j);
      }
      gu_scales.data_as<std::uint8_t>()[e * 2 * kI + r] = scale_byte(e, r, 0);
      static_cast<std::uint16_t*>(gu_bias.data())[e * 2 * kI + r] = bias_bits(e, r);
    }
    for (std::int64_t h = 0; h < kH; ++h) {
      for (std::int64_t j = 0; j < kI / 2; ++j) {
        d_blocks.data_as<std::uint8_t>()[(e * kH + h) * (kI / 2) + j] = block_byte(e, 1000 + h, j);
      }
      for (std::int64_t j = 0; j < kI / 32; ++j) {
        d_scales.data_as<std::uint8_t>()[(e * kH + h) * (kI / 32) + j] = scale_byte(e, 1000 + h, j);
      }
      static_cast<std::uint16_t*>(d_bias.data())[e * kH + h] = bias_bits(e, 500 + h);
    }
    // Native: gate = even rows, up = odd rows.
    Tensor g_blocks = u8({kI, kH / 32, 16}), up_blocks = u8({kI, kH / 32, 16});
    Tensor g_scales = u8({kI, kH / 32}), up_scales = u8({kI, kH / 32});
    Tensor g_bias = Tensor::empty(DType::kBF16, {kI}), up_bias = Tensor::empty(DType::kBF16, {kI});
    for (std::int64_t c = 0; c < kI; ++c) {
      for (std::int64_t j = 0; j < 16; ++j) {
        g_blocks.data_as<std::uint8_t>()[c * 16 + j] = block_byte(e, 2 * c, j);
        up_blocks.data_as<std::uint8_t>()[c * 16 + j] = block_byte(e, 2 * c + 1, j);
      }
      g_scales.data_as<std::uint8_t>()[c] = scale_byte(e, 2 * c, 0);
      up_scales.data_as<std::uint8_t>()[c] = scale_byte(e, 2 * c + 1, 0);
      static_cast<std::uint16_t*>(g_bias.data())[c] = bias_bits(e, 2 * c);
      static_cast<std::uint16_t*>(up_bias.data())[c] = bias_bits(e, 2 * c + 1);
    }
    Tensor nd_blocks = u8({kH, kI / 32, 16}), nd_scales = u8({kH, kI / 32});
    Tensor nd_bias = Tensor::empty(DType::kBF16, {kH});
    std::memcpy(nd_blocks.data(), d_blocks.data_as<std::uint8_t>() + e * kH * kI / 2,
                nd_blocks.nbytes());
    std::memcpy(nd_scales.data(), d_scales.data_as<std::uint8_t>() + e * kH * kI / 32,
                nd_scales.nbytes());
    std::memcpy(nd_bias.data(), static_cast<std::uint16_t*>(d_bias.data()) + e * kH,
                nd_bias.nbytes());
    out.native.emplace_back(name(MoeTensorKind::kGateBlocks, e), std::move(g_blocks));
    out.native.emplace_back(name(MoeTensorKind::kGateScales, e), std::move(g_scales));
    out.native.emplace_back(name(MoeTensorKind::kGateBias, e), std::move(g_bias));
    out.native.emplace_back(name(MoeTensorKind::kUpBlocks, e), std::move(up_blocks));
    out.native.emplace_back(name(MoeTensorKind::kUpScales, e), std::move(up_scales));
    out.native.emplace_back(name(MoeTensorKind::kUpBias, e), std::move(up_bias));
    out.native.emplace_back(name(MoeTensorKind::kExpertDownBlocks, e), std::move(nd_blocks));
    out.native.emplace_back(name(MoeTensorKind::kExpertDownScales, e), std::move(nd_scales));
    out.native.emplace_back(name(MoeTensorKind::kExpertDownBias, e), std::move(nd_bias));
  }
  Tensor router_copy = Tensor::empty(DType::kBF16, {kE, kH});
  std::memcpy(router_copy.data(), router.data(), router.nbytes());
  Tensor router_bias_copy = Tensor::empty(DType::kBF16, {kE});
  std::memcpy(router_bias_copy.data(), router_bias.data(), router_bias.nbytes());
  out.native.emplace_back(name(MoeTensorKind::kRouterWeight), std::move(router_copy));
  out.native.emplace_back(name(MoeTensorKind::kRouterBias), std::move(router_bias_copy));
  out.gpt_oss.emplace_back(name(MoeTensorKind::kRouterWeight), std::move(router));
  out.gpt_oss.emplace_back(name(MoeTensorKind::kRouterBias), std::move(router_bias));
  out.gpt_oss.emplace_back(name(MoeTensorKind::kGateUpBlocks), std::move(gu_blocks));
  out.gpt_oss.emplace_back(name(MoeTensorKind::kGateUpScales), std::move(gu_scales));
  out.gpt_oss.emplace_back(name(MoeTensorKind::kGateUpBias), std::move(gu_bias));
  out.gpt_oss.emplace_back(name(MoeTensorKind::kDownBlocks), std::move(d_blocks));
  out.gpt_oss.emplace_back(name(MoeTensorKind::kDownScales), std::move(d_scales));
  out.gpt_oss.emplace_back(name(MoeTensorKind::kDownBias), std::move(d_bias));
  return out;
}

void write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
           const std::string& skip = "") {
  std::vector<io::NamedTensor> named;
  for (const auto& [n, t] : tensors) {
    if (n != skip) named.emplace_back(n, t.view());
  }
  io::write_safetensors(path, named);
}

MoeConfigOverrides top1() {
  MoeConfigOverrides overrides;
  overrides.top_k = 1;
  return overrides;
}

TEST(Checkpoint, NamesRoundTrip) {
  for (const MoeTensorName& name : {MoeTensorName{3, MoeTensorKind::kGateUpBlocks, -1},
                                    MoeTensorName{0, MoeTensorKind::kRouterBias, -1},
                                    MoeTensorName{12, MoeTensorKind::kExpertDownScales, 31}}) {
    EXPECT_EQ(parse_tensor_name(format_tensor_name(name)), name);
  }
  EXPECT_EQ(format_tensor_name({5, MoeTensorKind::kGateUpScales, -1}),
            "model.layers.5.mlp.experts.gate_up_proj_scales");
  EXPECT_EQ(format_tensor_name({5, MoeTensorKind::kUpBias, 7}),
            "model.layers.5.mlp.experts.7.up.bias");
  EXPECT_FALSE(parse_tensor_name("model.layers.5.mlp.experts.gate_proj"));
  EXPECT_FALSE(parse_tensor_name("model.layers.x.mlp.router.weight"));
  EXPECT_FALSE(parse_tensor_name("model.layers.05.mlp.router.weight"));
}

TEST(Checkpoint, DeinterleavesGateUpRowsAndShardsAsDocumented) {
  testing::TempDir dir("hand");
  const HandBuilt tensors = hand_built();
  write(dir.file("tiny.safetensors"), tensors.gpt_oss);
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(dir.file("tiny.safetensors"));
  // No config.json: dimensions come from the tensors, top_k must be given.
  EXPECT_NE(error_of([&] { (void)checkpoint.resolve_config(0); }).find("top_k"), std::string::npos);
  const MoeConfig config = checkpoint.resolve_config(0, top1());
  EXPECT_EQ(config.num_experts, kE);
  EXPECT_EQ(config.hidden_size, kH);
  EXPECT_EQ(config.intermediate_size, kI);
  EXPECT_TRUE(config.has_bias);
  EXPECT_EQ(checkpoint.layout(0), CheckpointLayout::kGptOss);

  ShardOptions shards;
  shards.tp_size = 2;  // 32 channels per rank
  const MoeLayer layer = MoeLayer::load(checkpoint, 0, config, shards);
  for (int r = 0; r < 2; ++r) {
    const MoeRankWeights& w = layer.rank(r);
    const auto* w13 = static_cast<const std::uint8_t*>(w.w13().data());
    const auto* s13 = static_cast<const std::uint8_t*>(w.w13_scale().data());
    const auto* b13 = static_cast<const std::uint16_t*>(w.w13_bias().data());
    const auto* w2 = static_cast<const std::uint8_t*>(w.w2().data());
    const auto* s2 = static_cast<const std::uint8_t*>(w.w2_scale().data());
    const auto* b2 = static_cast<const std::uint16_t*>(w.w2_bias().data());
    for (std::int64_t e = 0; e < kE; ++e) {
      for (std::int64_t c = 0; c < 32; ++c) {
        const std::int64_t global = 32 * r + c;
        const std::int64_t gate_row = e * 64 + c;
        const std::int64_t up_row = e * 64 + 32 + c;
        for (std::int64_t j = 0; j < 16; ++j) {
          ASSERT_EQ(w13[gate_row * 16 + j], block_byte(e, 2 * global, j));
          ASSERT_EQ(w13[up_row * 16 + j], block_byte(e, 2 * global + 1, j));
        }
        ASSERT_EQ(s13[gate_row], scale_byte(e, 2 * global, 0));
        ASSERT_EQ(s13[up_row], scale_byte(e, 2 * global + 1, 0));
        ASSERT_EQ(b13[gate_row], bias_bits(e, 2 * global));
        ASSERT_EQ(b13[up_row], bias_bits(e, 2 * global + 1));
      }
      for (std::int64_t h = 0; h < kH; ++h) {
        for (std::int64_t j = 0; j < 16; ++j) {
          ASSERT_EQ(w2[(e * kH + h) * 16 + j], block_byte(e, 1000 + h, 16 * r + j));
        }
        ASSERT_EQ(s2[e * kH + h], scale_byte(e, 1000 + h, r));
        ASSERT_EQ(b2[e * kH + h], r == 0 ? bias_bits(e, 500 + h) : 0);
      }
    }
  }
  // The native layout of the same weights loads to the same layer.
  write(dir.file("native.safetensors"), tensors.native);
  const MoeCheckpoint native = MoeCheckpoint::open(dir.file("native.safetensors"));
  EXPECT_EQ(native.layout(0), CheckpointLayout::kNative);
  EXPECT_EQ(native.resolve_config(0, top1()), config);
  testing::expect_same_weights(layer, MoeLayer::load(native, 0, config, shards));
}

TEST(Checkpoint, BothSyntheticLayoutsLoadToIdenticalLayers) {
  testing::TempDir a("gpt_oss");
  testing::TempDir b("native");
  SyntheticSpec spec = testing::small_spec();
  write_synthetic_checkpoint(a.path(), spec);
  spec.layout = CheckpointLayout::kNative;
  write_synthetic_checkpoint(b.path(), spec);
  const MoeCheckpoint gpt_oss = MoeCheckpoint::open(a.path());
  const MoeCheckpoint native = MoeCheckpoint::open(b.path());
  EXPECT_EQ(gpt_oss.files().size(), 2U);  // one file per layer
  EXPECT_EQ(gpt_oss.layers(), (std::vector<std::int64_t>{0, 1}));
  const MoeConfig config = gpt_oss.resolve_config(1);
  EXPECT_EQ(native.resolve_config(1), config);
  ShardOptions shards;
  shards.tp_size = 2;
  shards.ep_size = 2;
  MoeLayer from_gpt_oss = MoeLayer::load(gpt_oss, 1, config, shards);
  MoeLayer from_native = MoeLayer::load(native, 1, config, shards);
  testing::expect_same_weights(from_gpt_oss, from_native);
  (void)from_gpt_oss.prepare(128);
  (void)from_native.prepare(128);
  testing::expect_same_weights(from_gpt_oss, from_native);
}

TEST(Checkpoint, SyntheticCheckpointsAreDeterministic) {
  testing::TempDir a("one");
  testing::TempDir b("two");
  write_synthetic_checkpoint(a.path(), testing::small_spec(5));
  ::setenv("MXQ_NUM_THREADS", "1", 1);  // thread count must not matter
  write_synthetic_checkpoint(b.path(), testing::small_spec(5));
  ::unsetenv("MXQ_NUM_THREADS");
  for (const char* file : {"layer-00000.safetensors", "layer-00001.safetensors", "config.json"}) {
    std::ifstream fa(a.file(file), std::ios::binary);
    std::ifstream fb(b.file(file), std::ios::binary);
    const std::string ca((std::istreambuf_iterator<char>(fa)), std::istreambuf_iterator<char>());
    const std::string cb((std::istreambuf_iterator<char>(fb)), std::istreambuf_iterator<char>());
    EXPECT_FALSE(ca.empty());
    EXPECT_EQ(ca, cb) << file;
  }
  testing::TempDir c("other_seed");
  write_synthetic_checkpoint(c.path(), testing::small_spec(6));
  std::ifstream fa(a.file("layer-00000.safetensors"), std::ios::binary);
  std::ifstream fc(c.file("layer-00000.safetensors"), std::ios::binary);
  const std::string ca((std::istreambuf_iterator<char>(fa)), std::istreambuf_iterator<char>());
  const std::string cc((std::istreambuf_iterator<char>(fc)), std::istreambuf_iterator<char>());
  EXPECT_NE(ca, cc);
}

TEST(CheckpointErrors, MissingTensorWrongShapeOrDtype) {
  testing::TempDir dir("errors");
  HandBuilt tensors = hand_built();
  const MoeConfig config = [&] {
    write(dir.file("ok.safetensors"), tensors.gpt_oss);
    return MoeCheckpoint::open(dir.file("ok.safetensors")).resolve_config(0, top1());
  }();
  const std::string missing = format_tensor_name({0, MoeTensorKind::kDownScales, -1});
  write(dir.file("missing.safetensors"), tensors.gpt_oss, missing);
  const MoeCheckpoint without = MoeCheckpoint::open(dir.file("missing.safetensors"));
  std::string message = error_of([&] { (void)MoeLayer::load(without, 0, config); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(message.find("missing"), std::string::npos) << message;

  // Wrong shape: down_proj_bias [E, H + 32].
  for (auto& [name, tensor] : tensors.gpt_oss) {
    if (name == format_tensor_name({0, MoeTensorKind::kDownBias, -1})) {
      tensor = Tensor::zeros(DType::kBF16, {kE, kH + 32});
    }
  }
  write(dir.file("shape.safetensors"), tensors.gpt_oss);
  message = error_of(
      [&] { (void)MoeLayer::load(MoeCheckpoint::open(dir.file("shape.safetensors")), 0, config); });
  EXPECT_NE(message.find("down_proj_bias: expected shape [2, 32], found shape [2, 64]"),
            std::string::npos)
      << message;

  // Wrong dtype: gate_up_proj_bias as f32.
  tensors = hand_built();
  for (auto& [name, tensor] : tensors.gpt_oss) {
    if (name == format_tensor_name({0, MoeTensorKind::kGateUpBias, -1})) {
      tensor = Tensor::zeros(DType::kF32, {kE, 2 * kI});
    }
  }
  write(dir.file("dtype.safetensors"), tensors.gpt_oss);
  try {
    (void)MoeLayer::load(MoeCheckpoint::open(dir.file("dtype.safetensors")), 0, config);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kDtypeMismatch);
    EXPECT_NE(std::string(error.what()).find("gate_up_proj_bias: expected dtype bf16"),
              std::string::npos)
        << error.what();
  }
}

TEST(CheckpointErrors, TruncatedFileLayerOutOfRangeAndDuplicates) {
  testing::TempDir dir("files");
  write_synthetic_checkpoint(dir.path(), testing::small_spec());
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(dir.path());
  try {
    (void)checkpoint.layout(2);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(error.what()).find("0..1"), std::string::npos) << error.what();
  }
  const MoeConfig config = checkpoint.resolve_config(0);
  EXPECT_THROW((void)MoeLayer::load(checkpoint, 5, config), Error);
  EXPECT_THROW((void)MoeLayer::load(checkpoint, -1, config), Error);

  // Truncated: the header promises more data than the file holds.
  testing::TempDir cut("cut");
  const std::string file = cut.file("layer-00000.safetensors");
  std::filesystem::copy_file(dir.file("layer-00000.safetensors"), file);
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  try {
    (void)MoeCheckpoint::open(cut.path());
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kFormat) << error.what();
  }

  // The same tensor in two files.
  testing::TempDir twice("twice");
  std::filesystem::copy_file(dir.file("layer-00000.safetensors"), twice.file("a.safetensors"));
  std::filesystem::copy_file(dir.file("layer-00000.safetensors"), twice.file("b.safetensors"));
  EXPECT_NE(error_of([&] { (void)MoeCheckpoint::open(twice.path()); }).find("appears in both"),
            std::string::npos);
  EXPECT_THROW((void)MoeCheckpoint::open(dir.file("nothing-here")), Error);
}

TEST(CheckpointErrors, ConfigJsonThatDisagreesWithTheTensorsIsAShapeError) {
  testing::TempDir dir("disagree");
  write_synthetic_checkpoint(dir.path(), testing::small_spec());
  MoeConfigOverrides overrides;
  overrides.intermediate_size = 128;  // the tensors hold 96
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(dir.path());
  const MoeConfig config = checkpoint.resolve_config(0, overrides);
  try {
    (void)MoeLayer::load(checkpoint, 0, config);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kShapeMismatch) << error.what();
  }
}

}  // namespace
}  // namespace mxq::moe
