// The engine-facing MoE op's timings for `mxq bench moe` (moe_bench_op.h).
#include "moe_bench_op.h"

#include <cstdint>
#include <vector>

#include "moe_bench_layer.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/statistics.h"
#include "mxq/moe/mxfp4_moe.h"

namespace mxq::bench {
namespace {

constexpr int kWarmup = 5;

// Device events around a stretch of stream work.
class EventPair {
 public:
  EventPair() {
    MXQ_CUDA_CHECK(cudaEventCreate(&start_));
    MXQ_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventPair() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  void start(cudaStream_t stream) { MXQ_CUDA_CHECK(cudaEventRecord(start_, stream)); }
  // Milliseconds since start(), once the stream got there.
  float stop(cudaStream_t stream) {
    MXQ_CUDA_CHECK(cudaEventRecord(stop_, stream));
    MXQ_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0F;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace

namespace {

// One graph per input set, each holding one forward.
std::vector<cudaGraphExec_t> capture_per_set(const EnqueueForward& enqueue, int sets,
                                             cudaStream_t stream) {
  std::vector<cudaGraphExec_t> graphs(static_cast<std::size_t>(sets));
  for (int s = 0; s < sets; ++s) {
    cudaGraph_t graph;
    MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueue(s);
    MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    MXQ_CUDA_CHECK(cudaGraphInstantiate(&graphs[static_cast<std::size_t>(s)], graph, 0));
    MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  return graphs;
}

}  // namespace

ForwardPairTiming time_forward_pair(const EnqueueForward& a, const EnqueueForward& b, int sets,
                                    int repeats, cudaStream_t stream,
                                    const std::function<void()>& flush) {
  EventPair events;
  const EnqueueForward* const forwards[2] = {&a, &b};
  std::vector<cudaGraphExec_t> graphs[2] = {capture_per_set(a, sets, stream),
                                            capture_per_set(b, sets, stream)};
  std::vector<float> graph_us[2];
  std::vector<float> eager_us[2];
  for (int i = 0; i < repeats + kWarmup; ++i) {
    for (int f = 0; f < 2; ++f) {
      flush();
      events.start(stream);
      MXQ_CUDA_CHECK(cudaGraphLaunch(graphs[f][static_cast<std::size_t>(i % sets)], stream));
      const float ms = events.stop(stream);
      if (i >= kWarmup) graph_us[f].push_back(ms * 1000.0F);
    }
  }
  // Eager: `sets` forwards back to back per sample (the host enqueues while the device runs, as
  // an engine without graphs does), per forward.
  for (int i = 0; i < repeats + kWarmup; ++i) {
    for (int f = 0; f < 2; ++f) {
      events.start(stream);
      for (int s = 0; s < sets; ++s) (*forwards[f])(s);
      const float ms = events.stop(stream);
      if (i >= kWarmup) eager_us[f].push_back(ms * 1000.0F / static_cast<float>(sets));
    }
  }
  ForwardPairTiming timing;
  ForwardTiming* const out[2] = {&timing.a, &timing.b};
  for (int f = 0; f < 2; ++f) {
    for (cudaGraphExec_t g : graphs[f]) MXQ_CUDA_CHECK(cudaGraphExecDestroy(g));
    out[f]->graph_us = median(graph_us[f]);
    out[f]->eager_us = median(eager_us[f]);
  }
  return timing;
}

double time_device_prepare_ms(int experts, int hidden, int intermediate, int tp, int align,
                              int repeats, cudaStream_t stream) {
  const moe::MoeLayerShape layer{experts, hidden, intermediate, true};
  moe::MoeRank rank{0, tp, 0, 1};
  rank.alignment = align;
  const moe::PreparedMoeShapes shapes = moe::prepared_moe_shapes(layer, rank);
  const std::int64_t e = experts, h = hidden, i = intermediate;
  // The checkpoint's tensors (gpt-oss layout; the bytes do not change the work) and the rank's.
  const Device gpu = Device::cuda();
  const auto make = [&](DType dtype, Shape shape) { return Tensor::zeros(dtype, shape, gpu); };
  const Tensor in[6] = {
      make(DType::kU8, {e, 2 * i, h / 32, 16}), make(DType::kU8, {e, 2 * i, h / 32}),
      make(DType::kBF16, {e, 2 * i}),           make(DType::kU8, {e, h, i / 32, 16}),
      make(DType::kU8, {e, h, i / 32}),         make(DType::kBF16, {e, h})};
  const Tensor out[6] = {make(DType::kU8, shapes.w13),        make(DType::kU8, shapes.w13_scale),
                         make(DType::kBF16, shapes.w13_bias), make(DType::kU8, shapes.w2),
                         make(DType::kU8, shapes.w2_scale),   make(DType::kBF16, shapes.w2_bias)};
  const moe::MoeExpertTensors experts_in{
      moe::CheckpointLayout::kGptOss, in[0], in[1], in[2], in[3], in[4], in[5]};
  const moe::PreparedMoe prepared{out[0], out[1], out[2], out[3], out[4], out[5]};
  EventPair events;
  std::vector<float> ms;
  for (int r = 0; r < repeats + 1; ++r) {
    events.start(stream);
    moe::prepare_mxfp4_moe(experts_in, layer, rank, prepared, stream);
    const float t = events.stop(stream);
    if (r >= 1) ms.push_back(t);
  }
  return median(ms);
}

}  // namespace mxq::bench
