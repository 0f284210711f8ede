// The cache reader's scalars, member names and entry completion (cache_json_values.h).
#include "tune/cache_json_values.h"

#include <utility>

#include "mxq/core/error.h"

namespace mxq::tune::detail {

void append_scalar(std::string& out, const Scalar& s) {
  switch (s.type) {
    case Scalar::Type::kNull:
      out += "null";
      break;
    case Scalar::Type::kBool:
      out += s.boolean ? "true" : "false";
      break;
    case Scalar::Type::kInteger:
      append_json_int(out, s.integer);
      break;
    case Scalar::Type::kUnsigned:
      append_json_int(out, s.unsigned_integer);
      break;
    case Scalar::Type::kFloat:
      out += *s.lexeme;
      break;
    case Scalar::Type::kString:
      append_json_string(out, *s.string);
      break;
  }
}

std::string describe(const Scalar& s) {
  std::string text;
  append_scalar(text, s);
  switch (s.type) {
    case Scalar::Type::kString:
      return text + " (a string)";
    case Scalar::Type::kBool:
      return text + " (a boolean)";
    case Scalar::Type::kFloat:
      return text + " (not an integer)";
    case Scalar::Type::kUnsigned:
      return text + " (out of range)";
    default:
      return text;
  }
}

std::string* fingerprint_string(Fingerprint& fp, std::string_view name) {
  if (name == "backend") return &fp.backend;
  if (name == "device") return &fp.device;
  if (name == "compute_capability") return &fp.compute_capability;
  if (name == "mxq_version") return &fp.mxq_version;
  if (name == "registry_hash") return &fp.registry_hash;
  return nullptr;
}

int* fingerprint_int(Fingerprint& fp, std::string_view name) {
  if (name == "cpu_threads") return &fp.cpu_threads;
  if (name == "sm_count") return &fp.sm_count;
  if (name == "driver_version") return &fp.driver_version;
  if (name == "runtime_version") return &fp.runtime_version;
  return nullptr;
}

bool known_entry_member(std::string_view name) {
  for (const std::string_view known : {"op", "shape", "dtypes", "bucket", "tactic", "median_us",
                                       "default_us", "pass", "tuned_at", "ranks", "candidates"}) {
    if (name == known) return true;
  }
  return false;
}

std::string complete_entry(EntryState& s) {
  for (const auto& [present, field] : {std::pair{s.have_op, "op"},
                                       {s.have_shape, "shape"},
                                       {s.have_dtypes, "dtypes"},
                                       {s.have_bucket, "bucket"},
                                       {s.have_tactic, "tactic"}}) {
    if (!present) return std::string("missing \"") + field + "\"";
  }
  if (s.e.bucket < 1) return "bucket " + std::to_string(s.e.bucket) + " < 1";
  try {
    s.e.problem = Problem(std::move(s.op), std::move(s.dims), std::move(s.dtypes));
  } catch (const Error& error) {
    return std::string("problem: ") + error.what();
  }
  return {};
}

}  // namespace mxq::tune::detail
