// NumPy .npy files (format versions 1.0-3.0 on read, 1.0 on write): f32, f16, i32, i64, u8 in
// C order, little-endian. Anything else is an mxq::Error that says what was found.
#pragma once

#include <span>
#include <string>

#include "mxq/core/tensor.h"

namespace mxq::io {

Tensor read_npy(const std::string& path);
Tensor parse_npy(std::span<const std::byte> bytes, const std::string& label = "<memory>");
// Writes a contiguous host tensor; temp file + rename, so nothing is left behind on error.
void write_npy(const std::string& path, const TensorView& tensor);

}  // namespace mxq::io
