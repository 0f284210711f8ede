// The prefill_wgmma GEMMs' launches (GemmVariant::kPrefillWgmma, gemm_wgmma.cuh): the activations
// gathered by slot in the wgmma K order, then GEMM1 and GEMM2 with their TMA tensor maps.
#include <algorithm>

#include "cuda_common/pdl.cuh"
#include "cuda_common/tensor_map.h"
#include "gemm_wgmma.cuh"
#include "launch.h"
#include "mxq/core/cuda_check.h"
#include "wgmma_weight_maps.cuh"

namespace mxq::moe::gpu::detail {
namespace {

// The TMA views of the wgmma GEMMs' operands (WgmmaMaps): the activations by slot ([T * k, H] for
// GEMM1, [T * k, I] for GEMM2) in boxes of 64, 16 or 32 slots x 64 values, the packed weights in
// boxes of kWgmmaWBoxGroups row groups (wgmma_weight_maps.cuh).
WgmmaMaps wgmma_maps(const GemmArgs& args, bool gemm1, int tokens) {
  const MoeDeviceWeights& w = args.w;
  const std::uint64_t slots = static_cast<std::uint64_t>(tokens) * args.top_k;
  const std::uint64_t k = streamed_k(w, gemm1);
  WgmmaMaps maps;
  const void* x = gemm1 ? static_cast<const void*>(args.ws.x_wgmma) : args.ws.act;
  maps.x = tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, slots, k, k * 2, 64, 64,
                        CU_TENSOR_MAP_SWIZZLE_128B, "MoE wgmma activations");
  maps.x16 = tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, slots, k, k * 2, 16, 64,
                          CU_TENSOR_MAP_SWIZZLE_128B, "MoE wgmma activations (16-slot tiles)");
  maps.x32 = tma::make_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, slots, k, k * 2, 32, 64,
                          CU_TENSOR_MAP_SWIZZLE_128B, "MoE wgmma activations (32-slot tiles)");
  const WgmmaWeightMaps weights = make_wgmma_weight_maps(w, gemm1, kWgmmaWBoxGroups);
  maps.w = weights.full;
  maps.w_short = weights.last;
  return maps;
}

}  // namespace

void launch_prefill_gather(const std::uint16_t* x, const Workspace& ws, int pairs, int top_k,
                           int hidden, bool programmatic, cudaStream_t stream) {
  // Grid-stride over 16-byte units: two waves of 8 resident 256-thread blocks per SM at most.
  const std::size_t units = static_cast<std::size_t>(pairs) * (hidden / 8);
  const int blocks = static_cast<int>(
      std::min<std::size_t>((units + 255) / 256, static_cast<std::size_t>(sm_count()) * 16));
  ptx::launch(gather_activations_kernel, dim3(blocks), dim3(256), 0, stream, programmatic,
              reinterpret_cast<const std::uint32_t*>(x), static_cast<const int*>(ws.pair_slot),
              pairs, top_k, hidden, reinterpret_cast<uint4*>(ws.x_wgmma));
  MXQ_CUDA_CHECK_LAUNCH();
}

void launch_prefill_gemm(bool gemm1, const GemmArgs& args, int tokens, int max_tiles,
                         cudaStream_t stream) {
  const auto kernel = gemm1 ? gemm_wgmma_kernel<true> : gemm_wgmma_kernel<false>;
  MXQ_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgmmaSmemBytes));
  ptx::launch(kernel, dim3(wgmma_row_blocks(args.w, gemm1), max_tiles), dim3(kWgmmaThreads),
              static_cast<std::size_t>(kWgmmaSmemBytes), stream, args.p.programmatic_launch, args,
              wgmma_maps(args, gemm1, tokens));
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace mxq::moe::gpu::detail
