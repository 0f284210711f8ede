// `mxq bench moe`: the CUDA MXFP4 MoE forward (graph-captured, per-phase events) against a
// straightforward bf16 implementation of the same layer (router GEMM, top-k, host-side expert
// lists, per-expert cuBLAS GEMMs, activation, weighted combine) on the same GPU, same run.
#include "moe_bench.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "moe_bench_layer.h"
#include "moe_bench_op.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/core/statistics.h"
#include "mxq/moe/cuda_moe.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "mxq/moe/mxfp4_moe.h"
#include "read_floor.h"
#include "require_gpu.h"

namespace mxq::bench {
namespace {

using moe::gpu::MoeDeviceWeights;
using moe::gpu::MoeParams;
using moe::gpu::MoeRun;

constexpr const char* kBlockTraceKernelNames[] = {"routing", "gemm1", "gemm2", "combine"};
static_assert(std::size(kBlockTraceKernelNames) == moe::gpu::kMoeTraceKernels);
constexpr int kInputSets = 8;  // rotated so repeated runs do not hit the same experts in L2

struct Preset {
  const char* name;
  int experts, hidden, inter, top_k;
};
constexpr Preset kPresets[] = {{"gpt-oss-20b", 32, 2880, 2880, 4},
                               {"gpt-oss-120b", 128, 2880, 2880, 4}};

double relative_error(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& ref) {
  double num = 0.0;
  double den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto f = [](std::uint16_t b) {
      std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      return static_cast<double>(v);
    };
    num += (f(a[i]) - f(ref[i])) * (f(a[i]) - f(ref[i]));
    den += f(ref[i]) * f(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Device-to-device copy bandwidth (bytes read + written), the memory ceiling of this run.
double measure_copy_gbps(cudaStream_t stream) {
  const std::size_t bytes = std::size_t{2} << 30;
  char* a = device_alloc<char>(bytes);
  char* b = device_alloc<char>(bytes);
  cudaEvent_t start, stop;
  MXQ_CUDA_CHECK(cudaEventCreate(&start));
  MXQ_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < 12; ++i) {
    MXQ_CUDA_CHECK(cudaEventRecord(start, stream));
    MXQ_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    MXQ_CUDA_CHECK(cudaEventRecord(stop, stream));
    MXQ_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0F;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 2) times.push_back(ms);
  }
  MXQ_CUDA_CHECK(cudaFree(a));
  MXQ_CUDA_CHECK(cudaFree(b));
  MXQ_CUDA_CHECK(cudaEventDestroy(start));
  MXQ_CUDA_CHECK(cudaEventDestroy(stop));
  return 2.0 * static_cast<double>(bytes) / (median(times) * 1e-3) / 1e9;
}

}  // namespace

nlohmann::json run_moe_bench(const MoeBenchOptions& options, bool progress) {
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets) {
    if (options.preset == p.name) preset = &p;
  }
  if (preset == nullptr) {
    fail(ErrorCode::kInvalidArgument, "--preset: expected gpt-oss-20b or gpt-oss-120b, found '",
         options.preset, "'");
  }
  MXQ_CHECK(options.tp >= 1 && (preset->inter / 32) % options.tp == 0, ErrorCode::kInvalidArgument,
            "--tp: expected a divisor of ", preset->inter / 32, " (I/32), found ", options.tp);
  MXQ_CHECK(options.block_trace_path.empty() || moe::gpu::moe_block_trace_enabled(),
            ErrorCode::kUnsupported,
            "--block-trace: this build does not record the MoE block timeline (configure with "
            "-DMXQ_MOE_BLOCK_TRACE=ON)");
  require_gpu("moe");
  std::ofstream trace_file;  // opened now, so a path that cannot be written fails before the work
  if (!options.block_trace_path.empty()) {
    trace_file.open(options.block_trace_path);
    MXQ_CHECK(trace_file.good(), ErrorCode::kIo, "--block-trace: cannot write '",
              options.block_trace_path, "'");
  }
  const int experts = preset->experts;
  const int hidden = preset->hidden;
  const int inter = preset->inter / options.tp;
  const int padded = (inter + options.align - 1) / options.align * options.align;
  const int k = preset->top_k;
  const int max_tokens = *std::max_element(options.tokens.begin(), options.tokens.end());

  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = measure_copy_gbps(stream);

  // The prepared MXFP4 layer (rank 0 of TP), random but deterministic.
  const std::size_t w13_rows = static_cast<std::size_t>(experts) * 2 * padded;
  const std::size_t w2_rows = static_cast<std::size_t>(experts) * hidden;
  auto* w13 = device_alloc<std::uint8_t>(w13_rows * hidden / 2);
  auto* w13s = device_alloc<std::uint8_t>(w13_rows * hidden / 32);
  auto* w2 = device_alloc<std::uint8_t>(w2_rows * padded / 2);
  auto* w2s = device_alloc<std::uint8_t>(w2_rows * padded / 32);
  // The scales in the kernels' device layout (rows padded to moe_scale_pitch), filled below.
  auto* w13s_device = device_alloc<std::uint8_t>(w13_rows * moe::gpu::moe_scale_pitch(hidden));
  auto* w2s_device = device_alloc<std::uint8_t>(w2_rows * moe::gpu::moe_scale_pitch(padded));
  auto* b13 = device_alloc<__nv_bfloat16>(w13_rows);
  auto* b2 = device_alloc<__nv_bfloat16>(w2_rows);
  auto* router = device_alloc<__nv_bfloat16>(static_cast<std::size_t>(experts) * hidden);
  fill_fp4(w13, w13s, w13_rows, hidden, hidden, 2 * padded, inter, padded, inter, 1, stream);
  fill_fp4(w2, w2s, w2_rows, padded, inter, 1, 1, 0, 0, 2, stream);
  fill_bf16(b13, w13_rows, 0.05F, 3, stream);
  fill_bf16(b2, w2_rows, 0.05F, 4, stream);
  fill_bf16(router, static_cast<std::size_t>(experts) * hidden, 0.05F, 5, stream);
  // --cold-l2: a buffer of twice the L2 size, overwritten before each timed replay.
  std::size_t flush_bytes = 0;
  if (options.cold_l2) {
    int device = 0;
    int l2_bytes = 0;
    MXQ_CUDA_CHECK(cudaGetDevice(&device));
    MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
    flush_bytes = 2 * static_cast<std::size_t>(l2_bytes);
  }
  auto* flush_buffer = device_alloc<unsigned char>(flush_bytes);
  int flushes = 0;
  const auto flush_l2 = [&] {
    if (flush_bytes == 0) return;
    MXQ_CUDA_CHECK(cudaMemsetAsync(flush_buffer, ++flushes & 0xFF, flush_bytes, stream));
  };
  std::vector<__nv_bfloat16*> inputs(kInputSets);
  for (int s = 0; s < kInputSets; ++s) {
    inputs[s] = device_alloc<__nv_bfloat16>(static_cast<std::size_t>(max_tokens) * hidden);
    fill_bf16(inputs[s], static_cast<std::size_t>(max_tokens) * hidden, 1.0F, 100 + s, stream);
  }

  MoeDeviceWeights w;
  w.w13 = w13;
  w.w13_scale = w13s_device;
  w.w2 = w2;
  w.w2_scale = w2s_device;
  w.b13 = reinterpret_cast<const std::uint16_t*>(b13);
  w.b2 = reinterpret_cast<const std::uint16_t*>(b2);
  w.router_w = reinterpret_cast<const std::uint16_t*>(router);
  w.num_local_experts = experts;
  w.num_global_experts = experts;
  w.hidden = hidden;
  w.inter = inter;
  w.inter_padded = padded;
  MoeParams params;
  params.top_k = k;
  MoeDeviceWeights w_w4a8 = w;  // weight pointers set once converted, below
  MoeParams params_w4a8 = params;
  params_w4a8.activation_quant = moe::gpu::GpuActivationQuant::kFp8Group128;
  // One workspace for both forwards (the W4A8 one needs more).
  const std::size_t ws_bytes = options.w4a8
                                   ? moe::gpu::moe_workspace_bytes(w, params_w4a8, max_tokens)
                                   : moe::gpu::moe_workspace_bytes(w, params, max_tokens);
  void* workspace = device_alloc<char>(ws_bytes);
  moe::gpu::moe_workspace_init(workspace, max_tokens, nullptr);
  MXQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  auto* out = device_alloc<std::uint16_t>(static_cast<std::size_t>(max_tokens) * hidden);
  auto* out_base = device_alloc<std::uint16_t>(static_cast<std::size_t>(max_tokens) * hidden);

  Bf16Baseline base{experts, hidden, inter, k, nullptr, nullptr, router, nullptr, nullptr, nullptr};
  const std::size_t pairs_max = static_cast<std::size_t>(max_tokens) * k;
  float* logits = nullptr;
  int *ids = nullptr, *tos = nullptr, *eos = nullptr, *sop = nullptr;
  float* weights = nullptr;
  __nv_bfloat16 *xg = nullptr, *y1 = nullptr, *act = nullptr, *y2 = nullptr;
  if (options.baseline) {
    base.w13 = device_alloc<__nv_bfloat16>(static_cast<std::size_t>(experts) * 2 * inter * hidden);
    base.w2 = device_alloc<__nv_bfloat16>(static_cast<std::size_t>(experts) * hidden * inter);
    base.b13 = device_alloc<__nv_bfloat16>(static_cast<std::size_t>(experts) * 2 * inter);
    base.b2 = b2;
    dequant_to_bf16(w13, w13s, hidden, base.w13, static_cast<std::size_t>(experts) * 2 * inter,
                    hidden, 2 * padded, 2 * inter, inter, padded, stream);
    dequant_to_bf16(w2, w2s, padded, base.w2, w2_rows, inter, 1, 1, 1, 0, stream);
    // Compact the biases the same way (gate rows then up rows, no padding).
    for (int e = 0; e < experts; ++e) {
      MXQ_CUDA_CHECK(cudaMemcpyAsync(base.b13 + static_cast<std::size_t>(e) * 2 * inter,
                                     b13 + static_cast<std::size_t>(e) * 2 * padded, inter * 2,
                                     cudaMemcpyDeviceToDevice, stream));
      MXQ_CUDA_CHECK(cudaMemcpyAsync(base.b13 + static_cast<std::size_t>(e) * 2 * inter + inter,
                                     b13 + static_cast<std::size_t>(e) * 2 * padded + padded,
                                     inter * 2, cudaMemcpyDeviceToDevice, stream));
    }
    MXQ_CUDA_CHECK_LAUNCH();
    MXQ_CUBLAS_CHECK(cublasCreate(&base.handle));
    logits = device_alloc<float>(static_cast<std::size_t>(max_tokens) * experts);
    ids = device_alloc<int>(pairs_max);
    weights = device_alloc<float>(pairs_max);
    tos = device_alloc<int>(pairs_max);
    eos = device_alloc<int>(pairs_max);
    sop = device_alloc<int>(pairs_max);
    xg = device_alloc<__nv_bfloat16>(pairs_max * hidden);
    y1 = device_alloc<__nv_bfloat16>(pairs_max * 2 * inter);
    act = device_alloc<__nv_bfloat16>(pairs_max * inter);
    y2 = device_alloc<__nv_bfloat16>(pairs_max * hidden);
  }
  // The W4A8 forward's copy of the weights, in its layout (from the checkpoint layout).
  std::uint8_t* w13_w4a8 = nullptr;
  std::uint8_t* w2_w4a8 = nullptr;
  if (options.w4a8) {
    w13_w4a8 = device_alloc<std::uint8_t>(w13_rows * hidden / 2);
    w2_w4a8 = device_alloc<std::uint8_t>(w2_rows * padded / 2);
    MXQ_CUDA_CHECK(
        cudaMemcpyAsync(w13_w4a8, w13, w13_rows * hidden / 2, cudaMemcpyDeviceToDevice, stream));
    MXQ_CUDA_CHECK(
        cudaMemcpyAsync(w2_w4a8, w2, w2_rows * padded / 2, cudaMemcpyDeviceToDevice, stream));
    moe::gpu::moe_weights_to_w4a8_layout(w13_w4a8, w13_rows, hidden, stream);
    moe::gpu::moe_weights_to_w4a8_layout(w2_w4a8, w2_rows, padded, stream);
  }
  // mxq's kernels read packed FP4 in their device layout; the baseline dequantized the
  // checkpoint layout above.
  moe::gpu::moe_weights_to_device_layout(w13, w13_rows, hidden, stream);
  moe::gpu::moe_weights_to_device_layout(w2, w2_rows, padded, stream);
  moe::gpu::moe_scales_to_device_layout(w13s, w13_rows, hidden, w13s_device, stream);
  moe::gpu::moe_scales_to_device_layout(w2s, w2_rows, padded, w2s_device, stream);
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  w_w4a8.w13 = w13_w4a8;
  w_w4a8.w2 = w2_w4a8;

  // The same prepared buffers as the engine-facing op sees them (TP rank 0 of options.tp), with
  // its own workspace, zeroed once.
  const moe::MoeLayerShape op_layer{experts, hidden, preset->inter, true};
  moe::MoeRank op_rank{0, options.tp, 0, 1};
  op_rank.alignment = options.align;
  const moe::PreparedMoeShapes op_shapes = moe::prepared_moe_shapes(op_layer, op_rank);
  MXQ_CHECK(op_shapes.intermediate_size_per_partition_after_pad == padded, ErrorCode::kInternal,
            "bench moe: the op's padded I_rank ",
            op_shapes.intermediate_size_per_partition_after_pad, " differs from the bench's ",
            padded);
  const Device gpu = Device::cuda();
  const moe::PreparedMoe op_prepared{TensorView(w13, DType::kU8, op_shapes.w13, gpu),
                                     TensorView(w13s_device, DType::kU8, op_shapes.w13_scale, gpu),
                                     TensorView(b13, DType::kBF16, op_shapes.w13_bias, gpu),
                                     TensorView(w2, DType::kU8, op_shapes.w2, gpu),
                                     TensorView(w2s_device, DType::kU8, op_shapes.w2_scale, gpu),
                                     TensorView(b2, DType::kBF16, op_shapes.w2_bias, gpu)};
  const moe::MoeRouting op_routing{
      {}, {}, TensorView(router, DType::kBF16, {experts, hidden}, gpu), {}};
  moe::Mxfp4MoeOptions op_options;
  op_options.top_k = k;
  op_options.max_tokens = max_tokens;
  const Tensor op_workspace =
      Tensor::zeros(DType::kU8,
                    {static_cast<std::int64_t>(
                        moe::mxfp4_moe_workspace_bytes(op_layer, op_rank, op_options, gpu))},
                    gpu);
  const double prepare_ms =
      time_device_prepare_ms(experts, hidden, preset->inter, options.tp, options.align, 5, stream);

  std::vector<cudaEvent_t> events(5);
  for (auto& e : events) MXQ_CUDA_CHECK(cudaEventCreate(&e));
  cudaEvent_t start, stop;
  MXQ_CUDA_CHECK(cudaEventCreate(&start));
  MXQ_CUDA_CHECK(cudaEventCreate(&stop));
  const auto elapsed_us = [](cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0F;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1000.0F;
  };

  nlohmann::json points = nlohmann::json::array();
  nlohmann::json block_traces = nlohmann::json::array();  // --block-trace
  for (const int tokens : options.tokens) {
    if (progress) std::fprintf(stderr, "bench moe: %s T=%d ...\n", preset->name, tokens);
    MoeRun run;
    run.tokens = tokens;
    run.out_bf16 = out;
    // Touched experts per input set (from the device routing).
    double touched = 0.0;
    std::vector<int> h_ids(static_cast<std::size_t>(tokens) * k);
    std::vector<std::set<int>> set_experts(kInputSets);
    for (int s = 0; s < kInputSets; ++s) {
      run.x = reinterpret_cast<const std::uint16_t*>(inputs[s]);
      moe::gpu::moe_forward(w, params, run, workspace, ws_bytes, max_tokens, stream);
      const auto routing = moe::gpu::moe_routing_view(w, params, max_tokens, workspace);
      MXQ_CUDA_CHECK(cudaMemcpyAsync(h_ids.data(), routing.topk_ids, h_ids.size() * sizeof(int),
                                     cudaMemcpyDeviceToHost, stream));
      MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
      set_experts[s] = std::set<int>(h_ids.begin(), h_ids.end());
      touched += static_cast<double>(set_experts[s].size());
    }
    touched /= kInputSets;
    const double touched_bytes =
        touched * static_cast<double>(moe::gpu::moe_expert_weight_bytes(w));
    const double flops = 2.0 * tokens * k * (3.0 * static_cast<double>(inter) * hidden);

    // The per-block timelines of kBlockTraceReplays more replays of `graphs` (round-robin, as
    // timed), each taken right after its replay.
    const auto block_trace_replays = [&](const std::vector<cudaGraphExec_t>& graphs) {
      (void)moe::gpu::moe_block_trace_take();  // drop the timed replays' records
      nlohmann::json replays = nlohmann::json::array();
      for (int i = 0; i < kBlockTraceReplays; ++i) {
        MXQ_CUDA_CHECK(cudaGraphLaunch(graphs[i % kInputSets], stream));
        const auto kernels = moe::gpu::moe_block_trace_take();
        nlohmann::json replay;
        for (int kernel = 0; kernel < moe::gpu::kMoeTraceKernels; ++kernel) {
          nlohmann::json blocks = nlohmann::json::array();
          for (const auto& b : kernels[kernel])
            blocks.push_back({b.at_ns[0], b.at_ns[1], b.at_ns[2], b.at_ns[3], b.sm});
          replay[kBlockTraceKernelNames[kernel]] = std::move(blocks);
        }
        replays.push_back(std::move(replay));
      }
      return replays;
    };
    // Times one GEMM variant: the whole forward as one graph per input set, replayed
    // round-robin (then, with trace_replays, a few more for the block timeline); then the phases,
    // from the same graphs with event records between kernels.
    const auto measure = [&](moe::gpu::GemmVariant variant, bool programmatic_launch,
                             const MoeDeviceWeights& mw, const MoeParams& mp,
                             nlohmann::json* trace_replays = nullptr) {
      MoeParams vp = mp;
      vp.gemm = variant;
      vp.programmatic_launch = programmatic_launch;
      std::vector<cudaGraphExec_t> graphs(kInputSets);
      for (int s = 0; s < kInputSets; ++s) {
        run.x = reinterpret_cast<const std::uint16_t*>(inputs[s]);
        cudaGraph_t graph;
        MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        moe::gpu::moe_forward(mw, vp, run, workspace, ws_bytes, max_tokens, stream);
        MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        MXQ_CUDA_CHECK(cudaGraphInstantiate(&graphs[s], graph, 0));
        MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
      }
      std::vector<float> total;
      for (int i = 0; i < options.repeats + 5; ++i) {
        flush_l2();
        MXQ_CUDA_CHECK(cudaEventRecord(start, stream));
        MXQ_CUDA_CHECK(cudaGraphLaunch(graphs[i % kInputSets], stream));
        MXQ_CUDA_CHECK(cudaEventRecord(stop, stream));
        MXQ_CUDA_CHECK(cudaEventSynchronize(stop));
        if (i >= 5) total.push_back(elapsed_us(start, stop));
      }
      if (trace_replays != nullptr) *trace_replays = block_trace_replays(graphs);
      for (auto& g : graphs) MXQ_CUDA_CHECK(cudaGraphExecDestroy(g));
      // One layer inside a captured decode step: the kInputSets forwards one after the other in
      // one graph (each on its own input set, so consecutive layers touch other experts, as the
      // layers of a model do), timed as a whole and divided by kInputSets: the graph's launch
      // latency, which the total above pays once per layer, is shared as in a model's graph.
      // With cold_l2 the flush precedes each graph, so only its first layer starts cold.
      std::vector<float> in_graph;
      {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int s = 0; s < kInputSets; ++s) {
          run.x = reinterpret_cast<const std::uint16_t*>(inputs[s]);
          moe::gpu::moe_forward(mw, vp, run, workspace, ws_bytes, max_tokens, stream);
        }
        MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
        // Half the repeats (each graph holds 8 layers), at least one, after 3 warm-up launches.
        for (int i = 0; i < std::max(options.repeats / 2, 1) + 3; ++i) {
          flush_l2();
          MXQ_CUDA_CHECK(cudaEventRecord(start, stream));
          MXQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
          MXQ_CUDA_CHECK(cudaEventRecord(stop, stream));
          MXQ_CUDA_CHECK(cudaEventSynchronize(stop));
          if (i >= 3) in_graph.push_back(elapsed_us(start, stop) / kInputSets);
        }
        MXQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
      }
      // Phases: the same graphs with event records between the kernels (captured, so the host's
      // launch rate does not stretch the small decode phases as eager launches would; the event
      // nodes also serialize the kernels, so the phases add up to a little more than the total).
      std::vector<std::vector<float>> phase(4);
      run.phase_events = events.data();
      for (int s = 0; s < kInputSets; ++s) {
        run.x = reinterpret_cast<const std::uint16_t*>(inputs[s]);
        cudaGraph_t graph;
        MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        moe::gpu::moe_forward(mw, vp, run, workspace, ws_bytes, max_tokens, stream);
        MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        MXQ_CUDA_CHECK(cudaGraphInstantiate(&graphs[s], graph, 0));
        MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
      }
      run.phase_events = nullptr;
      for (int i = 0; i < options.repeats + 5; ++i) {
        MXQ_CUDA_CHECK(cudaGraphLaunch(graphs[i % kInputSets], stream));
        MXQ_CUDA_CHECK(cudaEventSynchronize(events[4]));
        if (i < 5) continue;
        for (int p = 0; p < 4; ++p) phase[p].push_back(elapsed_us(events[p], events[p + 1]));
      }
      for (auto& g : graphs) MXQ_CUDA_CHECK(cudaGraphExecDestroy(g));
      const double us = median(total);
      return nlohmann::json{
          {"gemm_variant", moe::gpu::to_string(variant)},
          {"resolved_variant", moe::gpu::to_string(moe::gpu::resolve_gemm_variant(mw, vp, tokens))},
          {"programmatic_launch", programmatic_launch},
          {"total_us", us},
          {"layer_in_graph_us", median(in_graph)},
          {"routing_us", median(phase[0])},
          {"gemm1_us", median(phase[1])},
          {"gemm2_us", median(phase[2])},
          {"combine_us", median(phase[3])},
          {"touched_experts", touched},
          {"touched_weight_bytes", touched_bytes},
          {"effective_gbps", touched_bytes / (us * 1e-6) / 1e9},
          {"pct_of_copy_ceiling", 100.0 * touched_bytes / (us * 1e-6) / 1e9 / copy_gbps},
          {"tflops", flops / (us * 1e-6) / 1e12}};
    };
    nlohmann::json trace_replays;
    nlohmann::json point = {
        {"tokens", tokens},
        {"mxq", measure(moe::gpu::GemmVariant::kAuto, true, w, params,
                        options.block_trace_path.empty() ? nullptr : &trace_replays)}};
    {
      // The tensor-in op against the layer path's launcher, same buffers, samples alternating.
      const auto x_of = [&](int s) {
        return TensorView(inputs[static_cast<std::size_t>(s)], DType::kBF16, {tokens, hidden}, gpu);
      };
      const TensorView op_out(out, DType::kBF16, {tokens, hidden}, gpu);
      const ForwardPairTiming pair = time_forward_pair(
          [&](int s) {
            run.x = reinterpret_cast<const std::uint16_t*>(inputs[static_cast<std::size_t>(s)]);
            moe::gpu::moe_forward(w, params, run, workspace, ws_bytes, max_tokens, stream);
          },
          [&](int s) {
            moe::mxfp4_moe(x_of(s), op_prepared, op_layer, op_rank, op_routing, op_options, op_out,
                           op_workspace, stream);
          },
          kInputSets, options.repeats, stream, flush_l2);
      const ForwardTiming& layer_path = pair.a;
      const ForwardTiming& op = pair.b;
      point["op"] = {{"graph_us", op.graph_us},
                     {"eager_us", op.eager_us},
                     {"layer_path_graph_us", layer_path.graph_us},
                     {"layer_path_eager_us", layer_path.eager_us},
                     {"graph_ratio", op.graph_us / layer_path.graph_us},
                     {"eager_ratio", op.eager_us / layer_path.eager_us}};
    }
    if (options.read_floor) {
      // What the layer must read, with nothing else to do: each input set's experts' GEMM1
      // rows, scales and biases in one pass, then their GEMM2 rows, scales and biases.
      std::vector<ReadPasses> sets;
      for (const std::set<int>& chosen : set_experts) {
        ReadPasses passes(2);
        for (const int e : chosen) {
          const std::size_t gate = static_cast<std::size_t>(e) * 2 * padded;
          for (const std::size_t row : {gate, gate + padded}) {
            passes[0].push_back(
                {w13 + row * hidden / 2, static_cast<std::size_t>(inter) * hidden / 2});
            passes[0].push_back(
                {w13s_device + row * moe::gpu::moe_scale_pitch(hidden),
                 static_cast<std::size_t>(inter) * moe::gpu::moe_scale_pitch(hidden)});
            passes[0].push_back({b13 + row, static_cast<std::size_t>(inter) * 2});
          }
          const std::size_t row = static_cast<std::size_t>(e) * hidden;
          passes[1].push_back(
              {w2 + row * padded / 2, static_cast<std::size_t>(hidden) * padded / 2});
          passes[1].push_back(
              {w2s_device + row * moe::gpu::moe_scale_pitch(padded),
               static_cast<std::size_t>(hidden) * moe::gpu::moe_scale_pitch(padded)});
          passes[1].push_back({b2 + row, static_cast<std::size_t>(hidden) * 2});
        }
        sets.push_back(std::move(passes));
      }
      const ReadFloor floor = time_read_floor(sets, options.repeats, stream, flush_l2);
      const double us = point["mxq"]["total_us"].get<double>();
      point["read_floor"] = {{"bytes", floor.bytes},
                             {"total_us", floor.total_us},
                             {"in_graph_us", floor.in_graph_us},
                             {"gbps", floor.bytes / (floor.total_us * 1e-6) / 1e9},
                             {"blocks_per_sm", floor.blocks_per_sm},
                             {"one_pass_us", floor.one_pass_us},
                             {"layer_over_floor", us / floor.total_us}};
    }
    if (!options.block_trace_path.empty()) {
      block_traces.push_back({{"tokens", tokens},
                              {"resolved_variant", point["mxq"]["resolved_variant"]},
                              {"replays", std::move(trace_replays)}});
    }
    if (options.all_gemm_variants) {
      using moe::gpu::GemmVariant;
      point["mxq_decode_mma"] = measure(GemmVariant::kDecodeMma, true, w, params);
      point["mxq_prefill_wgmma"] = measure(GemmVariant::kPrefillWgmma, true, w, params);
      // Same-run ablation: the default tactic in plain stream order.
      point["mxq_no_pdl"] = measure(GemmVariant::kAuto, false, w, params);
    }
    if (options.w4a8) {
      point["mxq_w4a8"] = measure(moe::gpu::GemmVariant::kAuto, true, w_w4a8, params_w4a8);
      if (options.all_gemm_variants) {
        using moe::gpu::GemmVariant;
        point["mxq_w4a8_decode_mma"] = measure(GemmVariant::kDecodeMma, true, w_w4a8, params_w4a8);
        point["mxq_w4a8_prefill_wgmma"] =
            measure(GemmVariant::kPrefillWgmma, true, w_w4a8, params_w4a8);
      }
    }
    const double us = point["mxq"]["total_us"].get<double>();
    if (options.baseline) {
      std::vector<float> base_times;
      for (int i = 0; i < std::max(10, options.repeats / 2) + 3; ++i) {
        const __nv_bfloat16* x = inputs[i % kInputSets];
        flush_l2();
        MXQ_CUDA_CHECK(cudaEventRecord(start, stream));
        base.forward(x, tokens, reinterpret_cast<__nv_bfloat16*>(out_base), stream, logits, ids,
                     weights, tos, eos, sop, xg, y1, act, y2);
        MXQ_CUDA_CHECK(cudaEventRecord(stop, stream));
        MXQ_CUDA_CHECK(cudaEventSynchronize(stop));
        if (i >= 3) base_times.push_back(elapsed_us(start, stop));
      }
      // Agreement check on input set 0 (bf16 intermediates differ slightly by design).
      run.x = reinterpret_cast<const std::uint16_t*>(inputs[0]);
      moe::gpu::moe_forward(w, params, run, workspace, ws_bytes, max_tokens, stream);
      base.forward(inputs[0], tokens, reinterpret_cast<__nv_bfloat16*>(out_base), stream, logits,
                   ids, weights, tos, eos, sop, xg, y1, act, y2);
      std::vector<std::uint16_t> a(static_cast<std::size_t>(tokens) * hidden), b(a.size());
      MXQ_CUDA_CHECK(cudaMemcpyAsync(a.data(), out, a.size() * 2, cudaMemcpyDeviceToHost, stream));
      MXQ_CUDA_CHECK(
          cudaMemcpyAsync(b.data(), out_base, b.size() * 2, cudaMemcpyDeviceToHost, stream));
      MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
      const double bus = median(base_times);
      const double base_bytes = touched * (3.0 * inter * hidden * 2.0);
      point["baseline_bf16"] = {{"total_us", bus},
                                {"weight_bytes", base_bytes},
                                {"effective_gbps", base_bytes / (bus * 1e-6) / 1e9},
                                {"tflops", flops / (bus * 1e-6) / 1e12}};
      point["speedup_vs_baseline"] = bus / us;
      point["relative_difference_vs_baseline"] = relative_error(a, b);
    }
    points.push_back(point);
  }
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!options.block_trace_path.empty()) {
    const nlohmann::json trace = {
        {"preset", preset->name},
        {"points_format",
         "per block: [start, released, mid, end, sm], %globaltimer ns, 0 = not "
         "reached (include/mxq/moe/cuda_moe_trace.h)"},
        {"points", block_traces}};
    trace_file << trace.dump() << "\n";
    trace_file.flush();
    MXQ_CHECK(trace_file.good(), ErrorCode::kIo, "--block-trace: cannot write '",
              options.block_trace_path, "'");
  }
  cudaDeviceProp props{};
  MXQ_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
  return {{"gpu", props.name},
          {"sm_count", props.multiProcessorCount},
          {"preset", preset->name},
          {"experts", experts},
          {"hidden", hidden},
          {"intermediate_per_rank", inter},
          {"intermediate_padded", padded},
          {"top_k", k},
          {"tp", options.tp},
          {"copy_ceiling_gbps", copy_gbps},
          {"cold_l2", options.cold_l2},
          {"device_prepare_ms", prepare_ms},
          {"points", points}};
}

}  // namespace mxq::bench
