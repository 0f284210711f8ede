// cp.async (sm_80): 4- and 16-byte global -> shared copies with zero fill, in commit groups.
#pragma once

#include <cstdint>

namespace mxq::ptx {

// Copies `src_bytes` (0..16) from global to shared and zero-fills the rest of the 16 bytes.
// Both addresses must be 16-byte aligned.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// Copies one float (src_bytes 4) or writes 0.0f (src_bytes 0).
__device__ __forceinline__ void cp_async_4(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace mxq::ptx
