// `mxq linear` end to end through the binary: a `mxq quantize fp8-block` file and a DeepSeek-V3
// style checkpoint directory, --explain / --json, agreement with the library, forced tactics
// that do not apply, and `mxq bench linear` without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_test_support.h"
#include "linear/linear_test_support.h"
#include "mxq/core/build_info.h"
#include "mxq/io/npy.h"
#include "mxq/io/safetensors.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"

namespace mxq::linear {
namespace {

using mxq::testing::run_cli;
using mxq::testing::ScratchDir;

// f32 [rows, cols] with a bf16 round trip already applied, so the CLI's rounding is a no-op.
Tensor input_f32(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  const Tensor bf16 = testing::random_bf16(rows, cols, seed);
  Tensor out = Tensor::empty(DType::kF32, {rows, cols});
  for (std::int64_t i = 0; i < bf16.numel(); ++i) {
    out.data_as<float>()[i] = bf16_to_float(reinterpret_cast<const std::uint16_t*>(bf16.data())[i]);
  }
  return out;
}

Tensor to_bf16(const Tensor& f32) {
  Tensor out = Tensor::empty(DType::kBF16, f32.shape());
  for (std::int64_t i = 0; i < f32.numel(); ++i) {
    reinterpret_cast<std::uint16_t*>(out.data())[i] = float_to_bf16(f32.data_as<float>()[i]);
  }
  return out;
}

TEST(LinearCli, QuantizedFileRunsLikeTheLibrary) {
  const ScratchDir dir("mxq-linear-cli");
  io::write_npy(dir.file("w.npy"), testing::random_f32(200, 384, 1));
  const Tensor x = input_f32(6, 384, 2);
  io::write_npy(dir.file("x.npy"), x);
  const auto q = run_cli(dir, "quantize fp8-block " + dir.file("w.npy") + " " +
                                  dir.file("w.safetensors") + " --name proj --block 64x64");
  ASSERT_EQ(q.exit_code, 0) << q.err;

  const auto run =
      run_cli(dir, "linear --checkpoint " + dir.file("w.safetensors") + " --name proj --input " +
                       dir.file("x.npy") + " --output " + dir.file("y.npy") + " --explain --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["tactic"], "cpu.reference");
  EXPECT_EQ(report["weight"]["block"], "64x64");
  EXPECT_EQ(report["explain"]["chosen"]["tactic"], "cpu.reference");
  EXPECT_FALSE(report["explain"]["not_chosen"].empty());

  const Tensor y = io::read_npy(dir.file("y.npy"));
  ASSERT_EQ(y.shape(), (Shape{6, 200}));
  const BlockFp8Weight w = load_weight(dir.file("w.safetensors"), "proj");
  const Tensor expected = linear(to_bf16(x), w);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    ASSERT_EQ(y.data_as<float>()[i],
              bf16_to_float(reinterpret_cast<const std::uint16_t*>(expected.data())[i]))
        << i;
  }

  // Another CPU tactic by name; human-readable explain lists the rejected tactics.
  const auto blocked =
      run_cli(dir, "linear --checkpoint " + dir.file("w.safetensors") + " --name proj --input " +
                       dir.file("x.npy") + " --output " + dir.file("y2.npy") +
                       " --tactic cpu.blocked_f32.n16 --explain");
  ASSERT_EQ(blocked.exit_code, 0) << blocked.err;
  EXPECT_NE(blocked.out.find("chosen:    cpu.blocked_f32.n16"), std::string::npos) << blocked.out;
  EXPECT_NE(blocked.out.find("cpu.reference: supported, but not requested"), std::string::npos)
      << blocked.out;
}

TEST(LinearCli, DeepSeekDirectoryAndForcedTactics) {
  const ScratchDir dir("mxq-linear-cli-ds");
  const BlockFp8Weight w = quantize_weight(testing::random_f32(256, 256, 3), BlockShape{128, 128});
  io::write_safetensors(dir.file("model.safetensors"),
                        {{"layer.weight", w.q.view()}, {"layer.weight_scale_inv", w.scale.view()}});
  std::ofstream(dir.file("config.json"))
      << R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})";
  io::write_npy(dir.file("x.npy"), input_f32(2, 256, 4));

  const std::string base =
      "linear --checkpoint " + dir.path().string() + " --name layer --input " + dir.file("x.npy");
  const auto ok = run_cli(dir, base + " --output " + dir.file("y.npy"));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(io::read_npy(dir.file("y.npy")).shape(), (Shape{2, 256}));

  // Forcing the fast path on the CPU: an error that says why, and no output file.
  const auto fast = run_cli(dir, base + " --output " + dir.file("fast.npy") + " --tactic fast");
  EXPECT_NE(fast.exit_code, 0);
  EXPECT_NE(fast.err.find("no fast tactic supports"), std::string::npos) << fast.err;
  if (find_tactic("cuda.sm90_wgmma.m128n128") != nullptr) {  // a CUDA build names the reason
    EXPECT_NE(fast.err.find("needs a CUDA device"), std::string::npos) << fast.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("fast.npy")));
  const auto named =
      run_cli(dir, base + " --output " + dir.file("n.npy") + " --tactic cuda.sm90_wgmma.m128n128");
  EXPECT_NE(named.exit_code, 0);
  const auto unknown = run_cli(dir, base + " --output " + dir.file("u.npy") + " --tactic bogus");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("tactic: expected one of"), std::string::npos) << unknown.err;

  // A wrong input width names both shapes.
  io::write_npy(dir.file("bad.npy"), input_f32(2, 100, 5));
  const auto bad =
      run_cli(dir, "linear --checkpoint " + dir.path().string() + " --name layer --input " +
                       dir.file("bad.npy") + " --output " + dir.file("b.npy"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("expected K = 256"), std::string::npos) << bad.err;

  // A device that is not cpu, cuda or cuda:N is refused by name, before any CUDA call.
  for (const char* device : {"cuda:-1", "cuda:1x", "cuda:", "cuda:+1", "gpu"}) {
    const auto r = run_cli(dir, base + " --output " + dir.file("d.npy") + " --device " + device);
    EXPECT_NE(r.exit_code, 0) << device;
    EXPECT_NE(r.err.find("--device: expected cpu, cuda or cuda:N"), std::string::npos)
        << device << ": " << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.npy")));
}

TEST(LinearCli, BenchNeedsAGpu) {
  if (!query_gpus().gpus.empty()) GTEST_SKIP() << "a GPU is visible";
  const ScratchDir dir("mxq-linear-cli-bench");
  const auto bench = run_cli(dir, "bench linear --m 64");
  EXPECT_NE(bench.exit_code, 0);
  EXPECT_NE(bench.err.find("needs a CUDA"), std::string::npos) << bench.err;
}

}  // namespace
}  // namespace mxq::linear
