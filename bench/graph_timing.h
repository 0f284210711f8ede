// Graph-replay timing of the GPU benches: a launch captured in a CUDA graph per input set,
// replayed back to back with CUDA events around each replay, the sets rotated (so a working set
// larger than the L2 is read from HBM), median of the replays.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace mxq::bench {

// Times launch(set, stream) for `repeats` runs rotating over `sets` (after a warm-up of every
// set); falls back to direct launches when capture fails. Returns the median in microseconds.
double time_us(const std::function<void(int, cudaStream_t)>& launch, int sets, int repeats,
               cudaStream_t stream);

}  // namespace mxq::bench
