// The read floor of `mxq bench moe`: how fast this GPU reads exactly the bytes a layer must read,
// with nothing else to do. A streaming kernel reads each pass's byte ranges once (16-byte loads,
// several in flight a thread) and the passes run one after the other, as the layer's GEMMs do;
// the time is what the layer's kernels compete against at small T, where the memory system's
// ramp and the kernel boundaries, not the copy ceiling, set the floor.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace mxq::bench {

struct DeviceRange {
  const void* begin;  // 16-byte aligned
  std::size_t bytes;  // a multiple of 16
};

// One input set's reads: passes[p] is read by one kernel, after pass p - 1's kernel.
using ReadPasses = std::vector<std::vector<DeviceRange>>;

struct ReadFloor {
  double bytes = 0;        // per input set, averaged
  double total_us = 0;     // one graph launch per set, rotated (as the layer's total_us)
  double in_graph_us = 0;  // every set's passes in one graph, divided by the sets
  int blocks_per_sm = 0;   // the streaming grid that gave the smallest total_us
  // Every pass's bytes in one kernel (one graph launch per set, same grid): a bound for any layer,
  // even one that fetched GEMM2's weights while GEMM1 ran.
  double one_pass_us = 0;
};

// Times the passes of every input set (sets rotated across replays; median of `repeats`), for
// a few grid sizes, and returns the fastest. before_each runs before each timed launch (an L2
// flush, or nothing), outside the timed events.
ReadFloor time_read_floor(const std::vector<ReadPasses>& sets, int repeats, cudaStream_t stream,
                          const std::function<void()>& before_each);

}  // namespace mxq::bench
