// Graph-replay timing of the GPU benches (graph_timing.h).
#include "graph_timing.h"

#include <algorithm>
#include <vector>

#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/core/statistics.h"

namespace mxq::bench {

// Times launch(set) for `repeats` runs rotating over `sets`: a CUDA graph per set replayed
// back to back with events around each replay (falls back to direct launches when capture
// fails). Returns the median in microseconds.
double time_us(const std::function<void(int, cudaStream_t)>& launch, int sets, int repeats,
               cudaStream_t stream) {
  std::vector<cudaGraphExec_t> graphs(static_cast<std::size_t>(sets), nullptr);
  bool use_graphs = true;
  for (int s = 0; s < sets && use_graphs; ++s) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      use_graphs = false;
      break;
    }
    bool launched = true;
    try {
      launch(s, stream);
    } catch (const Error&) {
      launched = false;
    }
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (!launched || end != cudaSuccess ||
        cudaGraphInstantiate(&graphs[static_cast<std::size_t>(s)], graph, 0) != cudaSuccess) {
      use_graphs = false;
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  (void)cudaGetLastError();  // a failed capture leaves an error behind; direct launches follow
  const auto run = [&](int s) {
    if (use_graphs) {
      MXQ_CUDA_CHECK(cudaGraphLaunch(graphs[static_cast<std::size_t>(s)], stream));
    } else {
      launch(s, stream);
    }
  };
  for (int i = 0; i < std::max(3, sets); ++i) run(i % sets);  // warm-up
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> events(static_cast<std::size_t>(2 * repeats));
  for (auto& e : events) MXQ_CUDA_CHECK(cudaEventCreate(&e));
  for (int r = 0; r < repeats; ++r) {
    MXQ_CUDA_CHECK(cudaEventRecord(events[static_cast<std::size_t>(2 * r)], stream));
    run(r % sets);
    MXQ_CUDA_CHECK(cudaEventRecord(events[static_cast<std::size_t>(2 * r + 1)], stream));
  }
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    float ms = 0.0F;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&ms, events[static_cast<std::size_t>(2 * r)],
                                        events[static_cast<std::size_t>(2 * r + 1)]));
    times.push_back(static_cast<double>(ms) * 1e3);
  }
  for (auto& e : events) MXQ_CUDA_CHECK(cudaEventDestroy(e));
  for (auto& g : graphs) {
    if (g != nullptr) MXQ_CUDA_CHECK(cudaGraphExecDestroy(g));
  }
  return median(times);
}

}  // namespace mxq::bench
