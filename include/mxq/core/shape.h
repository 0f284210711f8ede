// Shape: a small fixed-capacity list of extents (no allocation), printable as [a, b, c].
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <string>

namespace mxq {

class Shape {
 public:
  static constexpr int kMaxDims = 8;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::span<const std::int64_t> dims);

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  // Dimension counted from the end when negative (-1 is the last).
  [[nodiscard]] std::int64_t dim(int i) const;
  [[nodiscard]] std::int64_t numel() const;
  [[nodiscard]] std::span<const std::int64_t> dims() const {
    return {dims_.data(), static_cast<std::size_t>(rank_)};
  }
  void push_back(std::int64_t extent);

  friend bool operator==(const Shape& a, const Shape& b);
  [[nodiscard]] std::string str() const;

 private:
  std::array<std::int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

std::ostream& operator<<(std::ostream& out, const Shape& shape);

// Row-major (C order) strides in elements.
Shape contiguous_strides(const Shape& shape);

}  // namespace mxq
