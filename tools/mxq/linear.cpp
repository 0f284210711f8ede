// `mxq linear`: y = x W^T with a block-FP8 weight from a checkpoint, on the CPU or a CUDA GPU,
// through the tactic dispatch chooses (or the one forced with --tactic); --explain shows the
// decision and why every other tactic was not chosen. With --tactic auto an autotuner's cache
// (MXQ_AUTOTUNE_CACHE, read when MXQ_AUTOTUNE is load or tune) may choose the tactic; --explain
// and --json say whether it did.
#include <charconv>
#include <cstring>
#include <iostream>
#include <memory>
#include <system_error>

#include "autotune_cli.h"
#include "cli_util.h"
#include "commands.h"
#include "mxq/core/build_info.h"
#include "mxq/core/error.h"
#include "mxq/formats/bf16.h"
#include "mxq/io/npy.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"

namespace mxq::cli {
namespace {

struct LinearArgs {
  std::string checkpoint;
  std::string name;
  std::string input;
  std::string output;
  std::string device = "cpu";
  std::string tactic = "auto";
  std::string activation_scales = "fp32";
  std::string out_dtype = "bf16";
  bool explain = false;
  bool json = false;
};

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    // The whole rest must be a device index: "cuda:1x" and "cuda:-1" are refused here.
    const std::string index = text.substr(5);
    int value = 0;
    const auto [end, error] = std::from_chars(index.data(), index.data() + index.size(), value);
    if (error == std::errc() && end == index.data() + index.size() && !index.empty() &&
        index[0] != '-' && index[0] != '+') {
      return Device::cuda(value);
    }
  }
  fail_argument(ErrorCode::kInvalidArgument, "--device", "cpu, cuda or cuda:N", "'" + text + "'");
}

// f32 [M, K] from the .npy file, rounded to bf16.
Tensor read_input(const std::string& path) {
  const Tensor x = io::read_npy(path);
  if (x.dtype() != DType::kF32)
    fail_argument(ErrorCode::kDtypeMismatch, path, "an f32 array", x.dtype());
  if (x.shape().rank() != 2)
    fail_argument(ErrorCode::kShapeMismatch, path, "a 2-D array [M, K]", x.shape());
  Tensor bf16 = Tensor::empty(DType::kBF16, x.shape());
  auto* bits = reinterpret_cast<std::uint16_t*>(bf16.data());
  for (std::int64_t i = 0; i < x.numel(); ++i) bits[i] = float_to_bf16(x.data_as<float>()[i]);
  return bf16;
}

Tensor to_f32(const Tensor& y) {
  const Tensor host = y.device().is_cpu() ? y : y.to(Device::cpu());
  if (host.dtype() == DType::kF32) return host;
  Tensor out = Tensor::empty(DType::kF32, host.shape());
  const auto* bits = reinterpret_cast<const std::uint16_t*>(host.data());
  for (std::int64_t i = 0; i < host.numel(); ++i) out.data_as<float>()[i] = bf16_to_float(bits[i]);
  return out;
}

nlohmann::json explanation_json(const linear::Explanation& e) {
  nlohmann::json rejected = nlohmann::json::array();
  for (const auto& r : e.rejected) rejected.push_back({{"tactic", r.tactic}, {"reason", r.reason}});
  nlohmann::json chosen = nullptr;
  if (e.chosen != nullptr) {
    nlohmann::json params = nlohmann::json::object();
    const linear::TacticParams tile = e.chosen->params();
    for (const auto& p : tile.items()) params[p.name] = tile.get_int(p.name);
    chosen = {{"tactic", e.chosen->name()},
              {"kind", std::string(linear::to_string(e.chosen->kind()))},
              {"params", params},
              {"because", e.chosen_because}};
  }
  return {{"problem", e.problem.str()}, {"requested", e.requested},   {"chosen", chosen},
          {"from_tuner", e.from_tuner}, {"tuner_note", e.tuner_note}, {"not_chosen", rejected}};
}

void run_linear(const LinearArgs& args) {
  if (args.output.empty() && !args.explain) {
    fail(ErrorCode::kInvalidArgument, "--output: required unless --explain is given");
  }
  if (!args.output.empty()) require_writable_output(args.output, "--output");
  const Device device = parse_device(args.device);
  if (device.is_cuda()) {
    const GpuQuery gpus = query_gpus();
    if (device.index >= static_cast<int>(gpus.gpus.size())) {
      fail(ErrorCode::kUnsupported, "--device ", args.device, ": no such CUDA GPU",
           gpus.note.empty() ? "" : " (" + gpus.note + ")");
    }
  }
  linear::WeightOrigin origin;
  const linear::BlockFp8Weight weight_host =
      linear::load_weight(args.checkpoint, args.name, &origin);
  const Tensor x_host = read_input(args.input);
  const linear::BlockFp8Weight weight = device.is_cpu() ? weight_host : weight_host.to(device);
  const Tensor x = device.is_cpu() ? x_host : x_host.to(device);

  linear::LinearOptions options;
  options.tactic = args.tactic;
  options.activation_scales = parse_scale_mode(args.activation_scales, "--activation-scales");
  if (args.out_dtype == "bf16") {
    options.out_dtype = DType::kBF16;
  } else if (args.out_dtype == "f32") {
    options.out_dtype = DType::kF32;
  } else {
    fail_argument(ErrorCode::kInvalidArgument, "--out-dtype", "bf16 or f32",
                  "'" + args.out_dtype + "'");
  }
  const ServingTuner serving = serving_tuner(
      device.is_cuda() ? tune::Backend::kCuda : tune::Backend::kCpu, std::nullopt, device.index);
  options.tuner = serving.tuner.get();
  const linear::LinearProblem problem = linear::make_problem(x, weight, nullptr, options);
  const linear::Explanation explanation = linear::explain(problem, args.tactic, options.tuner);
  // Refuses a forced tactic that does not support the problem, with its reason.
  bool from_tuner = false;
  const linear::LinearTactic& tactic =
      linear::select_tactic(problem, args.tactic, options.tuner, nullptr, &from_tuner);

  nlohmann::json report = {{"weight",
                            {{"name", args.name},
                             {"file", origin.file},
                             {"block", to_string(weight.block)},
                             {"block_from", origin.block_from},
                             {"shape", {weight.n(), weight.k()}}}},
                           {"tactic", tactic.name()},
                           {"tactic_from_cache", from_tuner},
                           {"autotune", serving.json()}};
  if (args.explain) {
    report["explain"] = explanation_json(explanation);
    if (!args.json) std::cout << explanation.str();
  }
  if (!args.output.empty()) {
    linear::LinearRun ran;
    options.ran = &ran;
    const Tensor y = to_f32(linear::linear(x, weight, nullptr, options));
    io::write_npy(args.output, y);
    report["output"] = {{"path", args.output}, {"shape", {y.shape()[0], y.shape()[1]}}};
    report["tactic"] = ran.tactic->name();
    report["tactic_from_cache"] = ran.from_tuner;
    if (!args.json) {
      std::cout << args.output << ": f32 [" << y.shape()[0] << ", " << y.shape()[1] << "] via "
                << ran.tactic->name() << (ran.from_tuner ? " (from the autotune cache)" : "")
                << "\n";
    }
  }
  if (args.json) print_json(report);
}

}  // namespace

void register_linear(CLI::App& app) {
  auto args = std::make_shared<LinearArgs>();
  auto* cmd = app.add_subcommand(
      "linear",
      "y = x W^T with a block-FP8 weight (DeepSeek-V3 checkpoint directory or a "
      "`mxq quantize fp8-block` file); input f32 .npy [M, K] rounded to bf16, output f32 .npy");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint directory (config.json + safetensors) or one .safetensors file")
      ->required();
  cmd->add_option("--name", args->name, "Weight name prefix: NAME.weight, NAME.weight_scale_inv")
      ->required();
  cmd->add_option("--input", args->input, "Input .npy, f32 [M, K]")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--output", args->output,
                  "Output .npy, f32 [M, N] (required unless --explain, which then only explains)");
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option(
         "--tactic", args->tactic,
         "auto, fast, fallback, reference or a tactic name (see --explain); auto asks "
         "the autotune cache MXQ_AUTOTUNE_CACHE first when set and MXQ_AUTOTUNE is load or "
         "tune")
      ->capture_default_str();
  cmd->add_option("--activation-scales", args->activation_scales,
                  "fp32, or ue8m0 (activation scales rounded up to powers of two)")
      ->capture_default_str();
  cmd->add_option("--out-dtype", args->out_dtype, "bf16 or f32 (written to the .npy as f32)")
      ->capture_default_str();
  cmd->add_flag("--explain", args->explain,
                "Show the chosen tactic and why every other tactic was not chosen");
  cmd->add_flag("--json", args->json, "Print machine-readable JSON");
  cmd->callback([args] { run_linear(*args); });
}

}  // namespace mxq::cli
