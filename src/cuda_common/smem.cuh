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

}  // namespace mxq::ptx
