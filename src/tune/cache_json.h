// The cache file's text: writing it, and reading it through nlohmann/json's SAX parser
// (include/mxq/tune/cache_file.h describes the format and what is kept of what cannot be read).
#pragma once

#include <charconv>
#include <span>
#include <string>
#include <string_view>

#include "mxq/tune/cache_file.h"

namespace mxq::tune::detail {

// A parse that got through the JSON: `problem` is empty when the file is usable, else says why
// not, and `other_build` whether it is an mxq cache of another build rather than a broken file.
struct ParsedCache {
  CacheFile file;
  std::string problem;
  bool other_build = false;
};

// Throws Error(kFormat) only for text that is not JSON ("not valid JSON at line L, column C"),
// nests deeper than 64 levels or holds a NUL byte.
ParsedCache parse_cache_text(std::string_view text);

// The file: `entries` in the order given (sorted by key, one per line), then `malformed` as
// they were read.
std::string serialize_cache_text(const Fingerprint& fingerprint,
                                 std::span<const CacheEntry* const> entries,
                                 std::span<const std::string> malformed);

// `text` as a JSON string (text that is not UTF-8 gets U+FFFD, so that it reads back).
void append_json_string(std::string& out, std::string_view text);

template <typename Int>
void append_json_int(std::string& out, Int value) {
  char buffer[24];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, result.ptr);
}

}  // namespace mxq::tune::detail
