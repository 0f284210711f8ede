// The boundary between Python arrays and mxq tensors, in both directions, without copies:
//  * in:  any DLPack / buffer-protocol array (NumPy, PyTorch, CuPy) becomes a TensorView of the
//         same memory. NumPy arrays of ml_dtypes' bfloat16 / float8_e4m3fn / float8_e8m0fnu are
//         read through a uint view of the same bytes. Bad arguments raise TypeError (dtype) or
//         ValueError (layout, device, rank) naming the argument.
//  * out: a Tensor moves into a capsule that a NumPy array owns; bf16 / e4m3 / e8m0 results
//         come back as the matching ml_dtypes dtype (a view of the same bytes).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
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
// Read-only NumPy array viewing `view`'s memory, kept alive by `owner`.
nb::object view_as_numpy(const TensorView& view, nb::handle owner);

std::string dtype_list(const std::vector<DType>& dtypes);

void bind_array_bridge(nb::module_& m);

}  // namespace mxq::python
