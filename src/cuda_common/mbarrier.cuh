// mbarrier (sm_90): init, the fences that publish it to the async proxy (TMA) and other threads,
// arrivals with expected transaction bytes, and a bounded wait.
#pragma once

#include <cstdint>

#include "cuda_common/smem.cuh"

namespace mxq::ptx {

__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// Makes the initialised barriers visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// Barriers by shared-memory address (smem_addr), for loops that keep the addresses in registers.
__device__ __forceinline__ void mbarrier_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
  mbarrier_arrive(smem_addr(bar));
}

// Blocks until the phase with the given parity has completed. The polling loop lives inside one
// asm statement, so the compiler sees no divergent branch while wgmma are in flight (a
// divergent path there makes ptxas serialize the wgmma, C7518). A wait that never ends (a TMA
// that faulted, a broken pipeline) traps after 2^26 polls instead of hanging the GPU: every
// legitimate wait here is a few microseconds. TRY_WAIT is the try_wait instruction (its scope).
#define MXQ_MBARRIER_WAIT_LOOP(TRY_WAIT) \
  "{\n"                                  \
  ".reg .pred done;\n"                   \
  ".reg .u32 polls;\n"                   \
  "mov.u32 polls, 0;\n"                  \
  "MXQ_WAIT_LOOP:\n" TRY_WAIT            \
  " done, [%0], %1;\n"                   \
  "@done bra MXQ_WAIT_DONE;\n"           \
  "add.u32 polls, polls, 1;\n"           \
  "setp.lt.u32 done, polls, 67108864;\n" \
  "@done bra MXQ_WAIT_LOOP;\n"           \
  "trap;\n"                              \
  "MXQ_WAIT_DONE:\n"                     \
  "}\n"

__device__ __forceinline__ void mbarrier_wait(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(MXQ_MBARRIER_WAIT_LOOP("mbarrier.try_wait.parity.shared::cta.b64")::"r"(bar),
               "r"(parity)
               : "memory");
}
// The same wait acquiring at cluster scope: for a barrier that blocks of the cluster arrive on
// (their release.cluster arrivals order their reads before what follows the wait).
__device__ __forceinline__ void mbarrier_wait_cluster(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(
      MXQ_MBARRIER_WAIT_LOOP("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64")::"r"(bar),
      "r"(parity)
      : "memory");
}
#undef MXQ_MBARRIER_WAIT_LOOP
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, std::uint32_t parity) {
  mbarrier_wait(smem_addr(bar), parity);
}
__device__ __forceinline__ void mbarrier_wait_cluster(std::uint64_t* bar, std::uint32_t parity) {
  mbarrier_wait_cluster(smem_addr(bar), parity);
}

}  // namespace mxq::ptx
