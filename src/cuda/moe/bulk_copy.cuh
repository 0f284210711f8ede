// Hopper bulk asynchronous copies (global -> shared, the TMA engine without a tensor map) that
// complete on a shared-memory mbarrier: the weight tiles of the MoE GEMMs are fetched this way so
// that tens of KB per SM are in flight without holding registers.
//
// Protocol used here (one phase per barrier, parity 0): thread 0 initializes the barriers with an
// arrival count of 1, fences the init for the async proxy, and posts arrive.expect_tx with the
// bytes each barrier will receive; after a __syncthreads any thread may issue copies onto them;
// consumers spin on try_wait.parity(0), after which the copied bytes are visible to them.
#pragma once

#include <cstdint>

#include "cuda/linear/device_ptx.cuh"

namespace mxq::moe::cuda::detail {

// The barrier set-up and the shared-address conversion are the block-FP8 kernels' (the same
// instructions). fence_barrier_init makes the barriers' initialization visible to the async
// proxy (the copy engine).
using linear::device::fence_barrier_init;
using linear::device::mbarrier_arrive_expect_tx;
using linear::device::mbarrier_init;
using linear::device::smem_addr;

// Not linear::device::mbarrier_wait: that one traps after 2^26 polls; this one spins until the
// phase completes.
__device__ __forceinline__ void mbarrier_wait_parity(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// bytes: a multiple of 16; both addresses 16-byte aligned.
__device__ __forceinline__ void bulk_copy_g2s(std::uint32_t dst, const void* src,
                                              std::uint32_t bytes, std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

}  // namespace mxq::moe::cuda::detail
