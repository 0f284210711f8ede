// mxq: the command-line tool. One file per subcommand (see commands.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "interrupt.h"
#include "mxq/core/build_info.h"
#include "mxq/core/error.h"
#include "mxq/core/log.h"

namespace mxq::cli {
namespace {

// The first word that names no subcommand where one is expected ("mxq tnue", "mxq cache foo"),
// as a message listing the commands there; empty when the words name commands. CLI11 reports
// these as "A subcommand is required", which does not say what was wrong.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  std::string path = "mxq";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto subcommands = level->get_subcommands([](CLI::App*) { return true; });
    if (word.empty() || word[0] == '-' || subcommands.empty()) return {};
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* sub : subcommands) {
      if (sub->check_name(word)) next = sub;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (next == nullptr) {
      return "unknown command '" + word + "'" + (level == &app ? "" : " of '" + path + "'") +
             " (expected one of: " + names + "; see " + path + " --help)";
    }
    level = next;
    path += " " + word;
  }
  return {};
}

}  // namespace
}  // namespace mxq::cli

int main(int argc, char** argv) {
  CLI::App app{"mxq: quantized LLM layers (MXFP4 MoE, block-FP8 linear) for NVIDIA Hopper GPUs"};
  app.set_version_flag("--version", "mxq " + mxq::build_info().version);
  app.require_subcommand(1);
  mxq::cli::register_info(app);
  mxq::cli::register_quantize(app);
  mxq::cli::register_dequantize(app);
  mxq::cli::register_tune(app);
  mxq::cli::register_cache(app);
  mxq::cli::register_synth(app);
  mxq::cli::register_moe(app);
  mxq::cli::register_run(app);
  mxq::cli::register_bench(app);
  mxq::cli::register_linear(app);
  (void)mxq::log_level();  // a bad MXQ_LOG_LEVEL is said at once, whatever the command logs
  if (const std::string unknown = mxq::cli::unknown_command(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "mxq: error: %s\n", unknown.c_str());
    return mxq::cli::kExitError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version end here with 0; a usage error is an error like any other.
    return app.exit(error) == 0 ? 0 : mxq::cli::kExitError;
  } catch (const mxq::cli::ExitStatus& status) {
    return status.code;
  } catch (const mxq::cli::Interrupted& interrupted) {
    mxq::cli::die_by(interrupted);
  } catch (const mxq::Error& error) {
    std::fprintf(stderr, "mxq: error: %s\n", error.what());
    return mxq::cli::kExitError;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mxq: error: %s\n", error.what());
    return mxq::cli::kExitError;
  }
  return 0;
}
