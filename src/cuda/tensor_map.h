// TMA tensor maps for the Hopper kernels, built through the driver's cuTensorMapEncodeTiled,
// reached via cudaGetDriverEntryPointByVersion so that mxq never links libcuda directly.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mxq::tma {

// A 2-D row-major tensor [rows, cols] with a row stride of `row_stride_bytes`, read in boxes of
// [box_rows, box_cols]; out-of-bounds elements read as zero (and are skipped on store). Throws
// mxq::Error(kUnsupported) when the driver has no TMA, kCuda when the driver refuses the map.
CUtensorMap make_2d(CUtensorMapDataType type, const void* base, std::uint64_t rows,
                    std::uint64_t cols, std::uint64_t row_stride_bytes, std::uint32_t box_rows,
                    std::uint32_t box_cols, CUtensorMapSwizzle swizzle, const char* what);

}  // namespace mxq::tma
