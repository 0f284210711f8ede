// Every subcommand of the `mxq` tool registers itself on the CLI11 app through one function
// declared here and listed once in main.cpp. A command's callback throws mxq::Error (or
// CommandError) on failure; main() turns that into one line on stderr and a non-zero exit.
#pragma once

#include <CLI/CLI.hpp>

namespace mxq::cli {

void register_info(CLI::App& app);
void register_quantize(CLI::App& app);
void register_dequantize(CLI::App& app);
void register_tune(CLI::App& app);
void register_cache(CLI::App& app);
void register_synth(CLI::App& app);
void register_moe(CLI::App& app);
void register_run(CLI::App& app);
void register_bench(CLI::App& app);
void register_linear(CLI::App& app);

}  // namespace mxq::cli
