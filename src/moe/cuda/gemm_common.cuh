// What every grouped-GEMM kernel of the MoE forward shares: its arguments and its epilogues
// (GEMM1: biases + SwiGLU variant -> bf16 activations; GEMM2: bias -> fp32 per-pair rows), so
// every variant rounds and writes exactly as the CPU reference does.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda_common/async_copy.cuh"
#include "cuda_common/smem.cuh"
#include "cuda_common/tma.cuh"
#include "moe/layout/row_groups.h"
#include "mxq/moe/cuda_moe.h"
#include "routing.cuh"
#include "wgmma_k_order.h"
#include "workspace.cuh"

namespace mxq::moe::gpu::detail {

struct GemmArgs {
  MoeDeviceWeights w;
  MoeParams p;
  const std::uint16_t* x;
  int top_k;
  Workspace ws;
  // One token routed on the device: the single-token GEMM1 takes the top-k and writes the lists
  // (gemm1_single_token.cuh); the routing kernel wrote only the logits.
  bool single_token = false;
};

// A GEMM's K, streamed and stored: GEMM1 (w13) runs over H; GEMM2 (w2) streams I, while its
// rows hold the padded P values (zeros past I). One owner for the two lengths every variant needs.
__host__ __device__ inline int streamed_k(const MoeDeviceWeights& w, bool gemm1) {
  return gemm1 ? w.hidden : w.inter;
}
__host__ __device__ inline int stored_row_k(const MoeDeviceWeights& w, bool gemm1) {
  return gemm1 ? w.hidden : w.inter_padded;
}

// A GEMM block's work tile (blockIdx.y): `rows` (<= the tile cut's tokens + extra) expert-sorted
// slots from slot0, all routed to `expert`, as the routing kernel listed them.
struct WorkTile {
  int expert;
  int slot0;
  int rows;
};

__device__ __forceinline__ WorkTile read_work_tile(const Workspace& ws, int tile) {
  return {ws.tile_expert[tile], ws.tile_slot0[tile], ws.tile_rows[tile]};
}

// The weight rows a block of the wgmma GEMMs (W4A16 and W4A8 prefill) streams: its stage rows are
// two TMA boxes of kBoxRows rows. GEMM1: box 0 the gate rows of the block's channels first ..
// first + kBoxRows - 1, box 1 their up rows (P rows on); GEMM2: the block's 2 kBoxRows rows of w2.
template <bool kGemm1, int kBoxRows>
struct WgmmaBlockRows {
  const MoeDeviceWeights& w;
  int expert;
  int first;  // the block's first channel (GEMM1) or w2 row (GEMM2)

  // The stored row of box `box`'s first stage row (expert-major, P-padded for GEMM1).
  __device__ __forceinline__ std::int64_t box_row(int box) const {
    const std::int64_t row = kGemm1 ? static_cast<std::int64_t>(expert) * 2 * w.inter_padded + first
                                    : static_cast<std::int64_t>(expert) * w.hidden + first;
    return box == 0 ? row : row + (kGemm1 ? w.inter_padded : kBoxRows);
  }
  // The stored row of stage row s, or -1 past the matrix (a channel >= I, a row >= H).
  __device__ __forceinline__ std::int64_t stage_row(int s) const {
    const std::int64_t e = expert;
    if constexpr (kGemm1) {
      const int channel = first + s % kBoxRows;
      if (channel >= w.inter) return -1;
      return e * 2 * w.inter_padded + channel + (s >= kBoxRows ? w.inter_padded : 0);
    } else {
      const int row = first + s;
      if (row >= w.hidden) return -1;
      return e * w.hidden + row;
    }
  }
  // The E8M0 scales of stage row s (row 0's past the matrix: those rows' accumulators are never
  // stored, and an MMA row depends on its own A row only, so no predicate is needed per chunk).
  __device__ __forceinline__ const std::uint8_t* scale_row(int s) const {
    const std::int64_t row = stage_row(s);
    return (kGemm1 ? w.w13_scale : w.w2_scale) +
           (row >= 0 ? row : 0) * moe_scale_pitch(stored_row_k(w, kGemm1));
  }
  // Copies K chunk `chunk` of the stage rows into `stage` (box 0's rows, then box 1's, kChunkBytes
  // each) through the weights' TMA views (wgmma_weight_maps.cuh): `full_chunks`, or `short_chunk`
  // for the short last chunk of the stored rows (chunk >= full chunks), whose rows land unswizzled.
  __device__ __forceinline__ void tma_load_chunk(std::uint8_t* stage,
                                                 const CUtensorMap* full_chunks,
                                                 const CUtensorMap* short_chunk,
                                                 std::uint64_t* full, int chunk,
                                                 bool is_short) const {
    std::uint8_t* const second = stage + kBoxRows * kChunkBytes;
    const int first_group = static_cast<int>(box_row(0) / kGroupRows);
    const int second_group = static_cast<int>(box_row(1) / kGroupRows);
    if (is_short) {
      ptx::tma_load_3d(stage, short_chunk, full, 0, 0, first_group);
      ptx::tma_load_3d(second, short_chunk, full, 0, 0, second_group);
    } else {
      ptx::tma_load_3d(stage, full_chunks, full, 0, kGroupRows * chunk, first_group);
      ptx::tma_load_3d(second, full_chunks, full, 0, kGroupRows * chunk, second_group);
    }
  }
};

// ex2.approx and a fast reciprocal: relative error ~1e-6, far below the bf16 rounding of the
// result, and ~2 instructions where expf and an IEEE division took ~25 with a slow-path branch
// (the GEMM1 epilogue ran them once per output).
__device__ __forceinline__ float sigmoidf_(float z) { return __fdividef(1.0F, 1.0F + __expf(-z)); }

template <GpuActivation kKind>
__device__ __forceinline__ float activate(float g, float u, float alpha, float limit) {
  if constexpr (kKind == GpuActivation::kSwigluOai) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return (u + 1.0F) * g * sigmoidf_(alpha * g);
  } else if constexpr (kKind == GpuActivation::kSwigluClamp) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return g * sigmoidf_(g) * u;
  } else {
    return g * sigmoidf_(g) * u;
  }
}

// Calls f(std::integral_constant<GpuActivation, kind>{}): an epilogue over many outputs branches
// on the kind once instead of per output.
template <typename F>
__device__ __forceinline__ void with_activation(GpuActivation kind, F&& f) {
  switch (kind) {
    case GpuActivation::kSwigluOai:
      f(std::integral_constant<GpuActivation, GpuActivation::kSwigluOai>{});
      break;
    case GpuActivation::kSwigluClamp:
      f(std::integral_constant<GpuActivation, GpuActivation::kSwigluClamp>{});
      break;
    case GpuActivation::kSwiglu:
    default:
      f(std::integral_constant<GpuActivation, GpuActivation::kSwiglu>{});
      break;
  }
}

__device__ __forceinline__ float apply_activation(GpuActivation kind, float g, float u, float alpha,
                                                  float limit) {
  float out = 0.0F;
  with_activation(kind, [&](auto k) { out = activate<decltype(k)::value>(g, u, alpha, limit); });
  return out;
}

// The gate and up biases of one (expert, channel) (0 without biases). Loaded once per channel by
// the epilogues: the bias and output pointers may alias as far as the compiler knows, so a load
// per output is not hoisted.
struct Gemm1Bias {
  float gate;
  float up;
};

__device__ __forceinline__ Gemm1Bias load_gemm1_bias(const GemmArgs& args, int expert,
                                                     int channel) {
  if (args.w.b13 == nullptr) return {0.0F, 0.0F};
  const std::size_t gate_row = static_cast<std::size_t>(expert) * 2 * args.w.inter_padded + channel;
  return {bf16_bits_to_float(args.w.b13[gate_row]),
          bf16_bits_to_float(args.w.b13[gate_row + args.w.inter_padded])};
}

// The down bias of one (expert, hidden row); only one TP rank adds it (0 on the others).
__device__ __forceinline__ float load_gemm2_bias(const GemmArgs& args, int expert, int row) {
  if (args.w.b2 == nullptr || !args.p.add_down_bias) return 0.0F;
  return bf16_bits_to_float(args.w.b2[static_cast<std::size_t>(expert) * args.w.hidden + row]);
}

// The epilogue biases of a streaming block's 32 weight rows, fetched into shared memory when the
// block starts (GEMM1: the gate then the up biases of its 16 channels; GEMM2: the down biases of
// its 32 hidden rows). Loaded at the epilogue they were one serial L2/DRAM round trip at the end
// of every block; cp.async keeps them in flight during the weight stream without holding
// registers (the W4A8 kernels use 126 and 128 of their 128). Without biases (or on a TP rank
// that does not add b2) the lanes store zeros.
struct BlockBiases {
  static constexpr int kRows = 32;
  __align__(16) std::uint16_t v[kRows];

  // Lanes 0..3 of one warp each start one 16-byte copy; `biases` is the block's first gate (GEMM1)
  // or down (GEMM2) bias, `second_half` the element offset of its rows 16..31 (GEMM1: P, to the
  // up half; GEMM2: 16). Both keep 16-byte alignment: P, H and the rows' first channel are
  // multiples of 16 and the bias arrays are 16-byte aligned (moe_forward_unsupported_reason).
  __device__ __forceinline__ void start(const std::uint16_t* biases, std::size_t second_half,
                                        int lane) {
    if (lane >= kRows / 8) return;
    if (biases == nullptr) {
      reinterpret_cast<uint4*>(v)[lane] = make_uint4(0, 0, 0, 0);
      return;
    }
    ptx::cp_async_16(ptx::smem_addr(v + 8 * lane),
                     biases + (lane >= 2 ? second_half : 0) + 8 * (lane & 1), 16);
    ptx::cp_async_commit();
  }
  // Before the block barrier that precedes the epilogue.
  __device__ __forceinline__ static void finish() { ptx::cp_async_wait<0>(); }
  __device__ __forceinline__ float at(int row) const { return bf16_bits_to_float(v[row]); }
};

// The activation's column of a channel in GEMM2's input: kWgmmaOrder, the channel's position in
// the wgmma K order, which GEMM2 of kPrefillWgmma reads (wgmma_k_order.h).
template <bool kWgmmaOrder>
__device__ __forceinline__ int gemm1_column(int channel) {
  return kWgmmaOrder ? wgmma_k_position(channel) : channel;
}

// GEMM1 epilogue of one (slot, channel): gate and up sums of the expert's rows plus their biases.
template <bool kWgmmaOrder = false>
__device__ __forceinline__ void store_gemm1(const GemmArgs& args, Gemm1Bias bias, int channel,
                                            int slot, float g, float u) {
  const float out = apply_activation(args.p.activation, g + bias.gate, u + bias.up,
                                     args.p.swiglu_alpha, args.p.swiglu_limit);
  args.ws.act[static_cast<std::size_t>(slot) * args.w.inter + gemm1_column<kWgmmaOrder>(channel)] =
      __float2bfloat16_rn(out);
}

// GEMM2 epilogue of one (slot, hidden row): the sum plus the row's bias.
__device__ __forceinline__ void store_gemm2(const GemmArgs& args, float bias, int row, int slot,
                                            float v) {
  args.ws.y[static_cast<std::size_t>(slot) * args.w.hidden + row] = v + bias;
}

}  // namespace mxq::moe::gpu::detail
