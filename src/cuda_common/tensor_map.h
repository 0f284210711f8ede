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

// A 3-D tensor: dims[0] innermost (elements, contiguous), dims[1] and dims[2] with byte strides
// strides[0] and strides[1], read in boxes of box[0] x box[1] x box[2], laid out densely in
// shared memory in that order. Out-of-bounds elements read as zero. Errors as make_2d.
CUtensorMap make_3d(CUtensorMapDataType type, const void* base, const std::uint64_t (&dims)[3],
                    const std::uint64_t (&strides)[2], const std::uint32_t (&box)[3],
                    CUtensorMapSwizzle swizzle, const char* what);

}  // namespace mxq::tma
