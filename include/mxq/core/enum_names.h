// The names of an enum, declared once as a table: to_string, parsing and the error that lists the
// choices all come from it, so a new value is one table entry. E.g.
//   constexpr EnumNames<Backend, 2> kBackendNames{{{{Backend::kCpu, "cpu"},
//                                                   {Backend::kCuda, "cuda"}}}};
//   std::string_view to_string(Backend b) { return kBackendNames.name(b); }
//   Backend backend_from_string(std::string_view t) { return kBackendNames.parse(t, "backend"); }
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "mxq/core/error.h"

namespace mxq {

template <typename E, std::size_t N>
struct EnumNames {
  std::array<std::pair<E, std::string_view>, N> entries;

  // The value's name; "?" for a value outside the table (a cast integer).
  [[nodiscard]] constexpr std::string_view name(E value) const {
    for (const auto& [v, n] : entries) {
      if (v == value) return n;
    }
    return "?";
  }
  // The value named `text` exactly, if any.
  [[nodiscard]] constexpr std::optional<E> find(std::string_view text) const {
    for (const auto& [v, n] : entries) {
      if (n == text) return v;
    }
    return std::nullopt;
  }
  // "\"a\" or \"b\"", or "one of \"a\", \"b\", \"c\"".
  [[nodiscard]] std::string choices() const {
    std::string out = N > 2 ? "one of " : "";
    for (std::size_t i = 0; i < N; ++i) {
      if (i > 0) out += N == 2 ? " or " : ", ";
      out.append("\"").append(entries[i].second).append("\"");
    }
    return out;
  }
  // The value named `text`; otherwise mxq::Error(kInvalidArgument) naming `argument`, the
  // choices and what was found.
  [[nodiscard]] E parse(std::string_view text, std::string_view argument) const {
    if (const std::optional<E> value = find(text)) return *value;
    fail_argument(ErrorCode::kInvalidArgument, argument, choices(),
                  std::string("\"").append(text).append("\""));
  }
};

}  // namespace mxq
