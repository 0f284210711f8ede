#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "tune/cache_json.h"

namespace mxq::tune {
namespace detail {

// `text` as a JSON string. ASCII (every name mxq writes) is escaped here; other text goes through
// nlohmann/json, which also replaces bytes that are not UTF-8 (no JSON reader takes them) by
// U+FFFD, so that a save never writes a file that does not read back.
void append_json_string(std::string& out, std::string_view text) {
  using Json = nlohmann::json;
  const bool ascii = std::all_of(text.begin(), text.end(),
                                 [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (!ascii) {
    out += Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
    return;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      out += "\\u00";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xF]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

}  // namespace detail

namespace {

using detail::append_json_int;
using detail::append_json_string;

void append_number(std::string& out, double value) {
  char buffer[64];
  if (!std::isfinite(value)) value = 0;
  const auto result =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed, 4);
  out.append(buffer, result.ptr);
}

void append_entry(std::string& out, const CacheEntry& e) {
  out += "{\"op\":";
  append_json_string(out, e.problem.op());
  out += ",\"shape\":{";
  bool first = true;
  for (const ShapeDim& d : e.problem.dims()) {
    if (!first) out += ",";
    first = false;
    append_json_string(out, d.name);
    out += ':';
    append_json_int(out, d.value);
  }
  out += "},\"dtypes\":{";
  first = true;
  for (const DtypeField& d : e.problem.dtypes()) {
    if (!first) out += ",";
    first = false;
    append_json_string(out, d.name);
    out += ":";
    append_json_string(out, d.dtype);
  }
  out += "},\"bucket\":";
  append_json_int(out, e.bucket);
  out += ",\"tactic\":";
  append_json_string(out, e.tactic);
  out += ",\"median_us\":";
  append_number(out, e.median_us);
  out += ",\"default_us\":";
  append_number(out, e.default_us);
  out += ",\"pass\":";
  append_json_string(out, e.pass);
  out += ",\"tuned_at\":";
  append_json_string(out, e.tuned_at);
  out += ",\"ranks\":";
  append_json_int(out, e.ranks);
  out += ",\"candidates\":{";
  first = true;
  for (const CandidateTiming& c : e.candidates) {
    if (!first) out += ",";
    first = false;
    append_json_string(out, c.tactic);
    out += ":";
    append_number(out, c.median_us);
  }
  out += "}";
  if (!e.unknown_members.empty()) {
    out += ',';
    out += e.unknown_members;
  }
  out += "}";
}

void append_fingerprint(std::string& out, const Fingerprint& fp) {
  out += "{";
  bool first = true;
  for (const auto& [name, value] : fp.fields()) {
    if (!first) out += ", ";
    first = false;
    append_json_string(out, name);
    out += ": ";
    if (Fingerprint::numeric_field(name)) {
      out += value;
    } else {
      append_json_string(out, value);
    }
  }
  out += "}";
}

}  // namespace

namespace detail {

std::string serialize_cache_text(const Fingerprint& fingerprint,
                                 std::span<const CacheEntry* const> entries,
                                 std::span<const std::string> malformed) {
  std::string out;
  out.reserve(256 + (entries.size() + malformed.size()) * 300);
  out += "{\n  \"format\": ";
  append_json_string(out, kCacheFormat);
  out += ",\n  \"schema_version\": ";
  append_json_int(out, kCacheSchemaVersion);
  out += ",\n  \"fingerprint\": ";
  append_fingerprint(out, fingerprint);
  out += ",\n";
  out += "  \"entries\": [";
  bool first = true;
  for (const CacheEntry* entry : entries) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    append_entry(out, *entry);
  }
  for (const std::string& text : malformed) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    out += text;
  }
  out += first ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace detail

std::string serialize_cache(const CacheFile& file) {
  std::vector<const CacheEntry*> entries;
  entries.reserve(file.entries.size());
  for (const CacheEntry& e : file.entries) entries.push_back(&e);
  return detail::serialize_cache_text(file.fingerprint, entries, file.malformed);
}

}  // namespace mxq::tune
