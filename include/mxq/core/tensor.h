// TensorView (non-owning: pointer, shape, strides in elements, dtype, device) and Tensor
// (owning host or CUDA memory). Checks at the API boundary go through the require_* helpers,
// which name the argument, what was expected and what was found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "mxq/core/device.h"
#include "mxq/core/dtype.h"
#include "mxq/core/error.h"
#include "mxq/core/shape.h"

namespace mxq {

class TensorView {
 public:
  TensorView() = default;
  // Contiguous view.
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::cpu());
  TensorView(void* data, DType dtype, Shape shape, Shape strides, Device device);

  [[nodiscard]] void* data() const { return data_; }
  [[nodiscard]] DType dtype() const { return dtype_; }
  [[nodiscard]] const Shape& shape() const { return shape_; }
  [[nodiscard]] const Shape& strides() const { return strides_; }
  [[nodiscard]] Device device() const { return device_; }
  [[nodiscard]] int rank() const { return shape_.rank(); }
  [[nodiscard]] std::int64_t size(int dim) const { return shape_.dim(dim); }
  [[nodiscard]] std::int64_t numel() const { return shape_.numel(); }
  [[nodiscard]] std::size_t nbytes() const {
    return static_cast<std::size_t>(numel()) * size_of(dtype_);
  }
  [[nodiscard]] bool is_contiguous() const;

  // Typed pointer; throws when T does not match the dtype.
  template <typename T>
  [[nodiscard]] T* data_as() const {
    require_dtype_is(DTypeOf<T>::value);
    return static_cast<T*>(data_);
  }
  // Raw bytes, for 16-bit and 8-bit float types with no C++ spelling.
  [[nodiscard]] std::byte* bytes() const { return static_cast<std::byte*>(data_); }

 private:
  void require_dtype_is(DType dtype) const;

  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
  Device device_ = Device::cpu();
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates uninitialized contiguous memory on `device` (host memory is 64-byte aligned).
  static Tensor empty(DType dtype, Shape shape, Device device = Device::cpu());
  static Tensor zeros(DType dtype, Shape shape, Device device = Device::cpu());
  // A Tensor over memory it does not own (a framework's array, e.g. a torch or NumPy tensor
  // handed over through DLPack): no copy. `owner` is kept alive as long as this Tensor or a copy
  // of it lives, so APIs that hold Tensors (weights) can use borrowed memory. `view` must be
  // contiguous and non-null (throws naming `argument` otherwise).
  static Tensor borrow(const TensorView& view, std::shared_ptr<void> owner,
                       std::string_view argument = "tensor");

  [[nodiscard]] const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT(google-explicit-constructor)
  [[nodiscard]] void* data() const { return view_.data(); }
  template <typename T>
  [[nodiscard]] T* data_as() const {
    return view_.data_as<T>();
  }
  [[nodiscard]] DType dtype() const { return view_.dtype(); }
  [[nodiscard]] const Shape& shape() const { return view_.shape(); }
  [[nodiscard]] std::int64_t numel() const { return view_.numel(); }
  [[nodiscard]] std::size_t nbytes() const { return view_.nbytes(); }
  [[nodiscard]] Device device() const { return view_.device(); }
  [[nodiscard]] bool defined() const { return storage_ != nullptr; }

  // Copy between devices (host<->CUDA); the result is contiguous.
  [[nodiscard]] Tensor to(Device device) const;

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Boundary checks: each throws mxq::Error naming `argument`.
void require_rank(const TensorView& t, std::string_view argument, int rank);
void require_dtype(const TensorView& t, std::string_view argument, DType dtype);
void require_device(const TensorView& t, std::string_view argument, Device device);
void require_contiguous(const TensorView& t, std::string_view argument);
void require_shape(const TensorView& t, std::string_view argument, const Shape& shape);
// `data` on a multiple of `bytes`; `why` says which access needs it (a kernel's 16-byte loads).
void require_aligned(const void* data, std::string_view argument, std::uintptr_t bytes,
                     std::string_view why);

}  // namespace mxq
