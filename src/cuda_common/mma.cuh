// Warp-level tensor-core MMA (mma.sync, sm_80/sm_89) and ldmatrix: the fragments' layouts are
// PTX's (ISA, "Matrix Fragments for mma.m16n8k16/k32"). Accumulating forms read and write the
// accumulators; the _from_zero form starts from zero.
#pragma once

#include <cstdint>

namespace mxq::ptx {

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A (16x32 e4m3, row) * B (32x8 e4m3, col) + C, fp32 accumulate.
__device__ __forceinline__ void mma_m16n8k32_e4m3(float (&d)[4], const std::uint32_t (&a)[4],
                                                  std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A(16x32 E4M3, row) * B(32x8 E4M3, col), fp32, from zero.
__device__ __forceinline__ void mma_m16n8k32_e4m3_from_zero(float (&d)[4],
                                                            const std::uint32_t (&a)[4],
                                                            std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0F));
}

// D = A (16x16 f16, row) * B (16x8 f16, col) + C, fp32 accumulate.
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], std::uint32_t a0, std::uint32_t a1,
                                                 std::uint32_t a2, std::uint32_t a3,
                                                 std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D = A(16x16 bf16, row) * B(16x8 bf16, col) + D, fp32 accumulators.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                                  std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two E4M3 codes (low byte first) -> f16x2 (low half first); exact, E4M3 is a subset of f16.
__device__ __forceinline__ std::uint32_t e4m3x2_to_f16x2(std::uint32_t pair) {
  std::uint32_t out;
  const auto bits = static_cast<std::uint16_t>(pair & 0xFFFFU);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(bits));
  return out;
}

}  // namespace mxq::ptx
