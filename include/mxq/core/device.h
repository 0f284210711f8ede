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

namespace detail {
// Makes `device` the current CUDA device for a scope and gives the caller back its own current
// device on every exit, exceptions included: a library call must not move the caller's later
// launches and allocations to another GPU. Nothing for the CPU; a CUDA device in a build without
// CUDA is an mxq::Error(kUnsupported). The one device guard of mxq (src/core/device_scope.cpp).
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;  // the device to give back; -1 when nothing was changed
};
}  // namespace detail

}  // namespace mxq
