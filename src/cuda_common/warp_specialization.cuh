// Named barriers among a block's warp groups and register reallocation (setmaxnreg, sm_90a)
// between producer and consumer warp groups.
#pragma once

#include <cstdint>

namespace mxq::ptx {

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.red.and: waits like named_barrier_sync and returns whether `value` is true in every
// participating thread (a vote across warps, e.g. a warpgroup that must take one path).
__device__ __forceinline__ bool named_barrier_all(int id, int threads, bool value) {
  std::uint32_t all = 0;
  asm volatile(
      "{\n"
      ".reg .pred in, out;\n"
      "setp.ne.b32 in, %1, 0;\n"
      "bar.red.and.pred out, %2, %3, in;\n"
      "selp.b32 %0, 1, 0, out;\n"
      "}\n"
      : "=r"(all)
      : "r"(static_cast<std::uint32_t>(value)), "r"(id), "r"(threads)
      : "memory");
  return all != 0U;
}

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace mxq::ptx
