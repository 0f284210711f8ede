// The TMA views of the packed MXFP4 weights that the wgmma GEMMs of both activation precisions
// read (gemm_wgmma.cuh, gemm_wgmma_w4a8.cuh): the rows' groups (row_groups.h) as
// [groups][16 * full chunks][64 bytes], in boxes of `box_groups` groups x 16 rows x 64 bytes of
// one chunk (64-byte swizzled), and the short last chunk of the stored rows (K not a multiple of
// 128: nb < 4 MX blocks) as [groups][16][nb * 16 bytes], unswizzled (built only when the rows
// have one). Host code of the launch files.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>

#include "cuda_common/tensor_map.h"
#include "gemm_common.cuh"
#include "moe/layout/row_groups.h"

namespace mxq::moe::gpu::detail {

struct WgmmaWeightMaps {
  CUtensorMap full;
  CUtensorMap last;  // the short last chunk (unset when the rows have none)
};

inline WgmmaWeightMaps make_wgmma_weight_maps(const MoeDeviceWeights& w, bool gemm1,
                                              std::uint32_t box_groups) {
  const auto experts = static_cast<std::uint64_t>(w.num_local_experts);
  const std::uint64_t groups =
      (gemm1 ? experts * 2 * w.inter_padded : experts * w.hidden) / kGroupRows;
  const int stored_k = stored_row_k(w, gemm1);
  const std::uint64_t group_bytes = kGroupRows * static_cast<std::uint64_t>(stored_k / 2);
  const std::uint64_t full_chunks = stored_k / kLayoutChunk;
  const int short_blocks = chunk_blocks(stored_k, static_cast<int>(full_chunks));
  const std::uint8_t* weights = gemm1 ? w.w13 : w.w2;
  WgmmaWeightMaps maps{};
  // With no full chunk (K < 128) the map is never read; it still needs a valid shape.
  maps.full =
      tma::make_3d(CU_TENSOR_MAP_DATA_TYPE_UINT8, weights,
                   {kChunkBytes, kGroupRows * std::max<std::uint64_t>(full_chunks, 1), groups},
                   {kChunkBytes, group_bytes}, {kChunkBytes, kGroupRows, box_groups},
                   CU_TENSOR_MAP_SWIZZLE_64B, "MoE wgmma weights");
  if (short_blocks > 0) {
    const auto row_bytes = static_cast<std::uint32_t>(16 * short_blocks);
    maps.last =
        tma::make_3d(CU_TENSOR_MAP_DATA_TYPE_UINT8, weights + full_chunks * kGroupChunkBytes,
                     {row_bytes, kGroupRows, groups}, {row_bytes, group_bytes},
                     {row_bytes, kGroupRows, box_groups}, CU_TENSOR_MAP_SWIZZLE_NONE,
                     "MoE wgmma weights (short last chunk)");
  }
  return maps;
}

}  // namespace mxq::moe::gpu::detail
