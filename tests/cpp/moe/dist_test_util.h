// Shared by the distributed MoE tests (moe_dist_gpu_test.cu, moe_dist_multigpu_test.cu): a small
// synthetic layer, value comparison of outputs, running the mxq CLI.
#pragma once

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "moe/moe_test_util.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe::testing {

// E=8, H=128, I=192 (TP=2: 96 per rank, padded to 128), top-2, gpt-oss biases and activation.
inline SyntheticSpec dist_spec() {
  SyntheticSpec spec;
  spec.experts = 8;
  spec.hidden = 128;
  spec.intermediate = 192;
  spec.top_k = 2;
  spec.layers = 1;
  spec.seed = 11;
  return spec;
}

inline MoeLayer load_dist_layer(const std::string& checkpoint_dir, int tp, int ep) {
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(checkpoint_dir);
  ShardOptions shards;
  shards.tp_size = tp;
  shards.ep_size = ep;
  MoeLayer layer = MoeLayer::load(checkpoint, 0, checkpoint.resolve_config(0), shards);
  (void)layer.prepare(kDefaultAlignment);
  return layer;
}

// Elements whose values differ (NaN equals NaN; -0 equals +0: the rank sum's order may flip a
// zero's sign).
inline std::int64_t value_differences(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return -1;
  std::int64_t out = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data_as<float>()[i];
    const float y = b.data_as<float>()[i];
    if (!(x == y || (std::isnan(x) && std::isnan(y)))) ++out;
  }
  return out;
}

// ||a - b||_2 / ||b||_2 over the non-NaN elements.
inline double normalized_difference(const Tensor& a, const Tensor& b) {
  double num = 0.0;
  double den = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i];
    const double y = b.data_as<float>()[i];
    if (std::isnan(x) || std::isnan(y)) continue;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `env_prefix mxq arguments` in a shell; stdout captured, stderr into a file of `dir`.
inline CliResult run_cli(const std::string& env_prefix, const std::string& arguments,
                         const TempDir& dir, const std::string& tag = "cli") {
  const std::string err_file = dir.file(tag + ".stderr");
  const std::string command =
      env_prefix + " " + std::string(MXQ_CLI_PATH) + " " + arguments + " 2>" + err_file;
  CliResult result;
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

}  // namespace mxq::moe::testing
