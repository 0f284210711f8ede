#include "mxq/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <ios>

#if MXQ_WITH_CUDA
#include "mxq/core/cuda_check.h"
#endif

namespace mxq {

std::ostream& operator<<(std::ostream& out, const Device& device) {
  if (device.is_cpu()) return out << "cpu";
  return out << "cuda:" << device.index;
}

TensorView::TensorView(void* data, DType dtype, Shape shape, Device device)
    : TensorView(data, dtype, shape, contiguous_strides(shape), device) {}

TensorView::TensorView(void* data, DType dtype, Shape shape, Shape strides, Device device)
    : data_(data), dtype_(dtype), shape_(shape), strides_(strides), device_(device) {
  MXQ_CHECK(shape.rank() == strides.rank(), ErrorCode::kShapeMismatch, "tensor view: shape ", shape,
            " and strides ", strides, " differ in rank");
}

bool TensorView::is_contiguous() const {
  std::int64_t step = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != step) return false;
    step *= shape_[i];
  }
  return true;
}

void TensorView::require_dtype_is(DType dtype) const {
  if (dtype_ != dtype)
    fail_argument(ErrorCode::kDtypeMismatch, "tensor element type", dtype, dtype_);
}

namespace {

// A view with elements and no memory: an undefined Tensor / TensorView given a shape, or a
// framework's null pointer. Reading it would crash the caller's process.
void require_data(const TensorView& t, std::string_view argument) {
  if (t.data() == nullptr && t.numel() > 0) {
    fail(ErrorCode::kInvalidArgument, argument,
         ": expected a tensor with memory, found a null data ", "pointer for shape ", t.shape(),
         " (an undefined Tensor or TensorView?)");
  }
}

std::shared_ptr<void> allocate(std::size_t nbytes, Device device) {
  const std::size_t padded = (nbytes + 63) / 64 * 64;
  if (device.is_cpu()) {
    void* data = std::aligned_alloc(64, padded == 0 ? 64 : padded);
    // The CLI recognizes this message (tools/mxq/cli_util.cpp: is_allocation_failure) to name
    // the flags that asked for the memory.
    if (data == nullptr)
      fail(ErrorCode::kOutOfRange, "host allocation of ", nbytes, " bytes failed");
    return {data, [](void* p) { std::free(p); }};
  }
#if MXQ_WITH_CUDA
  const mxq::detail::DeviceScope scope(Device::cuda(device.index));
  void* data = nullptr;
  MXQ_CUDA_CHECK(cudaMalloc(&data, padded == 0 ? 64 : padded));
  return {data, [](void* p) { cudaFree(p); }};
#else
  fail(ErrorCode::kUnsupported, "device ", device,
       ": this build of mxq has no CUDA support (configure with -DMXQ_CUDA=ON)");
#endif
}

}  // namespace

Tensor Tensor::empty(DType dtype, Shape shape, Device device) {
  Tensor tensor;
  std::size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(shape.numel()), size_of(dtype), &nbytes)) {
    fail(ErrorCode::kOutOfRange, "tensor of shape ", shape, " and dtype ", dtype,
         ": its size in bytes overflows");
  }
  tensor.storage_ = allocate(nbytes, device);
  tensor.view_ = TensorView(tensor.storage_.get(), dtype, shape, device);
  return tensor;
}

Tensor Tensor::borrow(const TensorView& view, std::shared_ptr<void> owner,
                      std::string_view argument) {
  if (view.data() == nullptr) {
    fail(ErrorCode::kInvalidArgument, argument,
         ": expected memory to borrow, found a null pointer");
  }
  require_contiguous(view, argument);
  Tensor tensor;
  // The aliasing constructor: shares `owner`'s lifetime, points at the view's data. Without an
  // owner the caller guarantees that the memory outlives the Tensor.
  tensor.storage_ = owner ? std::shared_ptr<void>(std::move(owner), view.data())
                          : std::shared_ptr<void>(view.data(), [](void*) {});
  tensor.view_ = view;
  return tensor;
}

Tensor Tensor::zeros(DType dtype, Shape shape, Device device) {
  Tensor tensor = empty(dtype, shape, device);
  if (device.is_cpu()) {
    std::memset(tensor.data(), 0, tensor.nbytes());
  } else {
#if MXQ_WITH_CUDA
    MXQ_CUDA_CHECK(cudaMemset(tensor.data(), 0, tensor.nbytes()));
#endif
  }
  return tensor;
}

Tensor Tensor::to(Device device) const {
  require_data(view_, "Tensor::to");
  MXQ_CHECK(view_.is_contiguous(), ErrorCode::kInvalidArgument,
            "Tensor::to: only contiguous tensors can be copied between devices");
  Tensor out = empty(dtype(), shape(), device);
  if (this->device().is_cpu() && device.is_cpu()) {
    std::memcpy(out.data(), data(), nbytes());
    return out;
  }
#if MXQ_WITH_CUDA
  MXQ_CUDA_CHECK(cudaMemcpy(out.data(), data(), nbytes(), cudaMemcpyDefault));
#endif
  return out;
}

void require_rank(const TensorView& t, std::string_view argument, int rank) {
  require_data(t, argument);
  if (t.rank() != rank)
    fail(ErrorCode::kShapeMismatch, argument, ": expected a ", rank, "-D tensor, found shape ",
         t.shape());
}

void require_dtype(const TensorView& t, std::string_view argument, DType dtype) {
  require_data(t, argument);
  if (t.dtype() != dtype) fail_argument(ErrorCode::kDtypeMismatch, argument, dtype, t.dtype());
}

void require_device(const TensorView& t, std::string_view argument, Device device) {
  if (t.device() != device) fail_argument(ErrorCode::kDeviceMismatch, argument, device, t.device());
}

void require_contiguous(const TensorView& t, std::string_view argument) {
  require_data(t, argument);
  if (!t.is_contiguous())
    fail(ErrorCode::kInvalidArgument, argument, ": expected a contiguous tensor, found strides ",
         t.strides(), " for shape ", t.shape());
}

void require_shape(const TensorView& t, std::string_view argument, const Shape& shape) {
  require_data(t, argument);
  if (!(t.shape() == shape)) fail_argument(ErrorCode::kShapeMismatch, argument, shape, t.shape());
}

void require_aligned(const void* data, std::string_view argument, std::uintptr_t bytes,
                     std::string_view why) {
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  if (address % bytes != 0) {
    fail_argument(ErrorCode::kInvalidArgument, argument,
                  detail::concat("a ", bytes, "-byte aligned address (", why, ")"),
                  detail::concat("0x", std::hex, address));
  }
}

}  // namespace mxq
