// How the autotuner measures one call: wall clock on the CPU, CUDA events on the GPU (see
// cuda_timer.h). Tests substitute their own Timer (e.g. a virtual clock with injected noise).
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include "mxq/tune/tactic.h"

namespace mxq::tune {

class Timer {
 public:
  virtual ~Timer() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  // Seconds taken by one call of `body` (which may run the op several times; the caller
  // divides). For asynchronous backends this includes waiting for the work to finish.
  virtual double seconds(const std::function<void()>& body) = 0;
};

// std::chrono::steady_clock around the call.
class SteadyClockTimer final : public Timer {
 public:
  [[nodiscard]] std::string_view name() const override { return "steady_clock"; }
  double seconds(const std::function<void()>& body) override;
};

// The backend's timer: steady_clock for the CPU, CUDA events on the current device's default
// stream for CUDA (throws kUnsupported in a build without CUDA).
std::unique_ptr<Timer> make_timer(Backend backend);

}  // namespace mxq::tune
