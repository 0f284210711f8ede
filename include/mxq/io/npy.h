// NumPy .npy files: f32, f16, i32, i64, u8 in C order, little-endian. Reads format versions
// 1.0-3.0; writes 1.0 (2.0 when the header needs it), byte-identical to numpy.save. Anything else
// is an mxq::Error(kFormat) that says what was found. See docs/io.md.
#pragma once

#include <span>
#include <string>

#include "mxq/core/tensor.h"

namespace mxq::io {

// Reads the whole array into a new host tensor (the file is mapped, then copied once).
Tensor read_npy(const std::string& path);
// Parses an in-memory image (used by the fuzzer and tests); `label` names it in error messages.
Tensor parse_npy(std::span<const std::byte> bytes, const std::string& label = "<memory>");
// Writes a contiguous host tensor; temp file + rename, so nothing is left behind on error.
void write_npy(const std::string& path, const TensorView& tensor);

}  // namespace mxq::io
