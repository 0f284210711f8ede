// The engine-facing MoE op in `mxq bench moe`: the tensor-in op (mxq::moe::mxfp4_moe) timed
// beside the layer path's launcher on the same prepared buffers, and the device preparation of a
// whole layer (prepare_mxfp4_moe from gpt-oss-layout tensors).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

namespace mxq::bench {

// Median microseconds of one forward: graph replays (one graph per input set, round-robin), and
// eager launches (no graph: the host's per-call work shows).
struct ForwardTiming {
  double graph_us = 0;
  double eager_us = 0;
};
// `enqueue(set)` enqueues one forward on input set `set` on `stream`.
using EnqueueForward = std::function<void(int set)>;
// Times two forwards against each other: their samples alternate (a, b, a, b, ...), so a clock
// that drifts during the run (a GPU warming up and lowering its clocks) moves both alike.
// `flush` runs before each timed graph replay (outside the timing).
struct ForwardPairTiming {
  ForwardTiming a;
  ForwardTiming b;
};
ForwardPairTiming time_forward_pair(const EnqueueForward& a, const EnqueueForward& b, int sets,
                                    int repeats, cudaStream_t stream,
                                    const std::function<void()>& flush);

// Median milliseconds of prepare_mxfp4_moe for TP rank 0 of `tp` (alignment `align`) of an
// E x H x I layer from gpt-oss-layout device tensors (every expert, the whole I), on `stream`.
double time_device_prepare_ms(int experts, int hidden, int intermediate, int tp, int align,
                              int repeats, cudaStream_t stream);

}  // namespace mxq::bench
