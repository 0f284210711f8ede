#include "cuda_common/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"

namespace mxq::tma {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  MXQ_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                  cudaEnableDefault, &status));
  if (status != cudaDriverEntryPointSuccess || function == nullptr) {
    fail(ErrorCode::kUnsupported,
         "cuTensorMapEncodeTiled is not available from the CUDA driver (driver too old for TMA)");
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
}

// Encodes a tiled map of `rank` dimensions (dims and box innermost first, strides of dimensions
// 1.. in bytes) into `map`.
CUresult encode_tiled(CUtensorMap& map, CUtensorMapDataType type, const void* base, cuuint32_t rank,
                      const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                      CUtensorMapSwizzle swizzle) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  return encode(&map, type, rank, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace

CUtensorMap make_2d(CUtensorMapDataType type, const void* base, std::uint64_t rows,
                    std::uint64_t cols, std::uint64_t row_stride_bytes, std::uint32_t box_rows,
                    std::uint32_t box_cols, CUtensorMapSwizzle swizzle, const char* what) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  CUtensorMap map{};
  const CUresult result = encode_tiled(map, type, base, 2, dims, strides, box, swizzle);
  if (result != CUDA_SUCCESS) {
    fail(ErrorCode::kCuda, "cuTensorMapEncodeTiled failed for ", what, " (CUresult ",
         static_cast<int>(result), "): rows ", rows, ", cols ", cols, ", row stride ",
         row_stride_bytes, " bytes, box ", box_rows, "x", box_cols);
  }
  return map;
}

CUtensorMap make_3d(CUtensorMapDataType type, const void* base, const std::uint64_t (&dims)[3],
                    const std::uint64_t (&strides)[2], const std::uint32_t (&box)[3],
                    CUtensorMapSwizzle swizzle, const char* what) {
  const cuuint64_t d[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t st[2] = {strides[0], strides[1]};
  const cuuint32_t b[3] = {box[0], box[1], box[2]};
  CUtensorMap map{};
  const CUresult result = encode_tiled(map, type, base, 3, d, st, b, swizzle);
  if (result != CUDA_SUCCESS) {
    fail(ErrorCode::kCuda, "cuTensorMapEncodeTiled failed for ", what, " (CUresult ",
         static_cast<int>(result), "): dims ", dims[0], "x", dims[1], "x", dims[2], ", strides ",
         strides[0], ", ", strides[1], " bytes, box ", box[0], "x", box[1], "x", box[2]);
  }
  return map;
}

}  // namespace mxq::tma
