// `mxq bench moe|...`: GPU benchmarks with same-run baselines (see docs/PERF.md).
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "mxq/core/error.h"

// The probes' options structs (plain C++) in every build: the flags write into them, so their
// defaults have one owner.
#include "tma_stream.h"
#include "wgmma_rate.h"

#if MXQ_WITH_CUDA
#include "linear_bench.h"
#include "moe_bench.h"
#include "mxq/linear/dispatch.h"
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
  bool default_only = false;
  bool w4a8 = false;
  bool cold_l2 = false;
  bool no_read_floor = false;
  std::string block_trace;
  bool json = false;
};

[[maybe_unused]] void print_moe_table(const nlohmann::json& result) {
  std::printf("%s: E=%d H=%d I_rank=%d (padded %d) top-%d TP=%d; copy ceiling %.0f GB/s%s\n",
              result["preset"].get<std::string>().c_str(), result["experts"].get<int>(),
              result["hidden"].get<int>(), result["intermediate_per_rank"].get<int>(),
              result["intermediate_padded"].get<int>(), result["top_k"].get<int>(),
              result["tp"].get<int>(), result["copy_ceiling_gbps"].get<double>(),
              result.value("cold_l2", false) ? "; L2 flushed before each replay" : "");
  std::printf("%6s %-20s %9s %8s %8s %8s %8s %8s %8s %6s %8s %10s %8s\n", "T", "gemm", "total_us",
              "in_graph", "route", "gemm1", "gemm2", "combine", "GB/s", "%ceil", "TFLOPS",
              "bf16_us", "speedup");
  for (const auto& p : result["points"]) {
    for (const char* key : {"mxq", "mxq_decode_mma", "mxq_prefill_wgmma", "mxq_w4a8",
                            "mxq_w4a8_decode_mma", "mxq_w4a8_prefill_wgmma"}) {
      if (!p.contains(key)) continue;
      const auto& m = p[key];
      std::string gemm = m["gemm_variant"].get<std::string>();
      if (gemm == "auto") gemm += ":" + m["resolved_variant"].get<std::string>();
      if (std::string(key).rfind("mxq_w4a8", 0) == 0) gemm = "w4a8:" + gemm;
      std::printf("%6d %-20s %9.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.0f %6.1f %8.1f",
                  p["tokens"].get<int>(), gemm.c_str(), m["total_us"].get<double>(),
                  m["layer_in_graph_us"].get<double>(), m["routing_us"].get<double>(),
                  m["gemm1_us"].get<double>(), m["gemm2_us"].get<double>(),
                  m["combine_us"].get<double>(), m["effective_gbps"].get<double>(),
                  m["pct_of_copy_ceiling"].get<double>(), m["tflops"].get<double>());
      if (p.contains("baseline_bf16")) {
        const double base = p["baseline_bf16"]["total_us"].get<double>();
        std::printf(" %10.1f %7.2fx", base, base / m["total_us"].get<double>());
      }
      std::printf("\n");
    }
    if (p.contains("read_floor")) {
      const auto& f = p["read_floor"];
      std::printf(
          "%6s read floor: %.1f MB in %.1f us (in graph %.1f; in one pass %.1f), %.0f GB/s; "
          "the layer takes %.2fx\n",
          "", f["bytes"].get<double>() / 1e6, f["total_us"].get<double>(),
          f["in_graph_us"].get<double>(), f["one_pass_us"].get<double>(), f["gbps"].get<double>(),
          f["layer_over_floor"].get<double>());
    }
  }
}

// "N,K" → (N, K), both positive; anything else is an argument error naming --shape.
std::pair<int, int> parse_nk_pair(const std::string& text) {
  const std::size_t comma = text.find(',');
  int n = 0;
  int k = 0;
  std::size_t n_end = 0;
  std::size_t k_end = 0;
  try {
    if (comma != std::string::npos) {
      n = std::stoi(text.substr(0, comma), &n_end);
      k = std::stoi(text.substr(comma + 1), &k_end);
    }
  } catch (const std::exception&) {
    n = 0;
  }
  if (comma == std::string::npos || n_end != comma || k_end != text.size() - comma - 1 || n < 1 ||
      k < 1) {
    fail_argument(ErrorCode::kInvalidArgument, "--shape", "N,K with two positive integers",
                  "'" + text + "'");
  }
  return {n, k};
}

struct LinearBenchArgs {
  std::string preset = "deepseek-v3";
  std::vector<std::string> shapes;  // "N,K" each; replaces the preset's pairs when given
  std::vector<int> m = {64, 128, 4096};
  int repeats = 30;
  bool no_baseline = false;
  bool no_fallback_64 = false;
  bool no_op = false;
  bool no_read_floor = false;
  bool no_ceiling = false;
  std::vector<std::string> tactics;  // empty: every supported tactic
  bool json = false;
};

[[maybe_unused]] void print_linear_table(const nlohmann::json& result) {
  std::printf("%s, %d SMs, cuBLASLt %d; %s\n", result["gpu"].get<std::string>().c_str(),
              result["sm_count"].get<int>(), result["cublaslt_version"].get<int>(),
              result["method"].get<std::string>().c_str());
  std::printf("%6s %6s %5s  %-32s %-8s %9s %8s %8s %10s\n", "N", "K", "M", "kernel (* = auto)",
              "blocks", "us", "TFLOPS", "GB/s", "vs cuBLAS");
  for (const auto& p : result["points"]) {
    for (const auto& t : p["timings"]) {
      std::printf("%6d %6d %5d  %-32s %-8s %9.1f %8.1f %8.0f", p["n"].get<int>(), p["k"].get<int>(),
                  p["m"].get<int>(), t["name"].get<std::string>().c_str(),
                  t["blocks"].get<std::string>().c_str(), t["us"].get<double>(),
                  t["tflops"].get<double>(), t["gbps"].get<double>());
      if (t.contains("speedup_vs_cublaslt")) {
        std::printf(" %9.2fx", t["speedup_vs_cublaslt"].get<double>());
      }
      std::printf("\n");
    }
    if (p.contains("op")) {
      for (const auto& t : p["op"]["timings"]) {
        std::printf("%6d %6d %5d  %-32s %-8s %9.1f %8.1f %8.0f", p["n"].get<int>(),
                    p["k"].get<int>(), p["m"].get<int>(), t["name"].get<std::string>().c_str(),
                    "128x128", t["us"].get<double>(), t["tflops"].get<double>(),
                    t["gbps"].get<double>());
        if (t.contains("speedup_vs_cublaslt")) {
          std::printf(" %9.2fx", t["speedup_vs_cublaslt"].get<double>());
        }
        std::printf("  (%s; host %.1f us per eager call)\n", t["tactic"].get<std::string>().c_str(),
                    t["host_us"].get<double>());
      }
      std::printf("%20s linear_into with MN-major scales gives the tactic's bits: %s\n", "",
                  p["op"]["mn_major_output_equals_the_tactic"].get<bool>() ? "yes" : "NO");
    }
    if (p.contains("read_floor")) {
      const auto& f = p["read_floor"];
      std::printf("%20s read floor: %.1f MB in %.1f us, %.0f GB/s; the dispatch's tile %.2fx it\n",
                  "", f["bytes"].get<double>() / 1e6, f["total_us"].get<double>(),
                  f["gbps"].get<double>(), f.value("dispatch_over_floor", 0.0));
    }
    if (p.contains("ceiling") && p["ceiling"].contains("us")) {
      const auto& c = p["ceiling"];
      std::printf("%20s ceiling: cuBLASLt per-tensor FP8 %.1f us, %.0f TFLOPS\n", "",
                  c["us"].get<double>(), c["tflops"].get<double>());
    }
    if (p.contains("cublaslt_vs_mxq_normalized_difference")) {
      std::printf("%20s cuBLASLt vs mxq output: normalized difference %.2e\n", "",
                  p["cublaslt_vs_mxq_normalized_difference"].get<double>());
    }
    if (p.contains("cublaslt_m")) {
      std::printf(
          "%20s cuBLASLt ran on %d rows, the first M of them these (bench/linear_bench.cu: "
          "kCublasMinRows)\n",
          "", p["cublaslt_m"].get<int>());
    }
    if (p.contains("cublaslt_note")) {
      std::printf("%20s %s\n", "", p["cublaslt_note"].get<std::string>().c_str());
    }
  }
  for (const auto& m : result.value("summary", nlohmann::json::array())) {
    std::printf(
        "M=%d: the dispatch's choice vs cuBLASLt over %d shapes: geomean %.2fx, min %.2fx (%s)\n",
        m["m"].get<int>(), m["shapes"].get<int>(), m["geomean_vs_cublaslt"].get<double>(),
        m["min_vs_cublaslt"].get<double>(), m["min_at"].get<std::string>().c_str());
    if (m.contains("read_floor_geomean_vs_cublaslt")) {
      std::printf("M=%d: reading the weights once (the read floor) vs cuBLASLt: geomean %.2fx\n",
                  m["m"].get<int>(), m["read_floor_geomean_vs_cublaslt"].get<double>());
    }
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
  moe->add_flag("--default-only", args->default_only,
                "Time only the default GEMM variant (auto), not every variant and the no-PDL "
                "ablation");
  moe->add_flag("--w4a8", args->w4a8,
                "Also time the W4A8 forward (fp8_g128 activations, its own weight layout) on the "
                "same weights and inputs (\"mxq_w4a8\"; without --default-only also each of its "
                "GEMM variants: \"mxq_w4a8_decode_mma\", \"mxq_w4a8_prefill_wgmma\")");
  moe->add_flag("--cold-l2", args->cold_l2,
                "Overwrite a buffer of twice the L2 size before each timed replay (not timed), so "
                "that no kernel code, parameter, router weight or workspace line of the layer is "
                "in L2 when it starts, as when other layers ran in between; the baseline too");
  moe->add_flag("--no-read-floor", args->no_read_floor,
                "Skip the read floor (the touched experts' GEMM1 bytes, then their GEMM2 bytes, "
                "read by a plain streaming kernel in graphs like the layer's: the time any layer "
                "that reads its weights once needs)");
  moe->add_option("--block-trace", args->block_trace,
                  "Write the default's per-block timeline of a few more replays per token count to "
                  "FILE (JSON; bench/block_trace_summary.py prints it). Needs a build configured "
                  "with -DMXQ_MOE_BLOCK_TRACE=ON")
      ->type_name("FILE");
  moe->add_flag("--json", args->json, "Print JSON");
  auto linear_args = std::make_shared<LinearBenchArgs>();
  auto* linear = bench->add_subcommand(
      "linear",
      "Time every supported block-FP8 linear tactic and cuBLASLt's block-scaled FP8 GEMM "
      "(VEC128 activation x BLK128x128 weight scales) on the same inputs; µs, TFLOPS, GB/s, "
      "speed-up; plus the fallback on 64x64 blocks and the op as engines call it (linear_into "
      "into the caller's output and workspace) per activation input");
  linear->add_option("--preset", linear_args->preset, "(N, K) pairs: deepseek-v3")
      ->check(CLI::IsMember({"deepseek-v3"}))
      ->capture_default_str();
  linear
      ->add_option("--shape", linear_args->shapes,
                   "An (N, K) pair to time instead of the preset's, as N,K (repeat the option "
                   "for several)")
      ->type_name("N,K");
  linear->add_option("--m", linear_args->m, "Token counts M")
      ->delimiter(',')
      ->capture_default_str();
  linear->add_option("--repeats", linear_args->repeats, "Timed runs per point (median), >= 20")
      ->capture_default_str();
  linear->add_flag("--no-baseline", linear_args->no_baseline, "Skip cuBLASLt");
  linear->add_flag("--no-fallback-64", linear_args->no_fallback_64,
                   "Skip the fallback on 64x64 blocks");
  linear->add_flag("--no-op", linear_args->no_op, "Skip timing linear_into");
  linear->add_flag("--no-read-floor", linear_args->no_read_floor,
                   "Skip the read floor (each point's weights, activations and their scales read "
                   "once by a streaming kernel)");
  linear->add_flag("--no-ceiling", linear_args->no_ceiling,
                   "Skip the compute ceiling (cuBLASLt's FP8 GEMM of the same shape with one "
                   "scale per tensor)");
  linear
      ->add_option("--tactic", linear_args->tactics,
                   "Time only these mxq tactics (exact names; `auto` = the dispatch's choice; "
                   "`mxq linear --explain` lists them), e.g. to profile one kernel with Nsight "
                   "Compute; cuBLASLt and the other parts run as asked")
      ->delimiter(',')
      ->type_name("NAME");
  linear->add_flag("--json", linear_args->json, "Print JSON");
  linear->callback([linear_args] {
    std::vector<std::pair<int, int>> shapes;
    for (const std::string& text : linear_args->shapes) shapes.push_back(parse_nk_pair(text));
#if MXQ_WITH_CUDA
    bench::LinearBenchOptions options;
    options.preset = linear_args->preset;
    options.shapes = shapes;
    options.m = linear_args->m;
    options.repeats = linear_args->repeats;
    options.baseline = !linear_args->no_baseline;
    options.fallback_64 = !linear_args->no_fallback_64;
    options.op = !linear_args->no_op;
    options.read_floor = !linear_args->no_read_floor;
    options.ceiling = !linear_args->no_ceiling;
    for (const std::string& name : linear_args->tactics) {
      if (name != "auto" && linear::find_tactic(name) == nullptr) {
        fail_argument(ErrorCode::kInvalidArgument, "--tactic",
                      "auto or a tactic of this build (mxq linear --explain lists them)",
                      "'" + name + "'");
      }
    }
    options.tactics = linear_args->tactics;
    // Progress lines go to stderr, so --json output stays clean.
    const nlohmann::json result = bench::run_linear_bench(options, /*progress=*/true);
    if (linear_args->json) {
      print_json(result);
    } else {
      print_linear_table(result);
    }
#else
    fail(ErrorCode::kUnsupported,
         "mxq bench linear needs a CUDA build of mxq (configure with -DMXQ_CUDA=ON) and a GPU");
#endif
  });

  // A probe for kernel work (not a user-facing comparison): how fast TMA boxes of a weight matrix
  // stream into a shared-memory ring.
  struct TmaStreamArgs {
    bench::TmaStreamOptions options;
    bool json = false;
  };
  auto stream_args = std::make_shared<TmaStreamArgs>();
  auto* tma_stream = bench->add_subcommand(
      "tma-stream",
      "Probe for kernel work: stream an [N, K] byte matrix (a linear layer's FP8 weights) "
      "through 3-D TMA boxes (rows x 64 or 128 bytes x depth K-blocks) into a shared-memory ring "
      "that hands each stage back as it lands, per configuration, beside the plain read floor of "
      "the same bytes; µs, GB/s");
  tma_stream->add_option("--n", stream_args->options.n, "Rows of the matrix (N)")
      ->capture_default_str();
  tma_stream
      ->add_option("--k", stream_args->options.k, "Bytes a row (K), a multiple of the --row-bytes")
      ->capture_default_str();
  tma_stream->add_option("--rows", stream_args->options.rows, "Rows a box (multiples of 8, <= 256)")
      ->delimiter(',')
      ->capture_default_str();
  tma_stream->add_option("--depth", stream_args->options.depth, "K-blocks a box (1 to 8)")
      ->delimiter(',')
      ->capture_default_str();
  tma_stream
      ->add_option("--stages", stream_args->options.stages,
                   "Ring depths (those that do not fit 227 KB are skipped)")
      ->delimiter(',')
      ->capture_default_str();
  tma_stream
      ->add_option("--a-rows", stream_args->options.a_rows,
                   "Rows of a second box per stage from a small matrix (0: none)")
      ->delimiter(',')
      ->capture_default_str();
  tma_stream
      ->add_option("--row-bytes", stream_args->options.row_bytes,
                   "Bytes of each row a box reads per K-block, 64 (64-byte swizzle, as the MoE "
                   "GEMMs' weight boxes) or 128 (128-byte swizzle, as the linear's)")
      ->delimiter(',')
      ->capture_default_str();
  tma_stream->add_option("--repeats", stream_args->options.repeats, "Timed runs (median), >= 20")
      ->capture_default_str();
  tma_stream->add_flag("--json", stream_args->json, "Print JSON");
  tma_stream->callback([stream_args] {
    bench::check_tma_stream_options(stream_args->options);  // before any GPU, in every build
#if MXQ_WITH_CUDA
    const nlohmann::json result = bench::run_tma_stream(stream_args->options, /*progress=*/true);
    if (stream_args->json) {
      print_json(result);
    } else {
      std::printf("%s, %d SMs: N = %d, K = %d, read floor %.1f us (%.0f GB/s)\n",
                  result["gpu"].get<std::string>().c_str(), result["sm_count"].get<int>(),
                  result["n"].get<int>(), result["k"].get<int>(),
                  result["read_floor"]["total_us"].get<double>(),
                  result["read_floor"]["gbps"].get<double>());
      std::printf("%9s %5s %6s %7s %7s %7s %9s %8s %10s\n", "row_bytes", "rows", "depth", "a_rows",
                  "stages", "blocks", "us", "GB/s", "vs floor");
      for (const auto& c : result["configs"]) {
        std::printf("%9d %5d %6d %7d %7d %7d %9.1f %8.0f %9.2fx\n", c["row_bytes"].get<int>(),
                    c["rows"].get<int>(), c["depth"].get<int>(), c["a_rows"].get<int>(),
                    c["stages"].get<int>(), c["blocks"].get<int>(), c["us"].get<double>(),
                    c["gbps"].get<double>(), c["over_read_floor"].get<double>());
      }
    }
#else
    fail(ErrorCode::kUnsupported,
         "mxq bench tma-stream needs a CUDA build of mxq (configure with -DMXQ_CUDA=ON) and a GPU");
#endif
  });

  struct WgmmaRateArgs {
    bench::WgmmaRateOptions options;
    bool json = false;
  };
  auto rate_args = std::make_shared<WgmmaRateArgs>();
  auto* wgmma_rate = bench->add_subcommand(
      "wgmma-rate",
      "Probe for kernel work: how fast one SM issues wgmma at each N, as mxq's GEMM loops issue "
      "it (1 to 4 warpgroups a block, k-steps a commit group, groups left in flight by each "
      "wait), on zeros with nothing else done; ns a wgmma per SM and the TFLOPS that implies");
  wgmma_rate
      ->add_option("--kind", rate_args->options.kinds,
                   "bf16-rs (m64nNk16 bf16, A from registers: the MoE's decoded weights) or "
                   "e4m3-ss (m64nNk32 E4M3 from shared memory: the linear)")
      ->delimiter(',')
      ->capture_default_str();
  wgmma_rate->add_option("--n", rate_args->options.n, "N of the instruction: 16, 32, 64 or 128")
      ->delimiter(',')
      ->capture_default_str();
  wgmma_rate
      ->add_option("--warpgroups", rate_args->options.warpgroups, "Warpgroups a block (1 to 4)")
      ->delimiter(',')
      ->capture_default_str();
  wgmma_rate
      ->add_option("--k-steps", rate_args->options.k_steps,
                   "wgmma a commit group: 1, 2, 4 or 8 (bf16-rs with a group in flight: at most "
                   "2 at n128, 4 below; ptxas serializes more)")
      ->delimiter(',')
      ->capture_default_str();
  wgmma_rate
      ->add_option("--in-flight", rate_args->options.in_flight,
                   "Groups each wait leaves pending: 0 (serial: the chain's latency) or 1")
      ->delimiter(',')
      ->capture_default_str();
  wgmma_rate
      ->add_option("--iterations", rate_args->options.iterations,
                   "Commit groups a warpgroup issues")
      ->capture_default_str();
  wgmma_rate->add_option("--repeats", rate_args->options.repeats, "Timed runs (median), >= 20")
      ->capture_default_str();
  wgmma_rate->add_flag("--json", rate_args->json, "Print JSON");
  wgmma_rate->callback([rate_args] {
    bench::check_wgmma_rate_options(rate_args->options);  // before any GPU, in every build
#if MXQ_WITH_CUDA
    const nlohmann::json result = bench::run_wgmma_rate(rate_args->options, /*progress=*/true);
    if (rate_args->json) {
      print_json(result);
    } else {
      std::printf("%s, %d SMs: %d commit groups a warpgroup, median of %d\n",
                  result["gpu"].get<std::string>().c_str(), result["sm_count"].get<int>(),
                  result["iterations"].get<int>(), result["repeats"].get<int>());
      std::printf("%8s %4s %3s %10s %7s %9s %12s %7s\n", "kind", "n", "k", "warpgroups", "k-steps",
                  "in-flight", "ns/wgmma/SM", "TFLOPS");
      for (const auto& c : result["configs"]) {
        std::printf("%8s %4d %3d %10d %7d %9d %12.2f %7.0f\n", c["kind"].get<std::string>().c_str(),
                    c["n"].get<int>(), c["k"].get<int>(), c["warpgroups"].get<int>(),
                    c["k_steps"].get<int>(), c["in_flight"].get<int>(),
                    c["ns_per_wgmma_per_sm"].get<double>(), c["tflops"].get<double>());
      }
    }
#else
    fail(ErrorCode::kUnsupported,
         "mxq bench wgmma-rate needs a CUDA build of mxq (configure with -DMXQ_CUDA=ON) and a GPU");
#endif
  });

  moe->callback([args] {
#if MXQ_WITH_CUDA
    bench::MoeBenchOptions options;
    options.preset = args->preset;
    options.tokens = args->tokens;
    options.tp = args->tp;
    options.align = args->align;
    options.repeats = args->repeats;
    options.baseline = !args->no_baseline;
    options.all_gemm_variants = !args->default_only;
    options.w4a8 = args->w4a8;
    options.cold_l2 = args->cold_l2;
    options.read_floor = !args->no_read_floor;
    options.block_trace_path = args->block_trace;
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
