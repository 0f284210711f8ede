// The key of a tuning decision: an op's static problem (shape fields and dtypes, never the token
// count) plus a token bucket. A Problem is built once (e.g. when a layer is constructed) and then
// looked up many times; its canonical text and hash are computed at construction so that lookup
// does no allocation.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mxq::tune {

// One named integer of the static shape, e.g. {"N", 7168} or {"block_n", 128}.
struct ShapeDim {
  std::string name;
  std::int64_t value = 0;
  friend bool operator==(const ShapeDim&, const ShapeDim&) = default;
};

// One named dtype, e.g. {"weight", "e4m3"}.
struct DtypeField {
  std::string name;
  std::string dtype;
  friend bool operator==(const DtypeField&, const DtypeField&) = default;
};

class Problem {
 public:
  Problem() = default;
  // Fields are sorted by name; names must be unique identifiers ([A-Za-z0-9_]), the op name
  // lower-case ([a-z0-9_.-]). Throws mxq::Error naming the offending field otherwise.
  Problem(std::string op, std::vector<ShapeDim> dims, std::vector<DtypeField> dtypes = {});

  [[nodiscard]] const std::string& op() const { return op_; }
  [[nodiscard]] std::span<const ShapeDim> dims() const { return dims_; }
  [[nodiscard]] std::span<const DtypeField> dtypes() const { return dtypes_; }
  [[nodiscard]] std::optional<std::int64_t> find_dim(std::string_view name) const;
  // Throws when the problem has no such field (names the op and the field).
  [[nodiscard]] std::int64_t dim(std::string_view name) const;
  [[nodiscard]] const std::string& dtype(std::string_view name) const;

  // "toy_gemm[K=512,N=256|a=f32,w=f32]": the identity of the problem, in files and logs.
  [[nodiscard]] const std::string& canonical() const { return canonical_; }
  [[nodiscard]] std::uint64_t hash() const { return hash_; }        // of canonical()
  [[nodiscard]] std::uint64_t op_hash() const { return op_hash_; }  // of op()
  [[nodiscard]] bool empty() const { return op_.empty(); }

  friend bool operator==(const Problem& a, const Problem& b) {
    return a.canonical_ == b.canonical_;
  }

 private:
  std::string op_;
  std::vector<ShapeDim> dims_;
  std::vector<DtypeField> dtypes_;
  std::string canonical_;
  std::uint64_t hash_ = 0;
  std::uint64_t op_hash_ = 0;
};

// FNV-1a 64 of text: the stable hash used for problems, ops, the registry and digests.
std::uint64_t stable_hash(std::string_view text);
std::string hex64(std::uint64_t value);

// ---- token buckets -----------------------------------------------------------------------
// Each op declares its buckets (ascending, positive, unique). A token count is served by the
// smallest bucket >= it (rounding up, like the kernels' own tiling), or by the last bucket when
// it is larger than all of them. A bucket B is tuned at exactly B tokens and serves the token
// counts (previous bucket, B].

// 1, 2, 4, ..., up to the first power of two >= max_tokens.
std::vector<std::int64_t> power_of_two_buckets(std::int64_t max_tokens);
// Index into `buckets` of the bucket serving `tokens` (tokens < 1 map to the first bucket).
std::size_t bucket_index(std::span<const std::int64_t> buckets, std::int64_t tokens) noexcept;
// Throws mxq::Error unless `buckets` is non-empty, positive, strictly ascending.
void check_buckets(std::span<const std::int64_t> buckets, std::string_view what);

}  // namespace mxq::tune
