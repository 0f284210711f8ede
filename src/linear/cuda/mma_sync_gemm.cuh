// The general block-FP8 GEMM (every block shape with bn, bk multiples of 16; ragged M, N, K):
// FP8 tensor cores through mma.sync.m16n8k32.e4m3 (sm_89+), cp.async multi-stage pipeline.
//
// K is walked in chunks of kKc bytes that never cross a scale block: block kb covers
// [kb*bk, min((kb+1)*bk, K)) and is split into ceil(bk / kKc) chunks; elements past the block's
// end (and past K) are loaded as zeros. The tensor cores accumulate one block in fp32 registers;
// at the block's last chunk each partial sum is promoted into the final fp32 accumulator with
// the block's scales, final += partial * (a_scale[row] * w_scale[col's block]), then cleared.
//
// Shared-memory tiles are [rows][kKc] bytes with the 16-byte units of each row XOR-swizzled so
// that ldmatrix reads of 8 rows hit 8 different bank groups.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_common/async_copy.cuh"
#include "cuda_common/mma.cuh"
#include "cuda_common/smem.cuh"
#include "linear/cuda/kernel_params.h"

namespace mxq::linear::gpu::kernels {

template <int kBm_, int kBn_, int kKc_, int kWarpsM_, int kWarpsN_, int kStages_>
struct MmaSyncTile {
  static constexpr int kBm = kBm_;
  static constexpr int kBn = kBn_;
  static constexpr int kKc = kKc_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpTileM = kBm / kWarpsM;
  static constexpr int kWarpTileN = kBn / kWarpsN;
  static constexpr int kMi = kWarpTileM / 16;  // m16 fragments per warp
  static constexpr int kNi = kWarpTileN / 8;   // n8 fragments per warp
  static constexpr int kUnits = kKc / 16;      // 16-byte units per smem row
  static constexpr int kSwizzleShift = kUnits == 8 ? 0 : (kUnits == 4 ? 1 : 2);
  static constexpr int kABytes = kBm * kKc;
  static constexpr int kBBytes = kBn * kKc;
  static constexpr int kScaleCount = kBm + kBn / 16;  // a scales per row, w scales per 16 cols
  static constexpr int kStageBytes = kABytes + kBBytes + kScaleCount * 4;
  static constexpr int kSmemBytes = kStages * kStageBytes;

  static_assert(kKc == 32 || kKc == 64 || kKc == 128, "chunk must be 32, 64 or 128 bytes");
  static_assert(kWarpTileM % 16 == 0 && kWarpTileN % 16 == 0, "warp tile: multiples of 16");
  static_assert(kBn % 16 == 0 && kStages >= 2, "tile shape");
  static_assert(kABytes % 16 == 0 && kBBytes % 16 == 0 && kStageBytes % 16 == 0,
                "16-byte aligned stage parts");
};

// Byte offset of 16-byte unit `unit` of row `row` in a swizzled [rows][kKc] tile.
template <typename Tile>
__device__ __forceinline__ int swizzled_offset(int row, int unit) {
  const int physical = unit ^ ((row >> Tile::kSwizzleShift) & (Tile::kUnits - 1));
  return row * Tile::kKc + physical * 16;
}

// Streams rows [row0, row0 + kRows) of an [rows_total, ld] e4m3 matrix into swizzled
// [kRows][kKc] tiles, one K chunk at a time. Each thread owns a fixed set of 16-byte units, so
// the row arithmetic is done once; per chunk only the K offset changes. Bytes at or past the
// chunk's limit and rows at or past rows_total are written as zeros.
template <typename Tile, int kRows, bool kVecLoad>
struct TileLoader {
  static constexpr int kUnitsTotal = kRows * Tile::kUnits;
  static constexpr int kSlots = (kUnitsTotal + Tile::kThreads - 1) / Tile::kThreads;

  const std::uint8_t* row_ptr[kSlots];  // start of this slot's row (row 0 when out of range)
  int smem_offset[kSlots];              // swizzled offset inside the tile
  int unit_k[kSlots];                   // byte offset of the unit inside the chunk
  bool active[kSlots];                  // in range: row < rows_total and slot < kUnitsTotal

  __device__ __forceinline__ TileLoader(const std::uint8_t* matrix, std::int64_t ld, int row0,
                                        int rows_total) {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int index = static_cast<int>(threadIdx.x) + slot * Tile::kThreads;
      const int r = index / Tile::kUnits;
      const int u = index % Tile::kUnits;
      const bool exists = kUnitsTotal % Tile::kThreads == 0 || index < kUnitsTotal;
      active[slot] = exists && row0 + r < rows_total;
      row_ptr[slot] = matrix + (active[slot] ? static_cast<std::int64_t>(row0 + r) * ld : 0);
      smem_offset[slot] = exists ? swizzled_offset<Tile>(r, u) : -1;
      unit_k[slot] = u * 16;
    }
  }

  __device__ __forceinline__ void load(std::uint8_t* tile, int k0, int k_limit) const {
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      if (smem_offset[slot] < 0) continue;
      const int k = k0 + unit_k[slot];
      int bytes = k_limit - k;
      bytes = bytes < 0 ? 0 : (bytes > 16 ? 16 : bytes);
      if (!active[slot]) bytes = 0;
      std::uint8_t* dst = tile + smem_offset[slot];
      if constexpr (kVecLoad) {
        ptx::cp_async_16(ptx::smem_addr(dst), row_ptr[slot] + (bytes > 0 ? k : 0), bytes);
      } else {
        // Unaligned rows (K not a multiple of 16): byte loads, registers only.
        const std::uint8_t* src = row_ptr[slot] + (bytes > 0 ? k : 0);
        std::uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
        for (int b = 0; b < 16; ++b) {
          const std::uint32_t value = b < bytes ? __ldg(src + b) : 0U;
          words[b / 4] |= value << (8 * (b % 4));
        }
        *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
      }
    }
  }
};

// kF16Mma = false: mma.sync.m16n8k32 e4m3 (native on sm_89; on sm_90 ptxas lowers it to
// f16 unpacks + HMMA + an fp32 add of the accumulator). kF16Mma = true: the same fragments
// unpacked to f16 once (exact) and fed to mma.sync.m16n8k16 f16 accumulating in place, which
// saves the adds on sm_90. Both sum the same exact products in fp32.
template <typename Tile, bool kVecLoad, bool kOutBf16, bool kF16Mma = false>
__global__ void __launch_bounds__(Tile::kThreads)
    block_fp8_mma_sync_kernel(const gpu::BlockFp8GemmArgs args) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int warp_m = warp / Tile::kWarpsN;
  const int warp_n = warp % Tile::kWarpsN;
  const int m0 = static_cast<int>(blockIdx.y) * Tile::kBm;
  const int n0 = static_cast<int>(blockIdx.x) * Tile::kBn;
  const int wm0 = warp_m * Tile::kWarpTileM;  // warp tile origin inside the CTA tile
  const int wn0 = warp_n * Tile::kWarpTileN;

  const int k_blocks = (args.k + args.block_k - 1) / args.block_k;
  const int chunks_per_block = (args.block_k + Tile::kKc - 1) / Tile::kKc;
  const int chunks = k_blocks * chunks_per_block;

  auto stage_a = [&](int s) { return smem + s * Tile::kStageBytes; };
  auto stage_b = [&](int s) { return smem + s * Tile::kStageBytes + Tile::kABytes; };
  auto stage_scales = [&](int s) {
    return reinterpret_cast<float*>(smem + s * Tile::kStageBytes + Tile::kABytes + Tile::kBBytes);
  };

  const TileLoader<Tile, Tile::kBm, kVecLoad> a_loader(args.a, args.lda, m0, args.m);
  const TileLoader<Tile, Tile::kBn, kVecLoad> w_loader(args.w, args.ldw, n0, args.n);
  // Scales of a block kb: one per tile row (a_scale[kb, m0 + i]) and one per 16 tile columns
  // (w_scale[col / bn, kb]; bn is a multiple of 16, so 16 columns starting at a multiple of 16
  // share one weight block). Thread i < kScaleCount copies entry i each chunk.
  static_assert(Tile::kScaleCount <= Tile::kThreads, "one scale per thread");
  const float* scale_src = args.a_scale;
  std::int64_t scale_kb_stride = 0;
  bool scale_valid = false;
  if (tid < Tile::kBm) {
    scale_valid = m0 + tid < args.m;
    scale_src = args.a_scale + (scale_valid ? m0 + tid : 0);
    scale_kb_stride = args.a_scale_ld;
  } else if (tid < Tile::kScaleCount) {
    const int col = n0 + (tid - Tile::kBm) * 16;
    scale_valid = col < args.n;
    scale_src = args.w_scale +
                (scale_valid ? static_cast<std::int64_t>(col / args.block_n) * args.w_scale_ld : 0);
    scale_kb_stride = 1;
  }

  auto load_chunk = [&](int chunk, int s) {
    const int kb = chunk / chunks_per_block;
    const int k0 = kb * args.block_k + (chunk % chunks_per_block) * Tile::kKc;
    const int k_limit = min(args.k, (kb + 1) * args.block_k);
    a_loader.load(stage_a(s), k0, k_limit);
    w_loader.load(stage_b(s), k0, k_limit);
    if (tid < Tile::kScaleCount) {
      ptx::cp_async_4(ptx::smem_addr(stage_scales(s) + tid),
                      scale_valid ? scale_src + kb * scale_kb_stride : scale_src,
                      scale_valid ? 4 : 0);
    }
  };

  float partial[Tile::kMi][Tile::kNi][4];
  float result[Tile::kMi][Tile::kNi][4];
#pragma unroll
  for (int mi = 0; mi < Tile::kMi; ++mi) {
#pragma unroll
    for (int ni = 0; ni < Tile::kNi; ++ni) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        partial[mi][ni][e] = 0.0F;
        result[mi][ni][e] = 0.0F;
      }
    }
  }

#pragma unroll
  for (int s = 0; s < Tile::kStages - 1; ++s) {
    if (s < chunks) load_chunk(s, s);
    ptx::cp_async_commit();
  }

  const int group = lane / 4;     // row inside an 8-row fragment half
  const int in_group = lane % 4;  // column pair inside an n8 fragment
  for (int chunk = 0; chunk < chunks; ++chunk) {
    ptx::cp_async_wait<Tile::kStages - 2>();
    __syncthreads();
    {
      const int next = chunk + Tile::kStages - 1;
      if (next < chunks) load_chunk(next, next % Tile::kStages);
      ptx::cp_async_commit();
    }
    const int s = chunk % Tile::kStages;
    const std::uint32_t a_base = ptx::smem_addr(stage_a(s));
    const std::uint32_t b_base = ptx::smem_addr(stage_b(s));
#pragma unroll
    for (int ks = 0; ks < Tile::kKc / 32; ++ks) {
      std::uint32_t a_frag[Tile::kMi][4];
      std::uint32_t b_frag[Tile::kNi][2];
#pragma unroll
      for (int mi = 0; mi < Tile::kMi; ++mi) {
        const int row = wm0 + mi * 16 + (lane & 15);
        const int unit = ks * 2 + (lane >> 4);
        ptx::ldmatrix_x4(a_frag[mi], a_base + swizzled_offset<Tile>(row, unit));
      }
#pragma unroll
      for (int pair = 0; pair < Tile::kNi / 2; ++pair) {
        const int quad = lane >> 3;
        const int row = wn0 + pair * 16 + (quad >> 1) * 8 + (lane & 7);
        const int unit = ks * 2 + (quad & 1);
        std::uint32_t r[4];
        ptx::ldmatrix_x4(r, b_base + swizzled_offset<Tile>(row, unit));
        b_frag[2 * pair][0] = r[0];
        b_frag[2 * pair][1] = r[1];
        b_frag[2 * pair + 1][0] = r[2];
        b_frag[2 * pair + 1][1] = r[3];
      }
      if constexpr (kF16Mma) {
        // An e4m3 word of a k32 fragment holds 4 consecutive k; its low and high pairs become
        // two f16x2. Thread (g, t) then feeds k32-positions {4t, 4t+1} where the k16 mma expects
        // {2t, 2t+1} and {4t+2, 4t+3} where it expects {2t+8, 2t+9} - the same permutation of k
        // for A and B, so every product pairs the right elements and the sum is unchanged.
        std::uint32_t a16[Tile::kMi][8];
        std::uint32_t b16[Tile::kNi][4];
#pragma unroll
        for (int mi = 0; mi < Tile::kMi; ++mi) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            a16[mi][2 * r] = ptx::e4m3x2_to_f16x2(a_frag[mi][r]);
            a16[mi][2 * r + 1] = ptx::e4m3x2_to_f16x2(a_frag[mi][r] >> 16);
          }
        }
#pragma unroll
        for (int ni = 0; ni < Tile::kNi; ++ni) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            b16[ni][2 * r] = ptx::e4m3x2_to_f16x2(b_frag[ni][r]);
            b16[ni][2 * r + 1] = ptx::e4m3x2_to_f16x2(b_frag[ni][r] >> 16);
          }
        }
#pragma unroll
        for (int mi = 0; mi < Tile::kMi; ++mi) {
#pragma unroll
          for (int ni = 0; ni < Tile::kNi; ++ni) {
            // k32 positions 0..15 (e4m3 a0 = row g, a1 = row g+8; b0), then 16..31 (a2, a3; b1).
            ptx::mma_m16n8k16_f16(partial[mi][ni], a16[mi][0], a16[mi][2], a16[mi][1], a16[mi][3],
                                  b16[ni][0], b16[ni][1]);
            ptx::mma_m16n8k16_f16(partial[mi][ni], a16[mi][4], a16[mi][6], a16[mi][5], a16[mi][7],
                                  b16[ni][2], b16[ni][3]);
          }
        }
      } else {
#pragma unroll
        for (int mi = 0; mi < Tile::kMi; ++mi) {
#pragma unroll
          for (int ni = 0; ni < Tile::kNi; ++ni) {
            ptx::mma_m16n8k32_e4m3(partial[mi][ni], a_frag[mi], b_frag[ni][0], b_frag[ni][1]);
          }
        }
      }
    }
    if (chunk % chunks_per_block == chunks_per_block - 1) {
      // Last chunk of scale block: promote with the block's scales (held by this stage).
      const float* scales = stage_scales(s);
#pragma unroll
      for (int mi = 0; mi < Tile::kMi; ++mi) {
        const float scale_lo = scales[wm0 + mi * 16 + group];
        const float scale_hi = scales[wm0 + mi * 16 + group + 8];
#pragma unroll
        for (int ni = 0; ni < Tile::kNi; ++ni) {
          const float w_scale = scales[Tile::kBm + (wn0 + ni * 8) / 16];
          const float s_lo = scale_lo * w_scale;
          const float s_hi = scale_hi * w_scale;
          result[mi][ni][0] += partial[mi][ni][0] * s_lo;
          result[mi][ni][1] += partial[mi][ni][1] * s_lo;
          result[mi][ni][2] += partial[mi][ni][2] * s_hi;
          result[mi][ni][3] += partial[mi][ni][3] * s_hi;
#pragma unroll
          for (int e = 0; e < 4; ++e) partial[mi][ni][e] = 0.0F;
        }
      }
    }
  }
  ptx::cp_async_wait<0>();

  // Epilogue: bias, one rounding to the output type, predicated stores.
  const bool pair_stores = args.ldo % 2 == 0 && reinterpret_cast<std::uintptr_t>(args.out) % 8 == 0;
#pragma unroll
  for (int mi = 0; mi < Tile::kMi; ++mi) {
#pragma unroll
    for (int ni = 0; ni < Tile::kNi; ++ni) {
      const int col = n0 + wn0 + ni * 8 + 2 * in_group;
      float bias[2] = {0.0F, 0.0F};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (col + e < args.n) {
          if (args.bias_f32 != nullptr) bias[e] = args.bias_f32[col + e];
          if (args.bias_bf16 != nullptr) bias[e] = ptx::bf16_bits_to_float(args.bias_bf16[col + e]);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + wm0 + mi * 16 + group + half * 8;
        if (row >= args.m) continue;
        const float v0 = result[mi][ni][2 * half] + bias[0];
        const float v1 = result[mi][ni][2 * half + 1] + bias[1];
        const std::int64_t offset = static_cast<std::int64_t>(row) * args.ldo + col;
        if constexpr (kOutBf16) {
          __nv_bfloat16* out = static_cast<__nv_bfloat16*>(args.out) + offset;
          if (pair_stores && col + 1 < args.n) {
            *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
          } else {
            if (col < args.n) out[0] = __float2bfloat16_rn(v0);
            if (col + 1 < args.n) out[1] = __float2bfloat16_rn(v1);
          }
        } else {
          float* out = static_cast<float*>(args.out) + offset;
          if (pair_stores && col + 1 < args.n) {
            *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
          } else {
            if (col < args.n) out[0] = v0;
            if (col + 1 < args.n) out[1] = v1;
          }
        }
      }
    }
  }
}

}  // namespace mxq::linear::gpu::kernels
