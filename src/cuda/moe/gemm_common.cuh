// What every grouped-GEMM kernel of the MoE forward shares: its arguments and its epilogues
// (GEMM1: biases + SwiGLU variant -> bf16 activations; GEMM2: bias -> fp32 per-pair rows), so
// every variant rounds and writes exactly as the CPU reference does.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "mxq/moe/cuda_moe.h"
#include "routing.cuh"
#include "wgmma_k_order.h"
#include "workspace.cuh"

namespace mxq::moe::cuda::detail {

struct GemmArgs {
  MoeDeviceWeights w;
  MoeParams p;
  const std::uint16_t* x;
  int top_k;
  Workspace ws;
};

// A GEMM block's work tile (blockIdx.y): `rows` (<= the variant's tile tokens) expert-sorted
// slots from slot0, all routed to `expert`, as the routing kernel listed them.
struct WorkTile {
  int expert;
  int slot0;
  int rows;
};

__device__ __forceinline__ WorkTile read_work_tile(const Workspace& ws, int tile) {
  return {ws.tile_expert[tile], ws.tile_slot0[tile], ws.tile_rows[tile]};
}

__device__ __forceinline__ float sigmoidf_(float z) { return 1.0F / (1.0F + expf(-z)); }

__device__ __forceinline__ float apply_activation(GpuActivation kind, float g, float u, float alpha,
                                                  float limit) {
  switch (kind) {
    case GpuActivation::kSwigluOai:
      g = fminf(g, limit);
      u = fminf(fmaxf(u, -limit), limit);
      return (u + 1.0F) * g * sigmoidf_(alpha * g);
    case GpuActivation::kSwigluClamp:
      g = fminf(g, limit);
      u = fminf(fmaxf(u, -limit), limit);
      return g * sigmoidf_(g) * u;
    case GpuActivation::kSwiglu:
    default:
      return g * sigmoidf_(g) * u;
  }
}

// GEMM1 epilogue of one (slot, channel): gate and up sums of the expert's rows. kWgmmaOrder: the
// activation lands at the channel's position in the wgmma K order, which GEMM2 of kWgmmaTile
// reads (wgmma_k_order.h).
template <bool kWgmmaOrder = false>
__device__ __forceinline__ void store_gemm1(const GemmArgs& args, int expert, int channel, int slot,
                                            float g, float u) {
  if (args.w.b13 != nullptr) {
    const std::size_t gate_row =
        static_cast<std::size_t>(expert) * 2 * args.w.inter_padded + channel;
    g += bf16_bits_to_float(args.w.b13[gate_row]);
    u += bf16_bits_to_float(args.w.b13[gate_row + args.w.inter_padded]);
  }
  const float out =
      apply_activation(args.p.activation, g, u, args.p.swiglu_alpha, args.p.swiglu_limit);
  const int column = kWgmmaOrder ? wgmma_k_position(channel) : channel;
  args.ws.act[static_cast<std::size_t>(slot) * args.w.inter + column] = __float2bfloat16_rn(out);
}

// GEMM2 epilogue of one (slot, hidden row); only one TP rank adds the down bias.
__device__ __forceinline__ void store_gemm2(const GemmArgs& args, int expert, int row, int slot,
                                            float v) {
  if (args.w.b2 != nullptr && args.p.add_down_bias)
    v += bf16_bits_to_float(args.w.b2[static_cast<std::size_t>(expert) * args.w.hidden + row]);
  args.ws.y[static_cast<std::size_t>(slot) * args.w.hidden + row] = v;
}

}  // namespace mxq::moe::cuda::detail
