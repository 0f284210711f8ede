// Shared-memory addresses and loads, and the bf16 bit conversion the kernels share. Device code
// only; no framework headers (src/cuda_common/: the PTX wrappers of every op's kernels).
#pragma once

#include <cstdint>

namespace mxq::ptx {

__device__ __forceinline__ std::uint32_t smem_addr(const void* ptr) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}

// A 32-bit shared-memory load by address. Volatile: it must stay after the barrier wait that
// makes the data valid (the address repeats every ring cycle).
__device__ __forceinline__ std::uint32_t ld_shared_u32(std::uint32_t addr) {
  std::uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// 64- and 128-bit shared-memory loads by address (the same ordering as ld_shared_u32).
__device__ __forceinline__ float2 ld_shared_f32x2(std::uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 ld_shared_u32x4(std::uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

}  // namespace mxq::ptx
