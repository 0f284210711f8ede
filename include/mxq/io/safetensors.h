// safetensors: a memory-mapped reader whose every header field and offset is bounds-checked
// (a truncated or malicious file is an mxq::Error(kFormat), never a crash), and a writer that
// writes a temporary file and renames it, so nothing is left behind on error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mxq/core/tensor.h"

namespace mxq::io {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  std::size_t begin = 0;  // byte offsets into the data section, as in the header
  std::size_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the header. Throws mxq::Error(kIo or kFormat).
  static SafetensorsFile open(const std::string& path);
  // Parses an in-memory image (used by the fuzzer and tests); the bytes must outlive the file.
  static SafetensorsFile parse(std::span<const std::byte> bytes, std::string label = "<memory>");

  [[nodiscard]] const std::string& path() const;
  // In file order: by data offset; tensors at the same offset (empty ones) in header order.
  [[nodiscard]] const std::vector<SafetensorsEntry>& entries() const;
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const;  // __metadata__
  [[nodiscard]] bool contains(const std::string& name) const;
  // Throws kInvalidArgument naming the file and the tensor when absent.
  [[nodiscard]] const SafetensorsEntry& entry(const std::string& name) const;
  // Read-only view of the mapped bytes (do not write through it). Only touched pages are read.
  // The format does not align tensor data, so the view's pointer may be misaligned for its dtype:
  // copy from it (memcpy, cudaMemcpy) unless is_aligned() says typed access is safe.
  [[nodiscard]] TensorView view(const std::string& name) const;
  [[nodiscard]] std::span<const std::byte> bytes(const std::string& name) const;
  // Whether the tensor's data address is a multiple of its element size (always true for 1-byte
  // dtypes; true for every tensor written by write_safetensors in order of decreasing dtype size).
  [[nodiscard]] bool is_aligned(const std::string& name) const;

 private:
  struct State;
  // `owner` keeps `bytes` alive (the mapping for open(), nothing for parse()).
  static SafetensorsFile parse_owned(std::span<const std::byte> bytes, std::string label,
                                     std::shared_ptr<const void> owner);
  [[nodiscard]] const State& state() const;
  std::shared_ptr<const State> state_;
};

using NamedTensor = std::pair<std::string, TensorView>;

// Writes host tensors (contiguous) in the given order; metadata goes to __metadata__. Temp file +
// fsync + rename: on error nothing is left behind and an existing `path` is untouched. Refuses
// device or strided tensors, repeated names and e2m1x2 (store packed FP4 as U8). docs/io.md.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mxq::io
