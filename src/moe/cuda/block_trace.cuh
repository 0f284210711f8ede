// An opt-in timeline of the MoE forward's blocks, for performance work (docs/PERF.md, "T=1 block by
// block"): in a build configured with -DMXQ_MOE_BLOCK_TRACE=ON, thread 0 of each block of the
// routing kernel, the decode_mma GEMMs and the combine kernel records %globaltimer (ns, in
// 32 ns steps on an H200) at up to four points of its life (gpu::MoeTracePoint), and
// gpu::moe_block_trace_take reads them back. In the default build every trace call compiles to
// nothing, so the kernels are unchanged.
//
// The records live in a static device array of each translation unit that includes this header
// (launch_routing.cu, launch_decode.cu, launch_combine.cu: each kernel records in its own unit's
// array, and gpu::moe_block_trace_take gathers the three through take_translation_unit_trace); a
// block past kMoeTraceMaxBlocks of its grid is not recorded.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mxq/core/cuda_check.h"
#include "mxq/moe/cuda_moe_trace.h"

#ifndef MXQ_MOE_BLOCK_TRACE
#define MXQ_MOE_BLOCK_TRACE 0
#endif

namespace mxq::moe::gpu::detail {

#if MXQ_MOE_BLOCK_TRACE
static __device__ MoeBlockTraceRecord g_block_trace[kMoeTraceKernels][kMoeTraceMaxBlocks];
#endif

// This translation unit's records into `all` [kMoeTraceKernels * kMoeTraceMaxBlocks] where a
// block started (the kernels of one unit are recorded nowhere else), then cleared. Waits for the
// device. Nothing in a build without the trace.
[[maybe_unused]] static void take_translation_unit_trace(MoeBlockTraceRecord* all) {
#if MXQ_MOE_BLOCK_TRACE
  const std::size_t count = static_cast<std::size_t>(kMoeTraceKernels) * kMoeTraceMaxBlocks;
  std::vector<MoeBlockTraceRecord> mine(count);
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  MXQ_CUDA_CHECK(
      cudaMemcpyFromSymbol(mine.data(), g_block_trace, count * sizeof(MoeBlockTraceRecord)));
  void* records = nullptr;
  MXQ_CUDA_CHECK(cudaGetSymbolAddress(&records, g_block_trace));
  MXQ_CUDA_CHECK(cudaMemset(records, 0, count * sizeof(MoeBlockTraceRecord)));
  for (std::size_t i = 0; i < count; ++i) {
    if (mine[i].at_ns[0] != 0) all[i] = mine[i];
  }
#else
  (void)all;
#endif
}

// Records the time of `point` for this block (thread 0 only; the caller makes sure thread 0 gets
// there). kAfterBarrier: first wait for the whole block, so the time is when its last thread
// arrived (the trace build only: a barrier the default build does not have).
template <bool kAfterBarrier = false>
__device__ __forceinline__ void trace_block(MoeTraceKernel kernel, MoeTracePoint point) {
#if MXQ_MOE_BLOCK_TRACE
  if constexpr (kAfterBarrier) __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (block >= static_cast<unsigned>(kMoeTraceMaxBlocks)) return;
  MoeBlockTraceRecord& record = g_block_trace[static_cast<int>(kernel)][block];
  std::uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  record.at_ns[static_cast<int>(point)] = now;
  if (point == MoeTracePoint::kStart) {
    std::uint32_t sm = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    record.sm = sm;
  }
#else
  (void)kernel;
  (void)point;
#endif
}

}  // namespace mxq::moe::gpu::detail
