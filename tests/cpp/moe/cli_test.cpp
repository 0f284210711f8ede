// The `mxq synth`, `mxq moe` and `mxq run` commands, run as a user would.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include "mxq/core/build_info.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "moe_test_util.h"
#include "mxq/io/npy.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe {
namespace {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

CommandResult run(const std::string& arguments, const testing::TempDir& dir) {
  const std::string err_file = dir.file("stderr.txt");
  const std::string command = std::string(MXQ_CLI_PATH) + " " + arguments + " 2>" + err_file;
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  result.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return result;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Cli, SynthWritesTheLibrarysCheckpoint) {
  testing::TempDir dir("synth");
  const CommandResult result =
      run("synth gpt-oss " + dir.file("cli") +
              " --experts 6 --hidden 64 --intermediate 96 --top-k 2 --layers 2 --seed 7 "
              "--layout native",
          dir);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  SyntheticSpec spec = testing::small_spec(7);
  spec.layout = CheckpointLayout::kNative;
  write_synthetic_checkpoint(dir.file("lib"), spec);
  for (const char* file : {"config.json", "layer-00000.safetensors", "layer-00001.safetensors"}) {
    EXPECT_EQ(read_file(dir.file("cli/") + file), read_file(dir.file("lib/") + file)) << file;
  }
  EXPECT_NE(run("synth llama " + dir.file("x"), dir).exit_code, 0);
}

TEST(Cli, SynthChecksItsFlagsAndNeverMixesCheckpoints) {
  testing::TempDir dir("synth-checks");
  const std::string shape = " --experts 4 --hidden 64 --intermediate 64";
  const std::string small = shape + " --top-k 2";
  // Bad values are named by flag, and nothing is created.
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {" --top-k 2 --seed -1", "--seed: expected an integer in 0 .. 2^64 - 1, found '-1'"},
           {" --top-k 2 --seed 18446744073709551616", "--seed: expected an integer"},
           {" --top-k 2 --layers 0", "--layers: expected >= 1"},
           {" --top-k 5", "--top-k: expected 1 .. --experts (4)"}}) {
    const CommandResult r = run("synth gpt-oss " + dir.file("bad") + shape + flags, dir);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("bad"))) << flags;
  }
  // A directory holding a checkpoint is refused; --force replaces it without stale layers.
  ASSERT_EQ(run("synth gpt-oss " + dir.file("ckpt") + small + " --layers 2", dir).exit_code, 0);
  const CommandResult again = run("synth gpt-oss " + dir.file("ckpt") + small, dir);
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.err.find("is not empty"), std::string::npos) << again.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("ckpt/layer-00001.safetensors")));
  ASSERT_EQ(run("synth gpt-oss " + dir.file("ckpt") + small + " --force", dir).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(dir.file("ckpt/layer-00000.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("ckpt/layer-00001.safetensors")));
  // --force never deletes files synth did not write.
  std::ofstream(dir.file("ckpt/notes.txt")) << "keep";
  EXPECT_NE(run("synth gpt-oss " + dir.file("ckpt") + small + " --force", dir).exit_code, 0);
  EXPECT_EQ(read_file(dir.file("ckpt/notes.txt")), "keep");
}

TEST(Cli, MoeRunsTheLayerAndReportsShapesBeforeAndAfterPadding) {
  testing::TempDir dir("moe");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::small_spec());
  const Tensor x = synthetic_tokens(5, 64, 9);
  io::write_npy(dir.file("x.npy"), x);
  const CommandResult result =
      run("moe --checkpoint " + dir.file("ckpt") + " --layer 1 --input " + dir.file("x.npy") +
              " --output " + dir.file("y.npy") + " --tp 2 --ep 2 --json",
          dir);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["ranks"].size(), 4U);
  EXPECT_EQ(report["intermediate_size_per_partition"], 64);
  EXPECT_EQ(report["intermediate_size_per_partition_after_pad"], 128);
  EXPECT_NEAR(report["wasted_fraction"].get<double>(), 1.0 - 96.0 / 256.0, 1e-12);
  EXPECT_EQ(report["ranks"][1]["before"]["w13"], nlohmann::json({3, 128, 32}));
  EXPECT_EQ(report["ranks"][1]["after"]["w13"], nlohmann::json({3, 256, 32}));
  EXPECT_EQ(report["ranks"][3]["after"]["w2_scale"], nlohmann::json({3, 64, 4}));
  EXPECT_EQ(report["layout"], "gpt-oss");
  EXPECT_TRUE(report["timings"].contains("forward_seconds"));
  EXPECT_NE(result.err.find("MoE padding"), std::string::npos);  // the one warning

  // The written output is the library's forward pass.
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(dir.file("ckpt"));
  ShardOptions shards;
  shards.tp_size = 2;
  shards.ep_size = 2;
  MoeLayer layer = MoeLayer::load(checkpoint, 1, checkpoint.resolve_config(1), shards);
  (void)layer.prepare(128);
  EXPECT_TRUE(testing::same_bits(io::read_npy(dir.file("y.npy")), layer.forward(x).output));

  // No padding with --align 0; the human summary.
  const CommandResult plain =
      run("moe --checkpoint " + dir.file("ckpt") + " --input " + dir.file("x.npy") + " --output " +
              dir.file("z.npy") + " --tp 2 --align 0",
          dir);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("I_rank 64 -> 64"), std::string::npos) << plain.out;

  // W4A8: the report says so and the output is the library's fp8_g128 forward.
  const CommandResult w4a8 =
      run("moe --checkpoint " + dir.file("ckpt") + " --layer 1 --input " + dir.file("x.npy") +
              " --output " + dir.file("q.npy") + " --activation-quant fp8_g128 --json",
          dir);
  ASSERT_EQ(w4a8.exit_code, 0) << w4a8.err;
  EXPECT_EQ(nlohmann::json::parse(w4a8.out)["config"]["activation_quant"], "fp8_g128");
  MoeConfigOverrides fp8;
  fp8.activation_quant = ActivationQuant::kFp8Group128;
  MoeLayer fp8_layer = MoeLayer::load(checkpoint, 1, checkpoint.resolve_config(1, fp8), {});
  (void)fp8_layer.prepare(128);
  const Tensor fp8_out = fp8_layer.forward(x).output;
  EXPECT_TRUE(testing::same_bits(io::read_npy(dir.file("q.npy")), fp8_out));
  MoeLayer bf16_layer = MoeLayer::load(checkpoint, 1, checkpoint.resolve_config(1), {});
  (void)bf16_layer.prepare(128);
  EXPECT_FALSE(testing::same_bits(bf16_layer.forward(x).output, fp8_out));
}

TEST(Cli, MoeErrorsAreClearAndNonZero) {
  testing::TempDir dir("errors");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::small_spec());
  io::write_npy(dir.file("x.npy"), synthetic_tokens(2, 64, 1));
  const std::string base = "moe --checkpoint " + dir.file("ckpt") + " --input " +
                           dir.file("x.npy") + " --output " + dir.file("y.npy");
  // --device cuda: runs where a GPU is visible, else fails up front saying why.
  const bool has_gpu = !query_gpus().gpus.empty();
  CommandResult result = run(base + " --device cuda --json", dir);
  if (has_gpu) {
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find("cuda.moe"), std::string::npos) << result.out;
  } else {
    EXPECT_NE(result.exit_code, 0);
    EXPECT_NE(result.err.find("--device cuda"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("padding"), std::string::npos) << "fails before loading anything";
  }
  result = run(base + " --layer 7", dir);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.err.find("layer"), std::string::npos) << result.err;
  result = run(base + " --align 48", dir);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.err.find("alignment"), std::string::npos) << result.err;
  io::write_npy(dir.file("bad.npy"), synthetic_tokens(2, 32, 1));
  result = run("moe --checkpoint " + dir.file("ckpt") + " --input " + dir.file("bad.npy") +
                   " --output " + dir.file("y.npy"),
               dir);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.err.find("--input: expected an array [T, 64]"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("padding"), std::string::npos) << "fails before loading the layer";
  // An output that cannot be written fails before the layer is loaded, and writes nothing.
  for (const std::string& output : {dir.file("missing/y.npy"), dir.file("ckpt")}) {
    result = run("moe --checkpoint " + dir.file("ckpt") + " --input " + dir.file("x.npy") +
                     " --output " + output,
                 dir);
    EXPECT_NE(result.exit_code, 0) << output;
    EXPECT_NE(result.err.find("--output"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("padding"), std::string::npos) << "fails before loading the layer";
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("missing")));
  if (!has_gpu) {
    result = run("run --device cuda", dir);
    EXPECT_NE(result.exit_code, 0);
    EXPECT_NE(result.err.find("--device cuda"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("checkpoint"), std::string::npos) << "fails before loading";
  }
}

// `mxq bench moe` without a GPU (or CUDA build) fails at once and says why; its options are
// checked before that.
TEST(Cli, BenchMoeNeedsAGpuAndChecksItsOptions) {
  testing::TempDir dir("bench");
  CommandResult result = run("bench moe --preset gpt-oss-7b", dir);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.err.find("gpt-oss-7b"), std::string::npos) << result.err;
  result = run("bench moe --help", dir);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  for (const char* option : {"--tokens", "--tp", "--no-baseline", "--default-only", "--cold-l2",
                             "--block-trace", "--json"})
    EXPECT_NE(result.out.find(option), std::string::npos) << option;
#if MXQ_WITH_CUDA
  if (!gpu::moe_block_trace_enabled()) {  // refused before any work, GPU or not
    const std::string trace = dir.file("trace.json");
    result = run("bench moe --tokens 1 --block-trace " + trace, dir);
    EXPECT_NE(result.exit_code, 0);
    EXPECT_NE(result.err.find("MXQ_MOE_BLOCK_TRACE"), std::string::npos) << result.err;
    EXPECT_FALSE(std::filesystem::exists(trace));
  }
#endif
  if (!query_gpus().gpus.empty()) return;
  result = run("bench moe --tokens 1 --default-only --json", dir);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.err.find("needs a CUDA"), std::string::npos) << result.err;
  EXPECT_TRUE(result.out.empty()) << result.out;
}

}  // namespace
}  // namespace mxq::moe
