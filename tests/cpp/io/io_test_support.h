// Helpers for the file I/O tests: a scratch directory, raw file access, and error expectations.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/core/error.h"

namespace mxq::io::testing {

using Bytes = std::vector<std::byte>;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "mxq-io-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  [[nodiscard]] std::string file(std::string_view name) const { return (path_ / name).string(); }
  // Names of everything in the directory (temporary files included), sorted.
  [[nodiscard]] std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline Bytes to_bytes(std::string_view text) {
  Bytes out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<std::byte>(text[i]);
  return out;
}

inline void append(Bytes& out, std::string_view text) {
  const Bytes more = to_bytes(text);
  out.insert(out.end(), more.begin(), more.end());
}

inline void append_le(Bytes& out, std::uint64_t value, int count) {
  for (int i = 0; i < count; ++i) out.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
}

inline Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return to_bytes(text);
}

inline void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// Runs `action`, expects an mxq::Error with `code` whose message contains every fragment.
inline void expect_error(const std::function<void()>& action, ErrorCode code,
                         std::initializer_list<std::string_view> fragments) {
  try {
    action();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << "message: " << error.what();
    const std::string message = error.what();
    for (const auto fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' lacks '" << fragment << "'";
    return;
  }
  ADD_FAILURE() << "expected an mxq::Error (" << to_string(code) << ")";
}

}  // namespace mxq::io::testing
