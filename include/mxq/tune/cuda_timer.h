// GPU timing for the autotuner (only in builds with CUDA, MXQ_WITH_CUDA=1): CUDA events around
// the timed calls, and rotating input buffers whose total size exceeds the L2 cache so that
// every timed call reads its inputs from HBM, as it does when serving.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "mxq/tune/timer.h"

namespace mxq::tune {

// Records an event before and after the body on `stream` (a cudaStream_t; null = the legacy
// default stream) and waits for the second. The body must enqueue its work on that stream.
class CudaEventTimer final : public Timer {
 public:
  explicit CudaEventTimer(void* stream = nullptr);
  ~CudaEventTimer() override;
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;
  [[nodiscard]] std::string_view name() const override { return "cuda_events"; }
  double seconds(const std::function<void()>& body) override;

 private:
  void* stream_;
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

// L2 size of the current CUDA device in bytes.
std::size_t current_device_l2_bytes();

// `sets()` device copies of one input set of `bytes_per_set` bytes, enough that cycling through
// them touches more than `l2_factor` times the L2 size (at least `min_sets`). One allocation;
// every set starts on a 256-byte boundary.
class RotatingBuffers {
 public:
  RotatingBuffers(std::size_t bytes_per_set, double l2_factor = 2.0, int min_sets = 2);
  ~RotatingBuffers();
  RotatingBuffers(const RotatingBuffers&) = delete;
  RotatingBuffers& operator=(const RotatingBuffers&) = delete;

  // Copies `bytes_per_set` host bytes into every set.
  void fill_from_host(const void* host);
  [[nodiscard]] int sets() const { return static_cast<int>(sets_.size()); }
  [[nodiscard]] std::size_t bytes_per_set() const { return bytes_per_set_; }
  [[nodiscard]] std::size_t total_bytes() const { return bytes_per_set_ * sets_.size(); }
  [[nodiscard]] void* set(int index) const { return sets_[static_cast<std::size_t>(index)]; }
  [[nodiscard]] void* current() const { return sets_[current_]; }
  void next() { current_ = (current_ + 1) % sets_.size(); }

 private:
  std::size_t bytes_per_set_;
  void* base_ = nullptr;
  std::vector<void*> sets_;
  std::size_t current_ = 0;
};

}  // namespace mxq::tune
