// Where memory lives: the host or one CUDA device.
#pragma once

#include <ostream>

namespace mxq {

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;

  static constexpr Device cpu() { return {Kind::kCpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {Kind::kCuda, index}; }
  [[nodiscard]] bool is_cpu() const { return kind == Kind::kCpu; }
  [[nodiscard]] bool is_cuda() const { return kind == Kind::kCuda; }
  friend bool operator==(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& out, const Device& device);

}  // namespace mxq
