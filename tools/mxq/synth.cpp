// `mxq synth gpt-oss OUT_DIR`: writes a deterministic synthetic MXFP4 MoE checkpoint.
#include <chrono>
#include <iostream>

#include "cli_util.h"
#include "commands.h"
#include "mxq/core/error.h"
#include "mxq/moe/synthetic.h"

namespace mxq::cli {

void register_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "synth",
      "Write a deterministic synthetic checkpoint (weights drawn with mxq's PRNG, "
      "quantized with mxq's MXFP4 quantizer) and its config.json");
  struct Options {
    std::string model;
    std::string out_dir;
    moe::SyntheticSpec spec;
    std::string layout = "gpt-oss";
  };
  auto options = std::make_shared<Options>();
  cmd->add_option("model", options->model, "Model family")
      ->required()
      ->check(CLI::IsMember({"gpt-oss"}));
  cmd->add_option("out_dir", options->out_dir, "Output directory")->required();
  cmd->add_option("--experts", options->spec.experts, "Number of experts E")->capture_default_str();
  cmd->add_option("--hidden", options->spec.hidden, "Hidden size H (a multiple of 32)")
      ->capture_default_str();
  cmd->add_option("--intermediate", options->spec.intermediate,
                  "Intermediate size I (a multiple of 32)")
      ->capture_default_str();
  cmd->add_option("--top-k", options->spec.top_k, "Experts per token")->capture_default_str();
  cmd->add_option("--layers", options->spec.layers, "Number of MoE layers")->capture_default_str();
  cmd->add_option("--seed", options->spec.seed, "PRNG seed")->capture_default_str();
  cmd->add_option("--layout", options->layout, "Tensor layout")
      ->check(CLI::IsMember({"gpt-oss", "native"}))
      ->capture_default_str();
  cmd->callback([options] {
    options->spec.layout = *moe::layout_from_name(options->layout);
    const auto start = std::chrono::steady_clock::now();
    moe::write_synthetic_checkpoint(options->out_dir, options->spec, [](std::string_view line) {
      std::cerr << "mxq synth: " << line << std::endl;
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "wrote " << options->out_dir << " (" << options->spec.layers << " layer(s), "
              << options->layout << " layout) in " << seconds << " s\n";
  });
}

}  // namespace mxq::cli
