// The engine-facing MoE preparation on the device (mxfp4_moe_backend.h): the rank's rows and
// channels gathered from the caller's expert tensors into the prepared tensors (padding
// written: weights 0, scales 1.0, biases 0), then the packed rows converted to the kernels'
// layout in place (weight_layout.cu). The same bytes as the host preparation
// (src/moe/cpu/prepared_moe.cpp); all on the caller's stream.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "moe/mxfp4_moe_backend.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/device.h"
#include "mxq/core/error.h"
#include "mxq/moe/cuda_moe.h"

namespace mxq::moe::detail {
namespace {

constexpr std::uint8_t kPadScale = 127;  // E8M0 1.0
constexpr int kThreads = 128;

struct PrepareArgs {
  ExpertSource src;
  std::uint8_t* w13;
  std::uint8_t* w13_scale;
  std::uint16_t* w13_bias;
  std::uint8_t* w2;
  std::uint8_t* w2_scale;
  std::uint16_t* w2_bias;
  int hidden;
  int padded;  // P
  int valid;   // the rank's channels holding data
  bool add_down_bias;
};

// One block per prepared w13 row (E_local * 2P rows): the row's 16-byte MX blocks, its scales
// (padded to the pitch with zeros) and its bias.
__global__ void __launch_bounds__(kThreads) gather_w13_kernel(PrepareArgs a) {
  const std::int64_t out_row = blockIdx.x;
  const std::int64_t e = out_row / (2 * a.padded);
  const int r = static_cast<int>(out_row % (2 * a.padded));
  const int half = r / a.padded;
  const int c = r % a.padded;
  const int units = a.hidden / 32;  // 16-byte MX blocks a row
  const int pitch = static_cast<int>(scale_pitch(a.hidden));
  auto* out = reinterpret_cast<uint4*>(a.w13 + out_row * (a.hidden / 2));
  std::uint8_t* scale = a.w13_scale + out_row * pitch;
  if (c < a.valid) {
    const std::int64_t ci = a.src.channel_offset + c;
    const std::int64_t in = a.src.inter_in;
    const std::int64_t in_row =
        (e + a.src.expert_offset) * 2 * in + (a.src.interleaved ? 2 * ci + half : half * in + ci);
    const auto* src = reinterpret_cast<const uint4*>(a.src.w13 + in_row * (a.hidden / 2));
    for (int u = threadIdx.x; u < units; u += blockDim.x) out[u] = src[u];
    const std::uint8_t* src_scale = a.src.w13_scale + in_row * units;
    for (int j = threadIdx.x; j < pitch; j += blockDim.x) scale[j] = j < units ? src_scale[j] : 0;
    if (threadIdx.x == 0 && a.w13_bias != nullptr) a.w13_bias[out_row] = a.src.w13_bias[in_row];
  } else {
    for (int u = threadIdx.x; u < units; u += blockDim.x) out[u] = make_uint4(0, 0, 0, 0);
    for (int j = threadIdx.x; j < pitch; j += blockDim.x) scale[j] = j < units ? kPadScale : 0;
    if (threadIdx.x == 0 && a.w13_bias != nullptr) a.w13_bias[out_row] = 0;
  }
}

// One block per prepared w2 row (E_local * H rows): columns [0, valid) from the input, zeros to
// P; scales 1.0 on the padded channels, zeros past P/32; the bias on the rank that adds it.
__global__ void __launch_bounds__(kThreads) gather_w2_kernel(PrepareArgs a) {
  const std::int64_t out_row = blockIdx.x;
  const std::int64_t e = out_row / a.hidden;
  const std::int64_t in_row = (e + a.src.expert_offset) * a.hidden + out_row % a.hidden;
  const int units = a.padded / 32;
  const int valid_units = a.valid / 32;
  const int pitch = static_cast<int>(scale_pitch(a.padded));
  const std::int64_t in = a.src.inter_in;
  auto* out = reinterpret_cast<uint4*>(a.w2 + out_row * (a.padded / 2));
  const auto* src =
      reinterpret_cast<const uint4*>(a.src.w2 + in_row * (in / 2) + a.src.channel_offset / 2);
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    out[u] = u < valid_units ? src[u] : make_uint4(0, 0, 0, 0);
  }
  std::uint8_t* scale = a.w2_scale + out_row * pitch;
  const std::uint8_t* src_scale = a.src.w2_scale + in_row * (in / 32) + a.src.channel_offset / 32;
  for (int j = threadIdx.x; j < pitch; j += blockDim.x) {
    scale[j] = j < valid_units ? src_scale[j] : (j < units ? kPadScale : 0);
  }
  if (threadIdx.x == 0 && a.w2_bias != nullptr) {
    a.w2_bias[out_row] = a.add_down_bias ? a.src.w2_bias[in_row] : std::uint16_t{0};
  }
}

constexpr const char* kVectorCopies = "the preparation copies 16-byte vectors";

}  // namespace

void prepare_on_device(const PreparePlan& plan, void* stream) {
  require_aligned(plan.source.w13, "experts.w13", 16, kVectorCopies);
  require_aligned(plan.source.w2, "experts.w2", 16, kVectorCopies);
  require_aligned(plan.w13, "prepared.w13", 16, kVectorCopies);
  require_aligned(plan.w2, "prepared.w2", 16, kVectorCopies);
  const PreparedMoeShapes& s = plan.shapes;
  PrepareArgs a{plan.source,
                plan.w13,
                plan.w13_scale,
                plan.w13_bias,
                plan.w2,
                plan.w2_scale,
                plan.w2_bias,
                static_cast<int>(plan.hidden),
                static_cast<int>(s.intermediate_size_per_partition_after_pad),
                static_cast<int>(s.tp.valid),
                plan.add_down_bias};
  const mxq::detail::DeviceScope on_device(plan.device);
  auto* const cuda_stream = static_cast<cudaStream_t>(stream);
  const std::int64_t w13_rows = s.ep.count * 2 * a.padded;
  const std::int64_t w2_rows = s.ep.count * plan.hidden;
  if (w13_rows > 0) {
    gather_w13_kernel<<<static_cast<unsigned>(w13_rows), kThreads, 0, cuda_stream>>>(a);
    MXQ_CUDA_CHECK_LAUNCH();
    gather_w2_kernel<<<static_cast<unsigned>(w2_rows), kThreads, 0, cuda_stream>>>(a);
    MXQ_CUDA_CHECK_LAUNCH();
  }
  const bool w4a8 = plan.activation_quant == ActivationQuant::kFp8Group128;
  const auto convert = w4a8 ? gpu::moe_weights_to_w4a8_layout : gpu::moe_weights_to_device_layout;
  convert(plan.w13, static_cast<std::size_t>(w13_rows), static_cast<int>(plan.hidden), cuda_stream);
  convert(plan.w2, static_cast<std::size_t>(w2_rows), a.padded, cuda_stream);
}

}  // namespace mxq::moe::detail
