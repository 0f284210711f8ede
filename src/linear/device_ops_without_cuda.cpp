// The device helpers of a build without CUDA: no CUDA tactics, and a clear error if a device
// operation is ever asked for (dispatch never offers one).
#include "linear/device_ops.h"

#if !MXQ_WITH_CUDA
#include "mxq/core/error.h"

namespace mxq::linear::internal {
namespace {
[[noreturn]] void no_cuda() {
  fail(ErrorCode::kUnsupported,
       "this build of mxq has no CUDA support (configure with -DMXQ_CUDA=ON)");
}
}  // namespace

void unpack_ue8m0_on_device(const TensorView&, std::int64_t, std::int64_t, float*, std::int64_t,
                            std::int64_t, std::int64_t, void*) {
  no_cuda();
}
void transpose_scales_on_device(const float*, std::int64_t, std::int64_t, std::int64_t,
                                std::int64_t, float*, std::int64_t, void*) {
  no_cuda();
}
void quantize_activations_on_device(const TensorView&, std::int64_t, ScaleMode, std::uint8_t*,
                                    std::int64_t, float*, std::int64_t, void*) {
  no_cuda();
}
void append_cuda_tactics(std::vector<std::unique_ptr<LinearTactic>>&) {}

std::shared_ptr<void> stream_ordered_buffer(std::size_t, void*) { no_cuda(); }

}  // namespace mxq::linear::internal
#endif
