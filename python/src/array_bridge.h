// The boundary between Python arrays and mxq tensors, in both directions, without copies:
//  * in:  any DLPack / buffer-protocol array (NumPy, PyTorch, CuPy) becomes a TensorView of the
//         same memory. NumPy arrays of ml_dtypes' bfloat16 / float8_e4m3fn / float8_e8m0fnu are
//         read through a uint view of the same bytes. Bad arguments raise TypeError (dtype) or
//         ValueError (layout, device, rank) naming the argument.
//  * out: a host Tensor moves into a capsule that a NumPy array owns; bf16 / e4m3 / e8m0 results
//         come back as the matching ml_dtypes dtype (a view of the same bytes). A device Tensor
//         moves into a DLPack exporter (nanobind.nb_ndarray) in its storage dtype (bf16 as
//         uint16, e4m3 / e8m0 as uint8); the Python side reinterprets it for its framework.
//  * borrowed: a Tensor over an array's memory that keeps the array alive (weights handed over
//         from torch without a copy).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/core/tensor.h"

namespace mxq::python {

namespace nb = nanobind;

// A TensorView of a Python array plus the Python objects that must live while it is used.
struct ArrayArg {
  TensorView view;
  nb::object keep_alive;
};

struct ArrayRequirements {
  std::vector<DType> dtypes;  // accepted dtypes; empty = any
  int rank = -1;              // -1 = any
  bool contiguous = true;     // C-contiguous (row-major, dense)
  bool host_only = true;      // CPU memory only
};

// Raises TypeError/ValueError naming `argument` when `array` does not meet `requirements`.
ArrayArg array_arg(nb::handle array, std::string_view argument,
                   const ArrayRequirements& requirements);

// NumPy array owning `tensor` (host tensors only).
nb::object to_numpy(Tensor tensor);
// DLPack exporter owning `tensor` (host or CUDA), elements in their storage dtype.
nb::object to_dlpack(Tensor tensor);
// to_numpy for host tensors, to_dlpack for device tensors.
nb::object to_python(Tensor tensor);

// Holds a reference to `object` until the last copy of the pointer is gone; the reference is
// dropped with the GIL held (from any thread).
std::shared_ptr<void> python_owner(nb::object object);
// A Tensor over `arg`'s memory, without a copy, keeping the Python array alive. `dtype`
// reinterprets the elements (same size), e.g. uint8 codes as e4m3.
Tensor borrow_tensor(const ArrayArg& arg, DType dtype, std::string_view argument);

// "cpu", "cuda" or "cuda:N"; raises naming `argument` otherwise.
Device device_arg(const std::string& text, std::string_view argument);

// A cudaStream_t passed from Python as an integer (0: the legacy default stream).
inline void* stream_arg(std::uintptr_t stream) { return reinterpret_cast<void*>(stream); }
// Read-only NumPy array viewing `view`'s memory, kept alive by `owner` (a read-only DLPack
// array for device memory).
nb::object view_as_numpy(const TensorView& view, nb::handle owner);

std::string dtype_list(const std::vector<DType>& dtypes);

void bind_array_bridge(nb::module_& m);

}  // namespace mxq::python
