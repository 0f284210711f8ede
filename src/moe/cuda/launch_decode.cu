// The decode_mma GEMMs' launches (GemmVariant::kDecodeMma): the register-streaming GEMM1 and GEMM2
// (gemm_register_stream.cuh) and the single-token GEMM1 (gemm1_single_token.cuh).
#include <algorithm>

#include "cuda_common/pdl.cuh"
#include "gemm1_single_token.cuh"
#include "gemm_register_stream.cuh"
#include "launch.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"

namespace mxq::moe::gpu::detail {
namespace {

// The single-token GEMM1's grid for up to max_tiles chosen experts: one wave of `resident`
// blocks, but no more blocks than tiles (a range is at least a tile long: a tile has two parts at
// most) and no fewer than half the tiles (a range is at most two tiles long: three pieces at
// most); 0 when that needs more than kSplitMaxBlocks (the boundary counters).
int single_token_gemm1_blocks(const MoeDeviceWeights& w, int max_tiles, int resident) {
  const int tiles = max_tiles * (w.inter / kTileRows);
  const int blocks = std::max(std::min(resident, tiles), (tiles + 1) / 2);
  return blocks <= kSplitMaxBlocks ? blocks : 0;
}

}  // namespace

bool decode_single_token_fits(const MoeDeviceWeights& w, int max_tiles) {
  return w.num_global_experts <= kSingleTokenMaxRouterExperts &&
         single_token_gemm1_blocks(w, max_tiles, 1) > 0;
}

void launch_decode_gemm(bool gemm1, const GemmArgs& args, int max_tiles, const TileCut& tiles,
                        cudaStream_t stream) {
  // The kernels' token tiles: one per 8 slots of a work tile.
  const bool two_token_tiles = tiles.tokens == kWideDecodeTileTokens;
  MXQ_CHECK(tiles.extra == 0 && (tiles.tokens == kTileTokens || two_token_tiles) &&
                !(two_token_tiles && w4a8(args.p)),
            ErrorCode::kInternal, "decode GEMMs: no kernel for work tiles of ", tiles.tokens,
            " slots");
  if (gemm1 && args.single_token) {
    ptx::launch(gemm1_single_token_kernel,
                dim3(single_token_gemm1_blocks(args.w, max_tiles, kStreamBlocksPerSm * sm_count())),
                dim3(kGemmWarps * 32), 0, stream, args.p.programmatic_launch, args);
  } else if (gemm1) {
    const auto kernel = w4a8(args.p)      ? gemm1_swiglu_kernel<true, 1>
                        : two_token_tiles ? gemm1_swiglu_kernel<false, 2>
                                          : gemm1_swiglu_kernel<false, 1>;
    ptx::launch(kernel, dim3(args.w.inter / kTileRows, max_tiles), dim3(kGemmWarps * 32), 0, stream,
                args.p.programmatic_launch, args);
  } else {
    const auto kernel = w4a8(args.p)      ? gemm2_kernel<true, 1>
                        : two_token_tiles ? gemm2_kernel<false, 2>
                                          : gemm2_kernel<false, 1>;
    ptx::launch(kernel, dim3(args.w.hidden / (kTileRows * kGemm2Tiles), max_tiles),
                dim3(kGemmWarps * 32), 0, stream, args.p.programmatic_launch, args);
  }
  MXQ_CUDA_CHECK_LAUNCH();
}

void take_decode_block_trace(MoeBlockTraceRecord* all) { take_translation_unit_trace(all); }

}  // namespace mxq::moe::gpu::detail
