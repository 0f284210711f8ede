// mxq: the command-line tool. One file per subcommand (see commands.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli_util.h"
#include "commands.h"
#include "mxq/core/build_info.h"
#include "mxq/core/error.h"

namespace mxq::cli {
bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const mxq::cli::ExitStatus& status) {
    return status.code;
  } catch (const mxq::Error& error) {
    std::fprintf(stderr, "mxq: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mxq: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
