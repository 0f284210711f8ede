#include "cuda/tensor_map.h"

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

}  // namespace

CUtensorMap make_2d(CUtensorMapDataType type, const void* base, std::uint64_t rows,
                    std::uint64_t cols, std::uint64_t row_stride_bytes, std::uint32_t box_rows,
                    std::uint32_t box_cols, CUtensorMapSwizzle swizzle, const char* what) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result =
      encode(&map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    fail(ErrorCode::kCuda, "cuTensorMapEncodeTiled failed for ", what, " (CUresult ",
         static_cast<int>(result), "): rows ", rows, ", cols ", cols, ", row stride ",
         row_stride_bytes, " bytes, box ", box_rows, "x", box_cols);
  }
  return map;
}

}  // namespace mxq::tma
