// `mxq run`: the main job. A synthetic gpt-oss-20b-shaped MoE layer (E=32, H=I=2880, top-4),
// generated once into the cache directory, runs a batch of tokens split over TP ranks with the
// per-rank intermediate size padded to 128 (TP=2: 1440 -> 1536); the result is checked against
// an independent unpadded TP=1 run of the same layer. On the GPU the autotuner's cache of the
// gpt-oss-20b deployment at this TP (`mxq tune --preset gpt-oss-20b --tp N --device cuda`, or
// MXQ_AUTOTUNE_CACHE) picks the GEMM variant when MXQ_AUTOTUNE is load (the default) or tune.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <vector>

#include "autotune_cli.h"
#include "cli_util.h"
#include "commands.h"
#include "interrupt.h"
#include "launch.h"
#include "moe_gpu.h"
#include "moe_report.h"
#include "mxq/core/env.h"
#include "mxq/core/error.h"
#include "mxq/core/memory.h"
#include "mxq/moe/compare.h"
#include "mxq/moe/footprint.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"

namespace mxq::cli {
namespace {

struct RunOptions {
  std::string device = "cpu";
  int tp = 2;
  std::int64_t tokens = 16;
  bool json = false;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void progress(std::string_view line) { std::cerr << "mxq run: " << line << std::endl; }

// --tp and --tokens against the layer and the machine, before the checkpoint is synthesized: the
// TP layer padded to 128 and the TP=1 reference are held together, and the reference's forward
// (the wider one) runs while the TP run's output, accumulator and magnitude and the input live.
void check_sizes(const RunOptions& options, const moe::MoeConfig& config) {
  moe::SizeArgumentNames names{"--tp", "--tp", "--tp", "--tp", "--tokens"};
  const moe::ShardOptions shards{options.tp, 1, 0};
  moe::check_layer_request(config, shards, moe::kDefaultAlignment, names);
  const std::uint64_t layers =
      saturating_add(moe::layer_host_bytes(config, shards, moe::kDefaultAlignment),
                     moe::layer_host_bytes(config, moe::ShardOptions{}, 0));
  const std::uint64_t kept = saturating_mul(static_cast<std::uint64_t>(options.tokens),
                                            16 * static_cast<std::uint64_t>(config.hidden_size));
  const std::int64_t width = moe::tp_shard(config.intermediate_size, options.tp, 0).width;
  moe::check_forward_request(
      config,
      std::max(config.intermediate_size, moe::padded_intermediate(width, moe::kDefaultAlignment)),
      options.tokens, saturating_add(layers, kept), names);
}

void run_main(const RunOptions& options) {
  if (options.device == "cuda") require_gpu_for_device_cuda();
  if (options.tp < 1) fail_argument(ErrorCode::kInvalidArgument, "--tp", ">= 1", options.tp);
  if (options.tokens < 1) {
    fail_argument(ErrorCode::kInvalidArgument, "--tokens", ">= 1", options.tokens);
  }
  const auto start = std::chrono::steady_clock::now();
  const moe::SyntheticSpec spec;  // E=32, H=I=2880, top-4, one layer, seed 0
  check_sizes(options, moe::synthetic_config(spec));
  progress("checkpoint: " + cache_dir() + "/synth/" + moe::synthetic_checkpoint_name(spec));
  std::string path;
  {
    // Ctrl-C or SIGTERM while the checkpoint is synthesized removes its temporary folder.
    const InterruptScope interrupts;
    path = moe::ensure_synthetic_checkpoint(spec, cache_dir(), progress,
                                            [&interrupts] { interrupts.poll(); });
  }
  const double synth_seconds = seconds_since(start);
  const bool on_gpu = options.device == "cuda";
  // After the checkpoint exists, so that spawned ranks only read it.
  const RankSetup group = launch_ranks("run", options.tp, on_gpu);
  if (group.spawned()) return;  // rank 0 printed the result
  const moe::MoeCheckpoint checkpoint = moe::MoeCheckpoint::open(path);
  const moe::MoeConfig config = checkpoint.resolve_config(0);
  const std::string sizes =
      "--tp " + std::to_string(options.tp) + " --tokens " + std::to_string(options.tokens);
  const Tensor x = naming_allocation_failures(
      sizes, [&] { return moe::synthetic_tokens(options.tokens, config.hidden_size, 1); });

  // The run under test: TP ranks, padded to the kernel alignment. In one process every rank is
  // loaded (MoeLayer); one rank per process reads and prepares only its own on its GPU
  // (run_moe_distributed) and describes the others from the shapes they hold.
  moe::ShardOptions shards;
  shards.tp_size = options.tp;
  std::optional<moe::MoeLayer> layer;
  std::vector<moe::MoeRankShape> before_shapes;
  std::vector<moe::MoeRankShape> after_shapes;
  double load_seconds = 0.0;
  if (group.joined()) {
    before_shapes = moe::layer_rank_shapes(config, shards, 0);
    after_shapes = moe::layer_rank_shapes(config, shards, moe::kDefaultAlignment);
  } else {
    progress("loading TP=" + std::to_string(options.tp) + " and padding to 128");
    const auto phase = std::chrono::steady_clock::now();
    layer = naming_allocation_failures(
        sizes, [&] { return moe::MoeLayer::load(checkpoint, 0, config, shards); });
    before_shapes = rank_shapes(*layer);
    naming_allocation_failures(sizes, [&] { (void)layer->prepare(moe::kDefaultAlignment); });
    after_shapes = rank_shapes(*layer);
    load_seconds = seconds_since(phase);
  }
  const nlohmann::json before = rank_shapes_json(before_shapes);
  const moe::PaddingSummary padding = padding_summary(config, options.tp, after_shapes.front());
  progress("forward: " + std::to_string(options.tokens) + " tokens on " + options.device);
  const std::clock_t cpu_start = std::clock();  // process CPU time: all threads together
  GpuMoeRun gpu_run;
  ServingTuner serving;
  moe::MoeForwardResult result;
  if (on_gpu) {
    // The deployment this layer belongs to: its cache file is what `mxq tune` wrote for it.
    serving = serving_tuner(tune::Backend::kCuda,
                            preset_deployment("gpt-oss-20b", {options.tp, 1}, tune::Backend::kCuda),
                            group.rank.local_rank, group.joined() ? group.comm.get() : nullptr);
    progress("autotune: " + serving.note);
    if (group.joined()) {
      progress("rank " + std::to_string(group.rank.rank) + ": reading and padding its part of TP=" +
               std::to_string(options.tp) + " on its GPU");
      const DistributedMoeLayer part{&checkpoint, 0, {}, options.tp, 1, moe::kDefaultAlignment};
      gpu_run =
          run_moe_distributed(part, x, *group.comm, group.rank.local_rank, serving.tuner.get());
      load_seconds = gpu_run.setup_seconds;  // this rank's read and its preparation on the GPU
    } else {
      gpu_run = run_moe_on_gpu(*layer, x, serving.tuner.get());
    }
    result.output = gpu_run.output;
    result.total_seconds = gpu_run.forward_ms * 1e-3;
  } else {
    result = naming_allocation_failures(sizes, [&] { return layer->forward(x); });
  }
  const double cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  if (!group.prints()) return;  // every rank got the same output; rank 0 checks and prints it

  // The independent reference: one rank, no padding.
  progress("reference: TP=1, unpadded");
  const auto phase = std::chrono::steady_clock::now();
  const moe::MoeLayer reference_layer = naming_allocation_failures(
      sizes, [&] { return moe::MoeLayer::load(checkpoint, 0, config, {}); });
  const moe::MoeForwardResult reference =
      naming_allocation_failures(sizes, [&] { return reference_layer.forward(x); });
  const double reference_seconds = seconds_since(phase);

  // CPU: the TP split must agree within fp32 summation error. CUDA: the kernels accumulate in
  // another order, so the bound is the GPU-vs-reference tolerance (normalized error <= 4e-3).
  moe::ForwardComparison comparison;
  std::int64_t nan_mismatches = 0;
  double gpu_error = 0.0;
  bool pass = false;
  if (on_gpu) {
    gpu_error = moe::normalized_error(result.output, reference.output, &nan_mismatches);
    pass = gpu_error <= 4e-3 && nan_mismatches == 0;
  } else {
    comparison = moe::compare_forward(result, options.tp, reference, 1, config.top_k);
    pass = comparison.within_fp32_summation_error();
  }
  const double per_token_ms = 1e3 * result.total_seconds / static_cast<double>(options.tokens);
  const double total_seconds = seconds_since(start);

  if (options.json) {
    nlohmann::json ranks = rank_shapes_json(after_shapes);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      ranks[r]["before"] = before[r]["shapes"];
      ranks[r]["after"] = ranks[r]["shapes"];
      ranks[r].erase("shapes");
    }
    print_json({
        {"pass", pass},
        {"device", on_gpu ? "cuda (" + gpu_run.gpu + ")" : "cpu"},
        {"tactic", on_gpu ? gpu_run.tactic : "cpu-reference"},
        {"tactic_from_cache", on_gpu && gpu_run.from_tuner},
        {"autotune", on_gpu ? serving.json() : nlohmann::json(nullptr)},
        {"launch",
         {{"mode", dist::to_string(group.plan.mode)},
          {"reason", group.plan.reason},
          {"processes", on_gpu ? gpu_run.world : 1},
          {"allreduce_ms", gpu_run.allreduce_ms}}},
        {"checkpoint", path},
        {"config",
         {{"num_experts", config.num_experts},
          {"hidden_size", config.hidden_size},
          {"intermediate_size", config.intermediate_size},
          {"top_k", config.top_k}}},
        {"tp", options.tp},
        {"tokens", options.tokens},
        {"intermediate_size_per_partition", padding.before},
        {"intermediate_size_per_partition_after_pad", padding.after},
        {"wasted_fraction", padding.wasted_fraction()},
        {"ranks", ranks},
        {"comparison", on_gpu
                           ? nlohmann::json{{"reference", "TP=1 unpadded, CPU reference"},
                                            {"normalized_error", gpu_error},
                                            {"tolerance", 4e-3},
                                            {"nan_mismatches", nan_mismatches}}
                           : nlohmann::json{{"reference", "TP=1 unpadded"},
                                            {"elements", comparison.elements},
                                            {"bitwise_different", comparison.bitwise_different},
                                            {"beyond_one_bf16_ulp", comparison.beyond_one_ulp},
                                            {"beyond_fp32_bound", comparison.beyond_bound},
                                            {"nan_mismatches", comparison.nan_mismatches},
                                            {"max_abs_difference", comparison.max_abs_difference},
                                            {"max_bound_ratio", comparison.max_bound_ratio}}},
        {"timings",
         {{"synthesis_or_cache_seconds", synth_seconds},
          {"load_and_prepare_seconds", load_seconds},
          {"forward_seconds", result.total_seconds},
          {"forward_ms_per_token", per_token_ms},
          {"forward_cpu_ms_per_token", 1e3 * cpu_seconds / static_cast<double>(options.tokens)},
          {"reference_seconds", reference_seconds},
          {"total_seconds", total_seconds},
          {"threads", num_threads()}}},
    });
  } else {
    std::printf(
        "MoE layer E=%lld H=%lld I=%lld top-%lld, TP=%d: I_rank %lld -> %lld "
        "(%.2f%% wasted)\n",
        static_cast<long long>(config.num_experts), static_cast<long long>(config.hidden_size),
        static_cast<long long>(config.intermediate_size), static_cast<long long>(config.top_k),
        options.tp, static_cast<long long>(padding.before), static_cast<long long>(padding.after),
        100.0 * padding.wasted_fraction());
    if (on_gpu) {
      std::printf("forward: %lld tokens in %.1f us on %s (%s, %s)\n",
                  static_cast<long long>(options.tokens), gpu_run.forward_ms * 1e3,
                  gpu_run.gpu.c_str(), gpu_run.tactic.c_str(),
                  gpu_run.from_tuner ? "from the autotune cache" : "default: no cache decision");
      std::printf("autotune: %s\n", serving.note.c_str());
      std::printf("launch: %s (%s)", std::string(dist::to_string(group.plan.mode)).c_str(),
                  group.plan.reason.c_str());
      if (gpu_run.world > 1)
        std::printf("; all-reduce + rounding %.1f us", gpu_run.allreduce_ms * 1e3);
      std::printf("\n");
      std::printf(
          "vs TP=1 unpadded CPU reference: normalized error %.2e (tolerance 4e-3), "
          "%lld NaN mismatches\n",
          gpu_error, static_cast<long long>(nan_mismatches));
    } else {
      std::printf(
          "forward: %lld tokens in %.3f s (%.1f ms/token, %d threads; CPU time %.1f "
          "ms/token; CPU reference)\n",
          static_cast<long long>(options.tokens), result.total_seconds, per_token_ms, num_threads(),
          1e3 * cpu_seconds / static_cast<double>(options.tokens));
      std::printf(
          "vs TP=1 unpadded: %lld of %lld outputs differ in bits (max |diff| %.3g, "
          "%.2f of the fp32 summation bound)\n",
          static_cast<long long>(comparison.bitwise_different),
          static_cast<long long>(comparison.elements), comparison.max_abs_difference,
          comparison.max_bound_ratio);
      std::printf(
          "  (the TP=%d run adds its ranks' fp32 partial sums in another order than TP=1, so an "
          "output next to a bf16 rounding boundary may differ in its last bit; PASS = every "
          "output within the fp32 summation bound and one bf16 ulp, NaN in the same places)\n",
          options.tp);
    }
    std::printf("%s (total %.1f s)\n", pass ? "PASS" : "FAIL", total_seconds);
  }
  if (!pass && on_gpu) {
    answer_no(
        "run: FAIL: the CUDA output disagrees with the CPU reference: "
        "normalized error ",
        gpu_error, " (tolerance 4e-3), ", nan_mismatches, " NaN mismatches");
  }
  if (!pass) {
    answer_no("run: FAIL: the TP=", options.tp,
              " padded output disagrees with the TP=1 unpadded reference beyond fp32 summation "
              "error (",
              comparison.beyond_bound, " accumulator elements, ", comparison.beyond_one_ulp,
              " outputs beyond one bf16 ulp, ", comparison.nan_mismatches, " NaN mismatches)");
  }
}

}  // namespace

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run",
      "The main job: a synthetic gpt-oss-20b-shaped MoE layer (generated once into the "
      "cache directory), TP-split and padded, checked against an unpadded TP=1 run. With "
      "--device cuda the GEMM variant comes from the autotune cache of `mxq tune --preset "
      "gpt-oss-20b --tp N --device cuda` (or MXQ_AUTOTUNE_CACHE) when MXQ_AUTOTUNE is load (the "
      "default) or tune");
  auto options = std::make_shared<RunOptions>();
  cmd->add_option("--device", options->device, "Where to run")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--tp", options->tp,
                  "Tensor-parallel ranks, 1 .. 90 (I/32): with --device cuda and at least that "
                  "many GPUs one process per GPU (NCCL), else simulated in this process")
      ->capture_default_str();
  cmd->add_option("--tokens", options->tokens,
                  "Tokens in the batch (the layers and the forward's buffers must fit in the "
                  "host memory available)")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print machine-readable JSON");
  cmd->callback([options] { run_main(*options); });
}

}  // namespace mxq::cli
