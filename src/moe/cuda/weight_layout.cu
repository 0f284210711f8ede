// The kernels' device layouts of prepared MXFP4 weights (row groups of 16 rows, words permuted for
// W4A16 or placed for W4A8: row_groups.h, mxfp4_device_layout.h, w4a8_layout.h) and scales.
#include <cstddef>
#include <cstdint>

#include "moe/layout/mxfp4_device_layout.h"
#include "moe/layout/row_groups.h"
#include "moe/layout/w4a8_layout.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/moe/cuda_moe.h"

namespace mxq::moe::gpu {
namespace {

using namespace detail;  // the layouts' constants and converters

// One block per row group (row_groups.h): the group's rows are read into shared memory, then
// each thread writes row chunks, their words converted (W4A16: device words in order; W4A8: its
// words, lane-contiguous), to their place in the group.
template <bool kW4a8>
__global__ void to_row_groups_kernel(std::uint8_t* packed, int k) {
  extern __shared__ uint4 group_smem[];
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  const std::size_t group_bytes = kGroupRows * row_bytes;
  std::uint8_t* base = packed + blockIdx.x * group_bytes;
  for (std::size_t i = threadIdx.x; i < group_bytes / 16; i += blockDim.x)
    group_smem[i] = reinterpret_cast<const uint4*>(base)[i];
  __syncthreads();
  const auto* group = reinterpret_cast<const std::uint8_t*>(group_smem);
  const int chunks = (k + kLayoutChunk - 1) / kLayoutChunk;
  for (int item = threadIdx.x; item < chunks * kGroupRows; item += blockDim.x) {
    const int q = item / kGroupRows;
    const int i = item % kGroupRows;
    const int nb = chunk_blocks(k, q);
    const auto* in_words = reinterpret_cast<const std::uint32_t*>(
        group + i * row_bytes + static_cast<std::size_t>(q) * kChunkBytes);
    std::uint32_t in[16];
    std::uint32_t out[16];
    for (int j = 0; j < 4 * nb; ++j) in[j] = in_words[j];
    if constexpr (kW4a8) {
      w4a8_convert_chunk(in, nb, out);
    } else {
      device_convert_chunk(in, nb, out);
    }
    auto* out_words = reinterpret_cast<std::uint32_t*>(base + group_offset(k, q, i));
    for (int j = 0; j < 4 * nb; ++j) out_words[j] = out[j];
  }
}

// Rearranges `rows` packed rows of k values into row groups in place (`what` names the caller).
void to_row_groups(bool w4a8, std::uint8_t* packed, std::size_t rows, int k, cudaStream_t stream,
                   const char* what) {
  MXQ_CHECK(k > 0 && k % 32 == 0, ErrorCode::kInvalidArgument, what,
            ": k: expected a positive multiple of 32, found ", k);
  MXQ_CHECK(reinterpret_cast<std::uintptr_t>(packed) % 16 == 0, ErrorCode::kInvalidArgument, what,
            ": expected 16-byte aligned weights");
  MXQ_CHECK(rows % kGroupRows == 0, ErrorCode::kInvalidArgument, what,
            ": rows: expected a multiple of 16, found ", rows);
  MXQ_CHECK(k <= kMaxGroupedK, ErrorCode::kUnsupported, what, ": k: at most ", kMaxGroupedK,
            " values a row (a row group in shared memory), found ", k);
  if (rows == 0) return;
  const int group_bytes = kGroupRows * (k / 2);
  const auto kernel = w4a8 ? to_row_groups_kernel<true> : to_row_groups_kernel<false>;
  MXQ_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, group_bytes));
  kernel<<<static_cast<unsigned>(rows / kGroupRows), 256, static_cast<std::size_t>(group_bytes),
           stream>>>(packed, k);
  MXQ_CUDA_CHECK_LAUNCH();
}

}  // namespace

void moe_weights_to_device_layout(std::uint8_t* packed, std::size_t rows, int k,
                                  cudaStream_t stream) {
  to_row_groups(false, packed, rows, k, stream, "moe_weights_to_device_layout");
}

void moe_weights_to_w4a8_layout(std::uint8_t* packed, std::size_t rows, int k,
                                cudaStream_t stream) {
  to_row_groups(true, packed, rows, k, stream, "moe_weights_to_w4a8_layout");
}

void moe_scales_to_device_layout(const std::uint8_t* src, std::size_t rows, int k,
                                 std::uint8_t* dst, cudaStream_t stream) {
  MXQ_CHECK(k > 0 && k % 32 == 0, ErrorCode::kInvalidArgument,
            "moe_scales_to_device_layout: k: expected a positive multiple of 32, found ", k);
  if (rows == 0) return;
  const std::size_t pitch = static_cast<std::size_t>(moe_scale_pitch(k));
  const std::size_t width = static_cast<std::size_t>(k / 32);
  MXQ_CUDA_CHECK(cudaMemsetAsync(dst, 0, rows * pitch, stream));
  MXQ_CUDA_CHECK(cudaMemcpy2DAsync(dst, pitch, src, width, width, rows, cudaMemcpyDefault, stream));
}

}  // namespace mxq::moe::gpu
