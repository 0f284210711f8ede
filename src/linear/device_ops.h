// Device-side helpers of the linear op (internal). Defined in src/linear/cuda/device_ops.cpp
// when mxq is built with CUDA; without CUDA each throws mxq::Error(kUnsupported) and
// append_cuda_tactics adds nothing. `stream` is a cudaStream_t (null: the default stream).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mxq/core/tensor.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/linear/tactic.h"

namespace mxq::linear::internal {

// Packed UE8M0 i32 [ceil(groups/4), round_up(mn, 4)] on the device -> out[m * stride_mn +
// g * stride_g] for m < out_rows (rows past mn are written as 0).
void unpack_ue8m0_on_device(const TensorView& packed, std::int64_t mn, std::int64_t groups,
                            float* out, std::int64_t out_rows, std::int64_t stride_mn,
                            std::int64_t stride_g, void* stream);

// f32 [mn, groups] on the device, element (m, g) at in[m * stride_mn + g * stride_g] ->
// [groups, out_ld] (rows past mn are 0).
void transpose_scales_on_device(const float* in, std::int64_t mn, std::int64_t groups,
                                std::int64_t stride_mn, std::int64_t stride_g, float* out,
                                std::int64_t out_ld, void* stream);

// bf16 x [M, K] on the device -> q e4m3 [M, ldq] (zero padded) and scales [G, scale_ld].
void quantize_activations_on_device(const TensorView& x, std::int64_t group_k, ScaleMode mode,
                                    std::uint8_t* q, std::int64_t ldq, float* scale,
                                    std::int64_t scale_ld, void* stream);

void append_cuda_tactics(std::vector<std::unique_ptr<LinearTactic>>& tactics);

// `bytes` of device memory on the current device, allocated in the order of `stream` and freed
// in that order when the last owner lets go (so a kernel queued before the release still reads
// valid memory).
std::shared_ptr<void> stream_ordered_buffer(std::size_t bytes, void* stream);

}  // namespace mxq::linear::internal
