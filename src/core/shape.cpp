#include "mxq/core/shape.h"

#include <sstream>

#include "mxq/core/error.h"

namespace mxq {

Shape::Shape(std::initializer_list<std::int64_t> dims)
    : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const std::int64_t> dims) {
  for (const std::int64_t extent : dims) push_back(extent);
}

void Shape::push_back(std::int64_t extent) {
  MXQ_CHECK(rank_ < kMaxDims, ErrorCode::kOutOfRange, "shape: at most ", kMaxDims,
            " dimensions are supported");
  MXQ_CHECK(extent >= 0, ErrorCode::kInvalidArgument, "shape: extents must be >= 0, found ",
            extent);
  dims_[static_cast<std::size_t>(rank_++)] = extent;
}

std::int64_t Shape::dim(int i) const {
  const int index = i < 0 ? rank_ + i : i;
  MXQ_CHECK(index >= 0 && index < rank_, ErrorCode::kOutOfRange, "dimension ", i,
            " out of range for a shape of rank ", rank_);
  return dims_[static_cast<std::size_t>(index)];
}

std::int64_t Shape::numel() const {
  std::int64_t total = 1;
  for (const std::int64_t extent : dims()) {
    // A wrapped count would size allocations and loops too small: a heap overflow later.
    if (__builtin_mul_overflow(total, extent, &total)) {
      fail(ErrorCode::kOutOfRange, "shape ", *this, ": its element count overflows 64 bits");
    }
  }
  return total;
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.rank_ != b.rank_) return false;
  for (int i = 0; i < a.rank_; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::ostringstream out;
  out << '[';
  for (int i = 0; i < rank_; ++i) out << (i ? ", " : "") << (*this)[i];
  out << ']';
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Shape& shape) { return out << shape.str(); }

Shape contiguous_strides(const Shape& shape) {
  Shape strides = shape;
  std::int64_t step = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = step;
    step *= shape[i];
  }
  return strides;
}

}  // namespace mxq
