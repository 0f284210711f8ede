// `mxq quantize` / `mxq dequantize` end to end through the binary: layouts, round trips against
// the library's own codecs, and the error contract (non-zero exit, one line on stderr, nothing
// written).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/formats/mxfp4.h"
#include "mxq/io/npy.h"
#include "mxq/io/safetensors.h"

namespace mxq {
namespace {

using testing::run_cli;
using testing::ScratchDir;

Tensor ramp(Shape shape, float step) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  float* p = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    p[i] = std::sin(static_cast<float>(i) * step) * (1.0F + static_cast<float>(i % 7));
  }
  return t;
}

Tensor load(const io::SafetensorsFile& file, const std::string& name) {
  const TensorView view = file.view(name);
  Tensor out = Tensor::empty(view.dtype(), view.shape());
  std::memcpy(out.data(), view.data(), view.nbytes());
  return out;
}

void expect_same_floats(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data_as<float>()[i];
    const float y = b.data_as<float>()[i];
    ASSERT_TRUE((std::isnan(x) && std::isnan(y)) || x == y)
        << "element " << i << ": " << x << " vs " << y;
  }
}

TEST(QuantizeCli, Mxfp4LayoutAndRoundTrip) {
  const ScratchDir dir("mxq-cli-mxfp4");
  const Tensor x = ramp({3, 2, 64}, 0.37F);
  io::write_npy(dir.file("x.npy"), x);
  const auto q = run_cli(dir, "quantize mxfp4 " + dir.file("x.npy") + " " +
                                  dir.file("w.safetensors") + " --name W --scale-rule ceil");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  const auto file = io::SafetensorsFile::open(dir.file("w.safetensors"));
  EXPECT_EQ(file.entry("W.blocks").dtype, DType::kU8);
  EXPECT_EQ(file.entry("W.blocks").shape, (Shape{3, 2, 2, 16}));
  EXPECT_EQ(file.entry("W.scales").dtype, DType::kU8);
  EXPECT_EQ(file.entry("W.scales").shape, (Shape{3, 2, 2}));
  EXPECT_EQ(file.metadata().at("scale_rule"), "ceil");

  // Same bytes as the library quantizer with the same rule.
  const Mxfp4Tensor expected = quantize_mxfp4(x, ScaleRule::kCeil);
  const Tensor blocks = load(file, "W.blocks");
  const Tensor scales = load(file, "W.scales");
  EXPECT_EQ(std::memcmp(blocks.data(), expected.blocks.data(), blocks.nbytes()), 0);
  EXPECT_EQ(std::memcmp(scales.data(), expected.scales.data(), scales.nbytes()), 0);

  const auto d = run_cli(dir, "dequantize " + dir.file("w.safetensors") + " " + dir.file("y.npy"));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  expect_same_floats(io::read_npy(dir.file("y.npy")), dequantize_mxfp4(blocks, scales));
  // --block means nothing for MXFP4: refused, not ignored.
  const auto b = run_cli(
      dir, "dequantize " + dir.file("w.safetensors") + " " + dir.file("b.npy") + " --block 32x32");
  EXPECT_NE(b.exit_code, 0);
  EXPECT_NE(b.err.find("--block"), std::string::npos) << b.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("b.npy")));
}

TEST(QuantizeCli, Fp8BlockLayoutRoundTripAndBlockFromMetadata) {
  const ScratchDir dir("mxq-cli-fp8");
  const Tensor x = ramp({100, 72}, 0.11F);  // ragged against 64x32 blocks
  io::write_npy(dir.file("w.npy"), x);
  const auto q = run_cli(dir, "quantize fp8-block " + dir.file("w.npy") + " " +
                                  dir.file("w.safetensors") + " --block 64x32 --json");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  EXPECT_NE(q.out.find("\"w.weight_scale_inv\""), std::string::npos) << q.out;
  const auto file = io::SafetensorsFile::open(dir.file("w.safetensors"));
  EXPECT_EQ(file.entry("w.weight").dtype, DType::kE4M3);
  EXPECT_EQ(file.entry("w.weight").shape, (Shape{100, 72}));
  EXPECT_EQ(file.entry("w.weight_scale_inv").dtype, DType::kF32);
  EXPECT_EQ(file.entry("w.weight_scale_inv").shape, (Shape{2, 3}));

  const auto d = run_cli(dir, "dequantize " + dir.file("w.safetensors") + " " + dir.file("y.npy"));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const Fp8BlockTensor expected = quantize_fp8_block(x, BlockShape{64, 32});
  expect_same_floats(io::read_npy(dir.file("y.npy")),
                     dequantize_fp8_block(expected.q, expected.scale, BlockShape{64, 32}));
}

struct ErrorCase {
  std::string args;
  std::string expected_in_message;
};

TEST(QuantizeCli, ErrorsExitNonZeroWithOneLineAndWriteNothing) {
  const ScratchDir dir("mxq-cli-errors");
  io::write_npy(dir.file("k48.npy"), ramp({2, 48}, 0.1F));
  io::write_npy(dir.file("rank3.npy"), ramp({2, 2, 32}, 0.1F));
  io::write_npy(dir.file("ok.npy"), ramp({4, 32}, 0.1F));
  Tensor ints = Tensor::zeros(DType::kI32, {4, 32});
  io::write_npy(dir.file("ints.npy"), ints);
  const std::string out = dir.file("out.safetensors");
  const ErrorCase cases[] = {
      {"quantize mxfp4 " + dir.file("missing.npy") + " " + out, "missing.npy"},
      {"quantize mxfp4 " + dir.file("k48.npy") + " " + out, "multiple of 32"},
      {"quantize fp8-block " + dir.file("rank3.npy") + " " + out, "2-D"},
      {"quantize fp8-block " + dir.file("ok.npy") + " " + out + " --block 128by128", "128by128"},
      {"quantize fp8-block " + dir.file("ok.npy") + " " + out + " --block 0x128", "0x128"},
      {"quantize mxfp4 " + dir.file("ints.npy") + " " + out, "f32"},
      {"quantize mxfp4 " + dir.file("ok.npy") + " " + out + " --scale-rule round", "round"},
  };
  for (const auto& c : cases) {
    const auto r = run_cli(dir, c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.expected_in_message), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.args;
  }
  const auto mxq_error = run_cli(dir, "quantize mxfp4 " + dir.file("k48.npy") + " " + out);
  EXPECT_EQ(std::count(mxq_error.err.begin(), mxq_error.err.end(), '\n'), 1) << mxq_error.err;
  EXPECT_EQ(mxq_error.err.rfind("mxq: error: ", 0), 0U) << mxq_error.err;

  // Dequantize: unknown name, then a file that is not safetensors.
  ASSERT_EQ(run_cli(dir, "quantize mxfp4 " + dir.file("ok.npy") + " " + out).exit_code, 0);
  const auto bad_name =
      run_cli(dir, "dequantize " + out + " " + dir.file("y.npy") + " --name nope");
  EXPECT_NE(bad_name.exit_code, 0);
  EXPECT_NE(bad_name.err.find("nope"), std::string::npos) << bad_name.err;
  const auto not_st = run_cli(dir, "dequantize " + dir.file("ok.npy") + " " + dir.file("y.npy"));
  EXPECT_NE(not_st.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.file("y.npy")));
}

// NaN and Inf are not silent: each makes its whole block NaN, so quantize warns with their count,
// the first one's index and the blocks they spoil, and --strict refuses the input.
TEST(QuantizeCli, NonFiniteInputsAreWarnedAboutOrRefusedWithStrict) {
  const ScratchDir dir("mxq-cli-nonfinite");
  Tensor x = ramp({4, 256}, 0.01F);
  float* p = x.data_as<float>();
  p[1 * 256 + 37] = std::numeric_limits<float>::quiet_NaN();   // block (1, 1) of 32; (0, 0) of 128
  p[1 * 256 + 40] = -std::numeric_limits<float>::quiet_NaN();  // the same blocks
  p[3 * 256 + 200] = std::numeric_limits<float>::infinity();   // block (3, 6); (1, 1) of 2x128
  io::write_npy(dir.file("x.npy"), x);
  io::write_npy(dir.file("finite.npy"), ramp({4, 256}, 0.01F));
  const std::string out = dir.file("w.safetensors");
  struct Case {
    std::string command;
    std::string blocks;  // the blocks spoiled, of how many
  };
  for (const Case& c : {Case{"quantize mxfp4", "2 of 32 blocks (32 values along the last axis)"},
                        Case{"quantize fp8-block --block 2x128", "2 of 4 blocks (2x128 values)"}}) {
    SCOPED_TRACE(c.command);
    auto r = run_cli(dir, c.command + " " + dir.file("x.npy") + " " + out + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(dir.file("x.npy") +
                         ": 3 non-finite value(s) (2 NaN, 1 Inf), the first "
                         "at index [1, 37]; " +
                         c.blocks),
              std::string::npos)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    const nlohmann::json report = nlohmann::json::parse(r.out);
    EXPECT_EQ(report["non_finite"]["nan"], 2);
    EXPECT_EQ(report["non_finite"]["inf"], 1);
    EXPECT_EQ(report["non_finite"]["first_index"], nlohmann::json({1, 37}));
    EXPECT_EQ(report["non_finite"]["blocks"], 2);
    EXPECT_TRUE(std::filesystem::exists(out));
    std::filesystem::remove(out);
    // --strict: an error naming the input, and nothing written.
    r = run_cli(dir, c.command + " " + dir.file("x.npy") + " " + out + " --strict");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("mxq: error: " + dir.file("x.npy") +
                              ": expected finite values (--strict), found 3 non-finite value(s)",
                          0),
              0U)
        << r.err;
    EXPECT_FALSE(std::filesystem::exists(out));
    // A finite input: no warning, with or without --strict.
    r = run_cli(dir, c.command + " " + dir.file("finite.npy") + " " + out + " --strict");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    std::filesystem::remove(out);
  }
}

}  // namespace
}  // namespace mxq
