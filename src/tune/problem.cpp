#include "mxq/tune/problem.h"

#include <algorithm>

#include "mxq/core/error.h"
#include "tune/hash.h"

namespace mxq::tune {
namespace {

bool is_field_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_op_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

void check_name(std::string_view what, std::string_view name, bool (*allowed)(char)) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), allowed)) {
    fail_argument(ErrorCode::kInvalidArgument, what, "a non-empty identifier",
                  "'" + std::string(name) + "'");
  }
}

template <typename Field>
void sort_and_check_unique(std::vector<Field>& fields, const std::string& op, const char* kind) {
  std::sort(fields.begin(), fields.end(),
            [](const Field& a, const Field& b) { return a.name < b.name; });
  for (std::size_t i = 0; i < fields.size(); ++i) {
    check_name(std::string("problem ") + op + " " + kind + " name", fields[i].name, is_field_char);
    if (i > 0 && fields[i].name == fields[i - 1].name) {
      fail(ErrorCode::kInvalidArgument, "problem ", op, ": ", kind, " '", fields[i].name,
           "' given twice");
    }
  }
}

}  // namespace

Problem::Problem(std::string op, std::vector<ShapeDim> dims, std::vector<DtypeField> dtypes)
    : op_(std::move(op)), dims_(std::move(dims)), dtypes_(std::move(dtypes)) {
  check_name("problem op", op_, is_op_char);
  sort_and_check_unique(dims_, op_, "shape field");
  sort_and_check_unique(dtypes_, op_, "dtype field");
  for (const DtypeField& field : dtypes_) {
    check_name("problem " + op_ + " dtype of " + field.name, field.dtype, is_op_char);
  }
  canonical_ = op_ + "[";
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i > 0) canonical_ += ",";
    canonical_ += dims_[i].name + "=" + std::to_string(dims_[i].value);
  }
  canonical_ += "|";
  for (std::size_t i = 0; i < dtypes_.size(); ++i) {
    if (i > 0) canonical_ += ",";
    canonical_ += dtypes_[i].name + "=" + dtypes_[i].dtype;
  }
  canonical_ += "]";
  hash_ = detail::fnv1a(canonical_);
  op_hash_ = detail::fnv1a(op_);
}

std::optional<std::int64_t> Problem::find_dim(std::string_view name) const {
  for (const ShapeDim& d : dims_) {
    if (d.name == name) return d.value;
  }
  return std::nullopt;
}

std::int64_t Problem::dim(std::string_view name) const {
  if (auto value = find_dim(name)) return *value;
  fail(ErrorCode::kInvalidArgument, "problem ", canonical_, " has no shape field '", name, "'");
}

const std::string& Problem::dtype(std::string_view name) const {
  for (const DtypeField& d : dtypes_) {
    if (d.name == name) return d.dtype;
  }
  fail(ErrorCode::kInvalidArgument, "problem ", canonical_, " has no dtype field '", name, "'");
}

std::uint64_t stable_hash(std::string_view text) { return detail::fnv1a(text); }
std::string hex64(std::uint64_t value) { return detail::hex64(value); }

std::vector<std::int64_t> power_of_two_buckets(std::int64_t max_tokens) {
  if (max_tokens < 1 || max_tokens > (std::int64_t{1} << 40)) {
    fail_argument(ErrorCode::kInvalidArgument, "max_tokens", "1 .. 2^40", max_tokens);
  }
  std::vector<std::int64_t> buckets;
  for (std::int64_t b = 1;; b *= 2) {
    buckets.push_back(b);
    if (b >= max_tokens) break;
  }
  return buckets;
}

std::size_t bucket_index(std::span<const std::int64_t> buckets, std::int64_t tokens) noexcept {
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), tokens);
  if (it == buckets.end()) return buckets.empty() ? 0 : buckets.size() - 1;
  return static_cast<std::size_t>(it - buckets.begin());
}

void check_buckets(std::span<const std::int64_t> buckets, std::string_view what) {
  if (buckets.empty()) {
    fail_argument(ErrorCode::kInvalidArgument, what, "at least one token bucket", "none");
  }
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] < 1 || (i > 0 && buckets[i] <= buckets[i - 1])) {
      fail_argument(ErrorCode::kInvalidArgument, what, "positive, strictly ascending token buckets",
                    "bucket " + std::to_string(buckets[i]) + " at position " + std::to_string(i));
    }
  }
}

}  // namespace mxq::tune
