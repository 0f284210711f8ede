// W4A8: the activations of the MoE forward quantized to E4M3 groups of 128 along K, in the layout
// of w4a8_layout.h.
#pragma once

#include <cstdint>

#include "cuda_common/fp8_groups.cuh"
#include "cuda_common/pdl.cuh"
#include "moe/layout/w4a8_layout.h"
#include "mxq/core/error.h"
#include "mxq/formats/fp8_block_scale.h"

namespace mxq::moe::gpu::detail {

// The 8 lanes of an aligned lane octet share one 128-group of a bf16 row; lane l of the octet
// takes the 16 values from k0 = the group's first k + 16 l (k is a multiple of 16). Returns their
// E4M3 codes, 4 a word in k order (k0 first, in the low byte of word[0]; zeros past k), and the
// group's scale (the same in the octet's lanes): value / scale saturating, round to nearest even,
// scale = max(amax, 1e-4) / 448 in fp32 (ptx::bf16x8_to_e4m3, fp8_block_scale) — the CPU
// reference's quantize_dequantize_fp8_groups. A NaN or Inf makes the scale NaN. Every lane of the
// warp must call it (a shuffle reduction). Why octets: a warp a group, 4 values a lane, 5
// shuffles and a software E4M3 encoder, and quantizing x once per pair instead of per token, made
// W4A8's quantization 2-4x its bytes' time (docs/perf-log/moe-prefill.md, session 39).
struct Fp8GroupCodes {
  std::uint32_t word[4];
  float scale;
};
constexpr int kFp8GroupLanes = kW4a8Chunk / 16;  // lanes per 128-group
__device__ __forceinline__ Fp8GroupCodes quantize_fp8_group_sixteen(const std::uint16_t* row,
                                                                    int k0, int k) {
  uint4 v[2] = {make_uint4(0U, 0U, 0U, 0U), make_uint4(0U, 0U, 0U, 0U)};
  if (k0 < k) {
    v[0] = __ldg(reinterpret_cast<const uint4*>(row + k0));
    v[1] = __ldg(reinterpret_cast<const uint4*>(row + k0 + 8));
  }
  const std::uint32_t pairs[2][4] = {{v[0].x, v[0].y, v[0].z, v[0].w},
                                     {v[1].x, v[1].y, v[1].z, v[1].w}};
  std::uint32_t amax_bits = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < 4; ++i) amax_bits = max(amax_bits, ptx::bf16x2_abs_max_bits(pairs[h][i]));
  }
  static_assert(kFp8GroupLanes == 8, "the reduction below spans 8 lanes");
  for (int offset = 4; offset > 0; offset /= 2)
    amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFU, amax_bits, offset));
  Fp8GroupCodes out{{0U, 0U, 0U, 0U},
                    fp8_block_scale(__uint_as_float(amax_bits), ScaleMode::kFp32)};
  if (k0 < k) {  // past k the codes stay 0, also in a NaN group (0 / NaN would give NaN codes)
    std::uint32_t codes[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ptx::bf16x8_to_e4m3(pairs[h], out.scale, codes);
      out.word[2 * h] = codes[0];
      out.word[2 * h + 1] = codes[1];
    }
  }
  return out;
}

// A thread's place in the quantize kernels: its octet's (row, group) and its lane in the octet.
// 32-bit index arithmetic: the launchers keep the grid's threads below 2^31.
struct Fp8GroupLane {
  int row;
  int group;
  int k0;
  bool valid;
  bool first;  // lane 0 of the octet: writes the scale
};
__device__ __forceinline__ Fp8GroupLane fp8_group_lane(int rows, int groups) {
  const int thread = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int item = thread / kFp8GroupLanes;
  const int lane = thread % kFp8GroupLanes;
  Fp8GroupLane at{};
  at.valid = item < rows * groups;
  at.row = at.valid ? item / groups : 0;
  at.group = item % groups;
  at.k0 = at.group * kW4a8Chunk + 16 * lane;
  at.first = lane == 0;
  return at;
}

// Blocks of kFp8QuantizeThreads for an octet per (row, group) of rows x k values.
constexpr int kFp8QuantizeThreads = 256;
inline unsigned fp8_quantize_blocks(int rows, int k) {
  const long long threads = static_cast<long long>(rows) * w4a8_act_groups(k) * kFp8GroupLanes;
  MXQ_CHECK(threads < (1LL << 31), ErrorCode::kOutOfRange, "W4A8 activation quantization: ", rows,
            " rows of ", k, " values is more than its 32-bit grid indexes");
  return static_cast<unsigned>((threads + kFp8QuantizeThreads - 1) / kFp8QuantizeThreads);
}

// Stores a lane's 16 codes into a row of the decode layout (w4a8_act_offset): values k0 .. k0 + 7
// and k0 + 8 .. k0 + 15 are 8 consecutive bytes each.
__device__ __forceinline__ void store_codes_decode_order(std::uint8_t* q_row, int k0,
                                                         const Fp8GroupCodes& c) {
  *reinterpret_cast<uint2*>(q_row + w4a8_act_offset(k0)) = make_uint2(c.word[0], c.word[1]);
  *reinterpret_cast<uint2*>(q_row + w4a8_act_offset(k0 + 8)) = make_uint2(c.word[2], c.word[3]);
}

// Stores a lane's 16 codes into a row of the wgmma layout (w4a8_wgmma_act_offset): k0 is 0 or 16
// within its 32-block, whose quads k0, k0 + 8 are 8 consecutive bytes, and so are k0 + 4, k0 + 12.
__device__ __forceinline__ void store_codes_wgmma_order(std::uint8_t* q_row, int k0,
                                                        const Fp8GroupCodes& c) {
  *reinterpret_cast<uint2*>(q_row + w4a8_wgmma_act_offset(k0)) = make_uint2(c.word[0], c.word[2]);
  *reinterpret_cast<uint2*>(q_row + w4a8_wgmma_act_offset(k0 + 4)) =
      make_uint2(c.word[1], c.word[3]);
}

// An octet per (row, 128-group) of bf16 rows [rows, k]: the group's E4M3 codes
// (quantize_fp8_group_sixteen) in the W4A8 decode layout (zeros past k), and its scale.
// kReadsPredecessor: the rows are an earlier kernel's output (GEMM1's activations), so wait
// first; else (the forward's input x) quantize while the routing kernel runs, then wait (so that
// the next kernel's wait covers the routing too).
template <bool kReadsPredecessor>
__global__ void quantize_fp8_groups_kernel(const std::uint16_t* __restrict__ src, int rows, int k,
                                           std::uint8_t* __restrict__ q,
                                           float* __restrict__ scales) {
  if constexpr (kReadsPredecessor) ptx::wait_for_predecessor();
  ptx::allow_dependents();
  const int groups = w4a8_act_groups(k);
  const Fp8GroupLane at = fp8_group_lane(rows, groups);
  const Fp8GroupCodes codes =
      quantize_fp8_group_sixteen(src + static_cast<std::size_t>(at.row) * k, at.k0, k);
  if (at.valid) {
    store_codes_decode_order(q + static_cast<std::size_t>(at.row) * w4a8_act_pitch(k), at.k0,
                             codes);
    if (at.first) scales[static_cast<std::size_t>(at.row) * groups + at.group] = codes.scale;
  }
  if constexpr (!kReadsPredecessor) ptx::wait_for_predecessor();
}

// prefill_wgmma's activations in the wgmma K order, the scales [group][slot]. GEMM1's
// (kGather): x quantized once per token and stored to the slot of each of its pairs (a token's
// k pairs share its codes; quantizing per pair did the same work k times). GEMM2's: the
// activation rows, already by slot. An octet per (row, group) as in quantize_fp8_groups_kernel.
template <bool kGather>
__global__ void quantize_fp8_groups_by_slot_kernel(const std::uint16_t* __restrict__ src,
                                                   const int* __restrict__ pair_slot, int rows,
                                                   int top_k, int k, std::uint8_t* __restrict__ q,
                                                   float* __restrict__ scales,
                                                   std::size_t scale_pitch) {
  ptx::wait_for_predecessor();  // the routing's slots, or GEMM1's activations
  ptx::allow_dependents();
  const Fp8GroupLane at = fp8_group_lane(rows, w4a8_act_groups(k));
  const Fp8GroupCodes codes =
      quantize_fp8_group_sixteen(src + static_cast<std::size_t>(at.row) * k, at.k0, k);
  if (!at.valid) return;
  const std::size_t pitch = w4a8_act_pitch(k);
  const auto store = [&](int slot) {
    store_codes_wgmma_order(q + static_cast<std::size_t>(slot) * pitch, at.k0, codes);
    if (at.first) scales[static_cast<std::size_t>(at.group) * scale_pitch + slot] = codes.scale;
  };
  if constexpr (kGather) {
    for (int j = 0; j < top_k; ++j) {
      const int slot = pair_slot[at.row * top_k + j];
      if (slot >= 0) store(slot);  // else an expert of another rank
    }
  } else {
    store(at.row);
  }
}

}  // namespace mxq::moe::gpu::detail
