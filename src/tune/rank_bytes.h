// The byte form of what ranks exchange while tuning and sealing (internal): text and doubles as
// the communicator's all-gather carries them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace mxq::tune::detail {

inline std::vector<std::uint8_t> doubles_to_bytes(const std::vector<double>& values) {
  std::vector<std::uint8_t> bytes(values.size() * sizeof(double));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

inline std::vector<double> bytes_to_doubles(const std::vector<std::uint8_t>& bytes) {
  std::vector<double> values(bytes.size() / sizeof(double));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(double));
  return values;
}

inline std::vector<std::uint8_t> text_bytes(const std::string& text) {
  return {text.begin(), text.end()};
}

// The cache path a tuner reads (and, except in fresh mode, writes).

}  // namespace mxq::tune::detail
