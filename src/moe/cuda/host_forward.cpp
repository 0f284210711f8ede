#include "host_forward.h"

#include <cstring>

#include "mxq/core/cuda_check.h"
#include "mxq/core/device.h"
#include "mxq/core/error.h"
#include "mxq/formats/bf16.h"

namespace mxq::moe::detail {

Tensor forward_on_host(const TensorView& x, const Routing* routing, Device device,
                       const DeviceForward& forward) {
  require_rank(x, "x", 2);
  require_device(x, "x", Device::cpu());
  require_contiguous(x, "x");
  Tensor x_bf16 = Tensor::empty(DType::kBF16, x.shape());
  auto* xb = static_cast<std::uint16_t*>(x_bf16.data());
  if (x.dtype() == DType::kBF16) {
    std::memcpy(xb, x.data(), x.nbytes());
  } else {
    require_dtype(x, "x", DType::kF32);
    const float* xf = x.data_as<float>();
    for (std::int64_t i = 0; i < x.numel(); ++i) xb[i] = float_to_bf16(xf[i]);
  }
  const mxq::detail::DeviceScope on_device(device);
  const Tensor x_dev = x_bf16.to(device);
  Tensor out_dev = Tensor::empty(DType::kBF16, x.shape(), device);
  Tensor ids_dev;
  Tensor weights_dev;
  if (routing != nullptr) {
    ids_dev = routing->ids.to(device);
    weights_dev = routing->weights.to(device);
  }
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    forward(x_dev, out_dev, stream, routing ? ids_dev.view() : TensorView{},
            routing ? weights_dev.view() : TensorView{});
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
  const Tensor out_bf16 = out_dev.to(Device::cpu());
  Tensor out = Tensor::empty(DType::kF32, out_bf16.shape());
  const auto* ob = static_cast<const std::uint16_t*>(out_bf16.data());
  for (std::int64_t i = 0; i < out.numel(); ++i) out.data_as<float>()[i] = bf16_to_float(ob[i]);
  return out;
}

}  // namespace mxq::moe::detail
