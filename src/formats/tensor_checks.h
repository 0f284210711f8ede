// Boundary checks shared by the tensor-level quantizers in src/formats (not public API).
#pragma once

#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>

#include "mxq/core/tensor.h"

namespace mxq::formats_detail {

// "f32 or bf16" for error messages.
inline std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::ostringstream out;
  std::size_t i = 0;
  for (DType dtype : dtypes) {
    if (i > 0) out << (i + 1 == dtypes.size() ? " or " : ", ");
    out << dtype;
    ++i;
  }
  return out.str();
}

inline void require_dtype_in(const TensorView& t, std::string_view argument,
                             std::initializer_list<DType> dtypes) {
  for (DType dtype : dtypes) {
    if (t.dtype() == dtype) return;
  }
  fail_argument(ErrorCode::kDtypeMismatch, argument, dtype_list(dtypes), t.dtype());
}

// Host memory, contiguous: what every CPU loop in this module reads.
inline void require_host_contiguous(const TensorView& t, std::string_view argument) {
  require_device(t, argument, Device::cpu());
  require_contiguous(t, argument);
}

}  // namespace mxq::formats_detail
