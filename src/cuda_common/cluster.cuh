// Thread-block clusters (sm_90): the block's rank in its cluster, a whole-cluster barrier, an
// mbarrier arrival on another block's barrier and a load from another block's shared memory
// (distributed shared memory). TMA multicast loads are in tma.cuh.
#pragma once

#include <cstdint>

#include "cuda_common/smem.cuh"

namespace mxq::ptx {

__device__ __forceinline__ std::uint32_t cluster_ctarank() {
  std::uint32_t rank = 0;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every block of the cluster arrives and waits: after it, the barriers another
// block initialised may be targeted (release/acquire at cluster scope), and before a block exits,
// no peer still arrives on or copies into its shared memory.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::
          : "memory");
}

// Arrives on the mbarrier at the same shared-memory offset as `bar` in the cluster's block `cta`
// (which may be this block), with the instruction's default semantics: release at CTA scope,
// which orders this thread's earlier reads of its own shared memory (a stage handed back to a
// producer that will write into it: CUTLASS's consumer release). It compiles to the bare
// SYNCS.ARRIVE; `.release.cluster` adds MEMBAR.ALL.GPU before every arrival (sm_90a SASS), which
// the 2-block cluster tile paid twice per warp and K-block.
__device__ __forceinline__ void mbarrier_arrive_remote(std::uint64_t* bar, std::uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

// Arrives on the mbarrier at the same shared-memory offset as `bar` in the cluster's block `cta`,
// releasing at cluster scope what this thread wrote or read before (and, after a CTA barrier, what
// the threads it synchronized with did): the peer that acquires the barrier at cluster scope then
// sees those writes of shared memory (or may overwrite what was read). MEMBAR.ALL.GPU +
// SYNCS.ARRIVE on sm_90a: for data handed between blocks through shared memory, not for stages.
__device__ __forceinline__ void mbarrier_arrive_remote_release_cluster(std::uint64_t* bar,
                                                                       std::uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

// Reads four floats at the shared-memory offset of `local` in the cluster's block `cta` (which may
// be this block): distributed shared memory.
__device__ __forceinline__ float4 ld_shared_cluster_f32x4(const void* local, std::uint32_t cta) {
  float4 v;
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %4, %5;\n"
      "ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [remote];\n"
      "}\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "r"(smem_addr(local)), "r"(cta)
      : "memory");
  return v;
}

}  // namespace mxq::ptx
