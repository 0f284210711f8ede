// The read floor of `mxq bench moe` (read_floor.h).
#include "read_floor.h"

#include <algorithm>
#include <cstdint>

#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/core/statistics.h"

namespace mxq::bench {
namespace {

struct UnitRange {
  const uint4* begin;
  std::uint64_t units;  // 16-byte units
};

constexpr int kReadThreads = 512;
constexpr int kReadBatch = 8;        // loads in flight a thread
constexpr int kSharedRanges = 1024;  // a pass of at most this many ranges reads its table from smem

// Reads every 16-byte unit of `ranges` once: thread i takes units i, i + N, ... of the ranges
// laid end to end (so a warp's loads are 512 contiguous bytes), kReadBatch of them in flight, and
// folds them into one word stored only when it equals an arbitrary constant (no load is dead).
// The range table is staged in shared memory when it fits, else read from global memory (L1).
__global__ void __launch_bounds__(kReadThreads)
    read_ranges_kernel(const UnitRange* ranges, int count, std::uint64_t total_units,
                       unsigned* sink) {
  __shared__ UnitRange staged[kSharedRanges];
  const UnitRange* shared = ranges;
  if (count <= kSharedRanges) {  // uniform over the block
    for (int r = static_cast<int>(threadIdx.x); r < count; r += blockDim.x) staged[r] = ranges[r];
    __syncthreads();
    shared = staged;
  }
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  std::uint64_t u = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int r = 0;
  std::uint64_t range_first = 0;  // unit index of range r's first unit
  unsigned fold = 0;
  while (u < total_units) {
    uint4 v[kReadBatch];
#pragma unroll
    for (int b = 0; b < kReadBatch; ++b) {
      const std::uint64_t unit = u + b * stride;
      if (unit < total_units) {
        while (unit >= range_first + shared[r].units) range_first += shared[r++].units;
        v[b] = __ldg(shared[r].begin + (unit - range_first));
      } else {
        v[b] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int b = 0; b < kReadBatch; ++b) fold ^= v[b].x ^ v[b].y ^ v[b].z ^ v[b].w;
    u += kReadBatch * stride;
  }
  if (fold == 0x9E3779B9U) *sink = fold;
}

// A pass's ranges sorted by address, adjoining ones merged (the touched experts' rows of one
// tensor are one range where the experts are consecutive): the same bytes in fewer ranges.
std::vector<DeviceRange> coalesce(std::vector<DeviceRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const DeviceRange& a, const DeviceRange& b) {
    return static_cast<const char*>(a.begin) < static_cast<const char*>(b.begin);
  });
  std::vector<DeviceRange> out;
  for (const DeviceRange& range : ranges) {
    if (range.bytes == 0) continue;
    if (!out.empty() &&
        static_cast<const char*>(out.back().begin) + out.back().bytes == range.begin) {
      out.back().bytes += range.bytes;
    } else {
      out.push_back(range);
    }
  }
  return out;
}

struct DevicePass {
  const UnitRange* ranges;
  int count;
  std::uint64_t units;
};

}  // namespace

ReadFloor time_read_floor(const std::vector<ReadPasses>& sets, int repeats, cudaStream_t stream,
                          const std::function<void()>& before_each) {
  MXQ_CHECK(!sets.empty(), ErrorCode::kInvalidArgument, "read floor: no input sets");
  // Every pass's ranges in one device array.
  std::vector<UnitRange> host;
  std::vector<std::vector<DevicePass>> passes(sets.size());
  double bytes = 0;
  std::vector<ReadPasses> coalesced(sets.size());
  for (std::size_t s = 0; s < sets.size(); ++s) {
    for (const auto& pass : sets[s]) {
      for (const DeviceRange& range : pass) {
        MXQ_CHECK(reinterpret_cast<std::uintptr_t>(range.begin) % 16 == 0 && range.bytes % 16 == 0,
                  ErrorCode::kInvalidArgument, "read floor: ranges must be 16-byte aligned");
        bytes += static_cast<double>(range.bytes);
      }
      coalesced[s].push_back(coalesce(pass));
    }
  }
  for (const ReadPasses& set : coalesced) {
    for (const auto& pass : set) {
      for (const DeviceRange& range : pass) {
        host.push_back({static_cast<const uint4*>(range.begin), range.bytes / 16});
      }
    }
  }
  UnitRange* device = nullptr;
  unsigned* sink = nullptr;
  MXQ_CUDA_CHECK(cudaMalloc(&device, std::max<std::size_t>(host.size(), 1) * sizeof(UnitRange)));
  MXQ_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  MXQ_CUDA_CHECK(
      cudaMemcpy(device, host.data(), host.size() * sizeof(UnitRange), cudaMemcpyHostToDevice));
  std::size_t at = 0;
  std::vector<DevicePass> merged(sets.size());  // a set's passes as one (their ranges adjoin)
  for (std::size_t s = 0; s < sets.size(); ++s) {
    merged[s] = {device + at, 0, 0};
    for (const auto& pass : coalesced[s]) {
      std::uint64_t units = 0;
      for (std::size_t r = 0; r < pass.size(); ++r) units += host[at + r].units;
      passes[s].push_back({device + at, static_cast<int>(pass.size()), units});
      merged[s].count += static_cast<int>(pass.size());
      merged[s].units += units;
      at += pass.size();
    }
  }

  int device_id = 0;
  int sms = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device_id));
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_id));
  cudaEvent_t start, stop;
  MXQ_CUDA_CHECK(cudaEventCreate(&start));
  MXQ_CUDA_CHECK(cudaEventCreate(&stop));
  const auto elapsed_us = [&] {
    float ms = 0.0F;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1000.0F;
  };
  const auto enqueue = [&](const std::vector<DevicePass>& set, int blocks) {
    for (const DevicePass& p : set) {
      read_ranges_kernel<<<blocks, kReadThreads, 0, stream>>>(p.ranges, p.count, p.units, sink);
      MXQ_CUDA_CHECK_LAUNCH();
    }
  };
  const auto capture = [&](const std::function<void()>& work) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    work();
    MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
  };
  const auto timed = [&](cudaGraphExec_t exec) {
    before_each();
    MXQ_CUDA_CHECK(cudaEventRecord(start, stream));
    MXQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MXQ_CUDA_CHECK(cudaEventRecord(stop, stream));
    MXQ_CUDA_CHECK(cudaEventSynchronize(stop));
    return elapsed_us();
  };

  ReadFloor best;
  best.bytes = bytes / static_cast<double>(sets.size());
  const int n = static_cast<int>(sets.size());
  for (const int blocks_per_sm : {1, 2, 4}) {
    const int blocks = blocks_per_sm * sms;
    std::vector<cudaGraphExec_t> graphs;
    for (const auto& set : passes) graphs.push_back(capture([&] { enqueue(set, blocks); }));
    std::vector<float> total;
    for (int i = 0; i < repeats + 5; ++i) {
      const float us = timed(graphs[i % n]);
      if (i >= 5) total.push_back(us);
    }
    const cudaGraphExec_t all = capture([&] {
      for (const auto& set : passes) enqueue(set, blocks);
    });
    std::vector<float> in_graph;
    for (int i = 0; i < std::max(repeats / 2, 1) + 3; ++i) {
      const float us = timed(all) / static_cast<float>(n);
      if (i >= 3) in_graph.push_back(us);
    }
    std::vector<cudaGraphExec_t> one_pass;
    for (const DevicePass& set : merged)
      one_pass.push_back(capture([&] { enqueue({set}, blocks); }));
    std::vector<float> one;
    for (int i = 0; i < repeats + 5; ++i) {
      const float us = timed(one_pass[i % n]);
      if (i >= 5) one.push_back(us);
    }
    for (auto& g : graphs) MXQ_CUDA_CHECK(cudaGraphExecDestroy(g));
    for (auto& g : one_pass) MXQ_CUDA_CHECK(cudaGraphExecDestroy(g));
    MXQ_CUDA_CHECK(cudaGraphExecDestroy(all));
    if (best.blocks_per_sm == 0 || median(total) < best.total_us) {
      best.total_us = median(total);
      best.in_graph_us = median(in_graph);
      best.blocks_per_sm = blocks_per_sm;
    }
    best.one_pass_us =
        best.one_pass_us == 0 ? median(one) : std::min<double>(best.one_pass_us, median(one));
  }
  MXQ_CUDA_CHECK(cudaEventDestroy(start));
  MXQ_CUDA_CHECK(cudaEventDestroy(stop));
  MXQ_CUDA_CHECK(cudaFree(device));
  MXQ_CUDA_CHECK(cudaFree(sink));
  return best;
}

}  // namespace mxq::bench
