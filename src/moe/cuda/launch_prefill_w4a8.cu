// The W4A8 prefill_wgmma launches (gemm_wgmma_w4a8.cuh): each GEMM's activations quantized by slot
// into E4M3 groups in the wgmma K order, then the GEMM with its TMA tensor maps.
#include "cuda_common/pdl.cuh"
#include "cuda_common/tensor_map.h"
#include "gemm_wgmma_w4a8.cuh"
#include "launch.h"
#include "mxq/core/cuda_check.h"
#include "quantize_activations.cuh"
#include "wgmma_weight_maps.cuh"

namespace mxq::moe::gpu::detail {
namespace {

// A GEMM's E4M3 operand by slot and its scales [group][slot] (the workspace's two orders share
// act_fp8 / act_scale with decode_mma's).
struct SlotOperand {
  std::uint8_t* q;
  float* scales;
};
SlotOperand slot_operand(const Workspace& ws, bool gemm1) {
  return gemm1 ? SlotOperand{ws.x_fp8_slot, ws.x_slot_scale}
               : SlotOperand{ws.act_fp8, ws.act_scale};
}

W4a8WgmmaMaps w4a8_wgmma_maps(const GemmArgs& args, bool gemm1, int tokens) {
  const MoeDeviceWeights& w = args.w;
  const std::uint64_t slots = static_cast<std::uint64_t>(tokens) * args.top_k;
  const int k = streamed_k(w, gemm1);
  const SlotOperand operand = slot_operand(args.ws, gemm1);
  const auto pitch = static_cast<std::uint64_t>(w4a8_act_pitch(k));
  const std::uint64_t scale_pitch = w4a8_wgmma_scale_pitch(slots);
  W4a8WgmmaMaps maps;
  maps.x = tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, operand.q, slots, pitch, pitch, 64,
                        kW4a8Chunk, CU_TENSOR_MAP_SWIZZLE_128B, "MoE W4A8 wgmma activations");
  maps.x16 =
      tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, operand.q, slots, pitch, pitch, 16, kW4a8Chunk,
                   CU_TENSOR_MAP_SWIZZLE_128B, "MoE W4A8 wgmma activations (16-slot tiles)");
  maps.x32 =
      tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, operand.q, slots, pitch, pitch, 32, kW4a8Chunk,
                   CU_TENSOR_MAP_SWIZZLE_128B, "MoE W4A8 wgmma activations (32-slot tiles)");
  maps.x_scale = tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, operand.scales,
                              static_cast<std::uint64_t>(w4a8_act_groups(k)), scale_pitch,
                              scale_pitch * sizeof(float), 1, kW4a8WgmmaScaleBoxSlots,
                              CU_TENSOR_MAP_SWIZZLE_NONE, "MoE W4A8 wgmma activation scales");
  const WgmmaWeightMaps weights = make_wgmma_weight_maps(w, gemm1, kW4a8WgmmaWBoxGroups);
  maps.w = weights.full;
  maps.w_short = weights.last;
  return maps;
}

}  // namespace

void launch_prefill_w4a8_quantize(bool gemm1, const GemmArgs& args, int pairs,
                                  cudaStream_t stream) {
  const int k = streamed_k(args.w, gemm1);
  // GEMM1: x's tokens (each stored to its pairs' slots); GEMM2: the activation rows, one a slot.
  const int rows = gemm1 ? pairs / args.top_k : pairs;
  const SlotOperand operand = slot_operand(args.ws, gemm1);
  const std::uint16_t* src = gemm1 ? args.x : reinterpret_cast<const std::uint16_t*>(args.ws.act);
  ptx::launch(
      gemm1 ? quantize_fp8_groups_by_slot_kernel<true> : quantize_fp8_groups_by_slot_kernel<false>,
      dim3(fp8_quantize_blocks(rows, k)), dim3(kFp8QuantizeThreads), 0, stream,
      args.p.programmatic_launch, src, static_cast<const int*>(args.ws.pair_slot), rows, args.top_k,
      k, operand.q, operand.scales, w4a8_wgmma_scale_pitch(static_cast<std::size_t>(pairs)));
  MXQ_CUDA_CHECK_LAUNCH();
}

void launch_prefill_w4a8_gemm(bool gemm1, const GemmArgs& args, int tokens, int max_tiles,
                              cudaStream_t stream) {
  const auto kernel = gemm1 ? gemm_wgmma_w4a8_kernel<true> : gemm_wgmma_w4a8_kernel<false>;
  MXQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kW4a8WgmmaSmemBytes));
  ptx::launch(kernel, dim3(w4a8_wgmma_row_blocks(args.w, gemm1), max_tiles),
              dim3(kW4a8WgmmaThreads), static_cast<std::size_t>(kW4a8WgmmaSmemBytes), stream,
              args.p.programmatic_launch, args, w4a8_wgmma_maps(args, gemm1, tokens));
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace mxq::moe::gpu::detail
