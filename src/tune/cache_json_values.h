// The pieces the cache file's SAX reader (cache_json_read.cpp) builds on: a JSON scalar as the
// parser hands it over, the fingerprint's and an entry's member names, and what makes a read
// entry servable.
#pragma once

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tune/cache_json.h"

namespace mxq::tune::detail {

// A JSON scalar as the SAX parser hands it over (a non-negative integer comes as kUnsigned).
struct Scalar {
  enum class Type { kNull, kBool, kInteger, kUnsigned, kFloat, kString };
  Type type = Type::kNull;
  bool boolean = false;
  std::int64_t integer = 0;
  std::uint64_t unsigned_integer = 0;
  double number = 0;
  const std::string* lexeme = nullptr;  // kFloat: as written
  std::string* string = nullptr;        // kString (may be moved from)

  [[nodiscard]] bool is_number() const {
    return type == Type::kInteger || type == Type::kUnsigned || type == Type::kFloat;
  }
  [[nodiscard]] double as_double() const {
    if (type == Type::kInteger) return static_cast<double>(integer);
    if (type == Type::kUnsigned) return static_cast<double>(unsigned_integer);
    return number;
  }
  // An integer (no fraction or exponent) that fits in int64.
  [[nodiscard]] std::optional<std::int64_t> as_int64() const {
    if (type == Type::kInteger) return integer;
    if (type == Type::kUnsigned && unsigned_integer <= static_cast<std::uint64_t>(INT64_MAX))
      return static_cast<std::int64_t>(unsigned_integer);
    return std::nullopt;
  }
};

// The scalar as JSON text.
void append_scalar(std::string& out, const Scalar& s);
// A value where an integer belongs, for a message: `"1" (a string)`, `1.5 (not an integer)`.
std::string describe(const Scalar& s);

// The fingerprint's string / integer member `name`, or null for another name.
std::string* fingerprint_string(Fingerprint& fp, std::string_view name);
int* fingerprint_int(Fingerprint& fp, std::string_view name);
// Whether `name` is a member an entry may have (others are kept as unknown fields).
bool known_entry_member(std::string_view name);

// What the top level of a cache file held, besides the entries.
struct TopLevel {
  bool is_object = true;
  std::string format;
  bool have_version = false;
  std::optional<std::int64_t> version;  // when given as an integer
  std::string version_found;            // else what was there, for the message
  bool have_fingerprint = false;
  std::string fingerprint_problem;
  std::string entries_problem = "missing \"entries\"";
};

// The entry being read.
struct EntryState {
  CacheEntry e;
  std::string op;
  std::vector<ShapeDim> dims;
  std::vector<DtypeField> dtypes;
  bool have_op = false, have_shape = false, have_dtypes = false, have_bucket = false,
       have_tactic = false;
  std::string problem;  // the first thing wrong with it
};

// Why a well-formed entry cannot be served ("" when it can; then s.e is complete).
std::string complete_entry(EntryState& s);

}  // namespace mxq::tune::detail
