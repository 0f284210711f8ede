// `mxq bench moe|...`: GPU benchmarks with same-run baselines (see docs/PERF.md).
#include <iostream>
#include <memory>

#include "cli_util.h"
#include "commands.h"
#include "mxq/core/error.h"

#if MXQ_WITH_CUDA
#include "moe_bench.h"
#endif

namespace mxq::cli {
namespace {

struct MoeBenchArgs {
  std::string preset = "gpt-oss-120b";
  std::vector<int> tokens = {1, 8, 64, 512, 4096};
  int tp = 1;
  int align = 128;
  int repeats = 50;
  bool no_baseline = false;
  bool json = false;
};

void print_moe_table(const nlohmann::json& result) {
  std::printf("%s: E=%d H=%d I_rank=%d (padded %d) top-%d TP=%d; copy ceiling %.0f GB/s\n",
              result["preset"].get<std::string>().c_str(), result["experts"].get<int>(),
              result["hidden"].get<int>(), result["intermediate_per_rank"].get<int>(),
              result["intermediate_padded"].get<int>(), result["top_k"].get<int>(),
              result["tp"].get<int>(), result["copy_ceiling_gbps"].get<double>());
  std::printf("%6s %9s %8s %8s %8s %8s %8s %6s %8s %10s %8s\n", "T", "total_us", "route", "gemm1",
              "gemm2", "combine", "GB/s", "%ceil", "TFLOPS", "bf16_us", "speedup");
  for (const auto& p : result["points"]) {
    const auto& m = p["mxq"];
    std::printf("%6d %9.1f %8.1f %8.1f %8.1f %8.1f %8.0f %6.1f %8.1f", p["tokens"].get<int>(),
                m["total_us"].get<double>(), m["routing_us"].get<double>(),
                m["gemm1_us"].get<double>(), m["gemm2_us"].get<double>(),
                m["combine_us"].get<double>(), m["effective_gbps"].get<double>(),
                m["pct_of_copy_ceiling"].get<double>(), m["tflops"].get<double>());
    if (p.contains("baseline_bf16")) {
      std::printf(" %10.1f %7.2fx", p["baseline_bf16"]["total_us"].get<double>(),
                  p["speedup_vs_baseline"].get<double>());
    }
    std::printf("\n");
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "GPU benchmarks against same-run baselines");
  bench->require_subcommand(1);
  auto args = std::make_shared<MoeBenchArgs>();
  auto* moe = bench->add_subcommand(
      "moe",
      "Time the CUDA MXFP4 MoE layer per phase (routing, GEMM1, GEMM2, combine) against a bf16 "
      "cuBLAS implementation of the same layer; reports µs, effective GB/s on touched weights, "
      "TFLOPS");
  moe->add_option("--preset", args->preset, "gpt-oss-20b or gpt-oss-120b")
      ->check(CLI::IsMember({"gpt-oss-20b", "gpt-oss-120b"}))
      ->capture_default_str();
  moe->add_option("--tokens", args->tokens, "Token counts")->delimiter(',')->capture_default_str();
  moe->add_option("--tp", args->tp, "Tensor-parallel size (rank 0 is timed)")
      ->capture_default_str();
  moe->add_option("--align", args->align, "Padding alignment of I_rank")->capture_default_str();
  moe->add_option("--repeats", args->repeats, "Timed runs per point (median)")
      ->capture_default_str();
  moe->add_flag("--no-baseline", args->no_baseline, "Skip the bf16 baseline");
  moe->add_flag("--json", args->json, "Print JSON");
  moe->callback([args] {
#if MXQ_WITH_CUDA
    bench::MoeBenchOptions options;
    options.preset = args->preset;
    options.tokens = args->tokens;
    options.tp = args->tp;
    options.align = args->align;
    options.repeats = args->repeats;
    options.baseline = !args->no_baseline;
    const nlohmann::json result = bench::run_moe_bench(options, !args->json);
    if (args->json) {
      print_json(result);
    } else {
      print_moe_table(result);
    }
#else
    fail(ErrorCode::kUnsupported,
         "mxq bench moe needs a CUDA build of mxq (configure with -DMXQ_CUDA=ON)");
#endif
  });
}

}  // namespace mxq::cli
