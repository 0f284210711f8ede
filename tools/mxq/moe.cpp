// `mxq moe`: runs one MoE layer of a checkpoint on an .npy input, simulating every TP x EP rank.
// An autotuner's cache (MXQ_AUTOTUNE_CACHE, read when MXQ_AUTOTUNE is load or tune)
// picks each rank's GEMM variant (GPU) or expert tiling (CPU).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <vector>

#include "autotune_cli.h"
#include "cli_util.h"
#include "commands.h"
#include "launch.h"
#include "moe_gpu.h"
#include "moe_report.h"
#include "mxq/core/error.h"
#include "mxq/io/npy.h"
#include "mxq/moe/footprint.h"
#include "mxq/moe/layer.h"

namespace mxq::cli {
namespace {

struct MoeOptions {
  std::string checkpoint;
  std::int64_t layer = 0;
  std::string input;
  std::string output;
  int tp = 1;
  int ep = 1;
  std::int64_t align = moe::kDefaultAlignment;
  std::int64_t intermediate_per_rank = 0;
  std::string device = "cpu";
  std::string activation;
  std::string activation_quant;
  moe::MoeConfigOverrides overrides;
  bool json = false;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_moe(const MoeOptions& options) {
  if (options.device == "cuda") require_gpu_for_device_cuda();
  const auto start = std::chrono::steady_clock::now();
  const moe::MoeCheckpoint checkpoint = moe::MoeCheckpoint::open(options.checkpoint);
  moe::MoeConfigOverrides overrides = options.overrides;
  if (!options.activation.empty())
    overrides.activation = moe::parse_activation(options.activation, "--activation");
  if (!options.activation_quant.empty()) {
    overrides.activation_quant =
        moe::parse_activation_quant(options.activation_quant, "--activation-quant");
  }
  const moe::MoeConfig config = checkpoint.resolve_config(options.layer, overrides);
  const Tensor x = io::read_npy(options.input);
  require_dtype(x, "--input", DType::kF32);
  // The input against the checkpoint's H and the output path, before the layer is loaded.
  if (x.shape().rank() != 2 || x.shape()[1] != config.hidden_size) {
    fail_argument(ErrorCode::kShapeMismatch, "--input",
                  "an array [T, " + std::to_string(config.hidden_size) + "] (H of the layer)",
                  x.shape());
  }
  require_writable_output(options.output, "--output");
  moe::ShardOptions shards;
  shards.tp_size = options.tp;
  shards.ep_size = options.ep;
  shards.intermediate_per_rank = options.intermediate_per_rank;
  // Every size against the layer and the machine, before any process or allocation.
  const moe::SizeArgumentNames names{"--tp", "--ep", "--intermediate-per-rank", "--align",
                                     "--input"};
  moe::check_layer_request(config, shards, options.align, names);
  const std::int64_t width =
      moe::tp_shard(config.intermediate_size, shards.tp_size, 0, shards.intermediate_per_rank)
          .width;
  moe::check_forward_request(
      config, options.align != 0 ? moe::padded_intermediate(width, options.align) : width,
      x.shape()[0], moe::layer_host_bytes(config, shards, options.align) + x.nbytes(), names);
  const std::string sizes =
      "--tp " + std::to_string(options.tp) + " --ep " + std::to_string(options.ep) +
      " --intermediate-per-rank " + std::to_string(options.intermediate_per_rank) + " --align " +
      std::to_string(options.align) + " (" + std::to_string(x.shape()[0]) + " tokens of --input)";
  const bool on_gpu = options.device == "cuda";
  const int num_ranks = options.tp * options.ep;
  // One process per rank reads and prepares only its own rank through the engine-facing op,
  // which splits I by the automatic rule; a forced width is for ranks simulated in one process.
  const std::int64_t automatic_width = moe::tp_shard(config.intermediate_size, options.tp, 0).width;
  if (width != automatic_width &&
      plan_ranks(num_ranks, on_gpu).mode != dist::LaunchMode::kInProcess) {
    fail_argument(ErrorCode::kInvalidArgument, "--intermediate-per-rank",
                  "0 or the automatic width " + std::to_string(automatic_width) +
                      " when the ranks run one per process (a forced width is for ranks "
                      "simulated in one process, e.g. with CUDA_VISIBLE_DEVICES naming one GPU)",
                  options.intermediate_per_rank);
  }
  const RankSetup group = launch_ranks("moe", num_ranks, on_gpu);
  if (group.spawned()) return;  // rank 0 wrote the output and printed the report

  // In one process every rank is loaded (MoeLayer); one rank per process reads only its own
  // (run_moe_distributed) and describes the others from the shapes they hold.
  std::optional<moe::MoeLayer> layer;
  std::vector<moe::MoeRankShape> before_shapes;
  std::vector<moe::MoeRankShape> after_shapes;
  double load_seconds = 0.0;
  double prepare_seconds = 0.0;
  if (group.joined()) {
    before_shapes = moe::layer_rank_shapes(config, shards, 0);
    after_shapes = moe::layer_rank_shapes(config, shards, options.align);
  } else {
    layer = naming_allocation_failures(
        sizes, [&] { return moe::MoeLayer::load(checkpoint, options.layer, config, shards); });
    load_seconds = seconds_since(start);
    before_shapes = rank_shapes(*layer);
    const auto prepare_start = std::chrono::steady_clock::now();
    if (options.align != 0) {
      naming_allocation_failures(sizes, [&] { (void)layer->prepare(options.align); });
    }
    prepare_seconds = seconds_since(prepare_start);
    after_shapes = rank_shapes(*layer);
  }
  const nlohmann::json before = rank_shapes_json(before_shapes);
  const moe::PaddingSummary padding = padding_summary(config, options.tp, after_shapes.front());

  GpuMoeRun gpu_run;
  ServingTuner serving;
  moe::MoeForwardResult result;
  if (on_gpu) {
    serving = serving_tuner(tune::Backend::kCuda, std::nullopt, group.rank.local_rank,
                            group.joined() ? group.comm.get() : nullptr);
    if (group.joined()) {
      const DistributedMoeLayer part{&checkpoint, options.layer, overrides,
                                     options.tp,  options.ep,    options.align};
      const double before_setup = seconds_since(start);
      gpu_run =
          run_moe_distributed(part, x, *group.comm, group.rank.local_rank, serving.tuner.get());
      // This rank's read and its preparation on the GPU, together.
      load_seconds = before_setup + gpu_run.setup_seconds;
    } else {
      gpu_run = run_moe_on_gpu(*layer, x, serving.tuner.get());
    }
    result.output = gpu_run.output;
    result.total_seconds = gpu_run.forward_ms * 1e-3;
    result.rank_seconds.assign(static_cast<std::size_t>(num_ranks), 0.0);
  } else {
    serving = serving_tuner(tune::Backend::kCpu, std::nullopt);
    result = naming_allocation_failures(
        sizes, [&] { return layer->forward(x, nullptr, serving.tuner.get()); });
  }
  if (!group.prints()) return;  // every rank got the same output; rank 0 writes it
  io::write_npy(options.output, result.output);
  const std::int64_t tokens = x.shape()[0];

  // The layer's tactic came from the cache when every rank's did: with an uneven split, ranks
  // have keys of their own, which a cache may hold for some ranks only.
  const bool from_cache = on_gpu ? gpu_run.from_tuner
                                 : std::all_of(result.rank_tactics_from_cache.begin(),
                                               result.rank_tactics_from_cache.end(),
                                               [](bool cached) { return cached; });
  const auto cache_note = [&](const char* otherwise) {
    return from_cache ? "from the autotune cache" : otherwise;
  };
  if (options.json) {
    nlohmann::json ranks = rank_shapes_json(after_shapes);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      ranks[r]["before"] = before[r]["shapes"];
      ranks[r]["after"] = ranks[r]["shapes"];
      ranks[r]["intermediate_size_per_partition"] =
          before[r]["intermediate_size_per_partition_after_pad"];
      ranks[r].erase("shapes");
      ranks[r]["expert_seconds"] = result.rank_seconds[r];
      if (on_gpu) {
        ranks[r]["tactic"] = gpu_run.ranks[r].tactic;
        ranks[r]["tactic_from_cache"] = gpu_run.ranks[r].from_tuner;
        ranks[r]["tune_problem"] = gpu_run.ranks[r].problem;
      } else {
        ranks[r]["tactic"] = "moe_expert_gemm " + result.rank_tactics[r];
        ranks[r]["tactic_from_cache"] = static_cast<bool>(result.rank_tactics_from_cache[r]);
        ranks[r]["tune_problem"] = layer->tune_problem(static_cast<int>(r)).canonical();
      }
    }
    nlohmann::json out = {
        {"checkpoint", options.checkpoint},
        {"layer", options.layer},
        {"layout", moe::to_string(checkpoint.layout(options.layer))},
        {"config",
         {{"hidden_size", config.hidden_size},
          {"intermediate_size", config.intermediate_size},
          {"num_experts", config.num_experts},
          {"top_k", config.top_k},
          {"swiglu_limit", config.swiglu_limit},
          {"activation", moe::to_string(config.activation)},
          {"activation_quant", moe::to_string(config.activation_quant)},
          {"has_bias", config.has_bias}}},
        {"tp", options.tp},
        {"ep", options.ep},
        {"alignment", options.align},
        {"intermediate_size_per_partition", padding.before},
        {"intermediate_size_per_partition_after_pad", padding.after},
        {"wasted_fraction", padding.wasted_fraction()},
        {"ranks", ranks},
        {"tactic", on_gpu ? gpu_run.tactic
                          : "cpu-reference (MXFP4 decoded to fp64, fp64 dot products, bf16 "
                            "intermediate)"},
        {"tactic_from_cache", from_cache},
        {"autotune", serving.json()},
        {"device", on_gpu ? "cuda (" + gpu_run.gpu + ")" : "cpu"},
        {"launch",
         {{"mode", dist::to_string(group.plan.mode)},
          {"reason", group.plan.reason},
          {"processes", on_gpu ? gpu_run.world : 1},
          {"allreduce_ms", gpu_run.allreduce_ms}}},
        {"tokens", tokens},
        {"timings",
         {{"load_seconds", load_seconds},
          {"prepare_seconds", prepare_seconds},
          {"routing_seconds", result.routing_seconds},
          {"forward_seconds", result.total_seconds},
          {"forward_ms_per_token",
           tokens > 0 ? 1e3 * result.total_seconds / static_cast<double>(tokens) : 0.0}}},
        {"output", options.output},
    };
    print_json(out);
  } else {
    std::printf("layer %lld (%s layout): E=%lld H=%lld I=%lld top-%lld, TP=%d EP=%d\n",
                static_cast<long long>(options.layer),
                std::string(moe::to_string(checkpoint.layout(options.layer))).c_str(),
                static_cast<long long>(config.num_experts),
                static_cast<long long>(config.hidden_size),
                static_cast<long long>(config.intermediate_size),
                static_cast<long long>(config.top_k), options.tp, options.ep);
    std::printf("I_rank %lld -> %lld (alignment %lld), wasted %.2f%%\n",
                static_cast<long long>(padding.before), static_cast<long long>(padding.after),
                static_cast<long long>(options.align), 100.0 * padding.wasted_fraction());
    if (on_gpu) {
      std::printf("tactic: %s (%s); autotune: %s\n", gpu_run.tactic.c_str(),
                  cache_note("default: no cache decision"), serving.note.c_str());
      std::printf("launch: %s (%s)\n", std::string(dist::to_string(group.plan.mode)).c_str(),
                  group.plan.reason.c_str());
    } else {
      std::printf("expert tiling: %s (%s); autotune: %s\n", result.rank_tactics[0].c_str(),
                  cache_note("the layer's own"), serving.note.c_str());
    }
    std::printf("%lld tokens: forward %.3f s (%.2f ms/token), load %.3f s; wrote %s\n",
                static_cast<long long>(tokens), result.total_seconds,
                tokens > 0 ? 1e3 * result.total_seconds / static_cast<double>(tokens) : 0.0,
                load_seconds, options.output.c_str());
  }
}

}  // namespace

void register_moe(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "moe",
      "Run one MXFP4 MoE layer of a checkpoint on an f32 .npy input [T, H] (rounded to "
      "bf16 on entry), over TP x EP ranks (--device cuda with at least TPxEP GPUs: one process per "
      "GPU over NCCL; else simulated in this process); writes the f32 output [T, H]");
  auto options = std::make_shared<MoeOptions>();
  cmd->add_option("--checkpoint", options->checkpoint,
                  "Directory of .safetensors files (+ config.json), or one .safetensors file")
      ->required();
  cmd->add_option("--layer", options->layer, "Layer index")->capture_default_str();
  cmd->add_option("--input", options->input, "Input .npy, f32 [T, H]")->required();
  cmd->add_option("--output", options->output, "Output .npy, f32 [T, H]")->required();
  cmd->add_option("--tp", options->tp,
                  "Tensor-parallel ranks, 1 .. I/32 (every size is checked against the layer and "
                  "the host memory available before anything is allocated)")
      ->capture_default_str();
  cmd->add_option("--ep", options->ep, "Expert-parallel ranks, 1 .. E")->capture_default_str();
  cmd->add_option("--align", options->align,
                  "Pad I_rank to a multiple of this (a multiple of 32; 0 = no padding)")
      ->capture_default_str();
  cmd->add_option("--intermediate-per-rank", options->intermediate_per_rank,
                  "Force the per-rank intermediate width (a multiple of 32; 0 = automatic; ranks "
                  "simulated in one process only: one process per rank uses the automatic width)")
      ->capture_default_str();
  cmd->add_option("--device", options->device,
                  "Where to run (cuda: GPU 0). With MXQ_AUTOTUNE=load|tune and MXQ_AUTOTUNE_CACHE "
                  "set, the cache chooses the GEMM variant (cuda) or the expert tiling (cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--activation", options->activation, "Override the activation")
      ->check(CLI::IsMember({"swiglu_oai", "swiglu_clamp", "swiglu"}));
  cmd->add_option("--activation-quant", options->activation_quant,
                  "What the expert GEMMs multiply the weights with: bf16 (W4A16, default) or "
                  "fp8_g128 (W4A8: E4M3 in groups of 128 along K; CPU and CUDA)")
      ->check(CLI::IsMember({"bf16", "fp8_g128"}));
  cmd->add_option("--experts", options->overrides.num_experts,
                  "Number of experts: overrides config.json (without it: from the tensors), and "
                  "must match the tensors");
  cmd->add_option("--hidden", options->overrides.hidden_size,
                  "Hidden size H: overrides config.json, must match the tensors");
  cmd->add_option("--intermediate", options->overrides.intermediate_size,
                  "Intermediate size I: overrides config.json, must match the tensors");
  cmd->add_option("--top-k", options->overrides.top_k,
                  "Experts per token (required without config.json)");
  cmd->add_flag("--json", options->json, "Print machine-readable JSON");
  cmd->callback([options] { run_moe(*options); });
}

}  // namespace mxq::cli
