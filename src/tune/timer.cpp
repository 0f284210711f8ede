#include "mxq/tune/timer.h"

#include <chrono>

#include "mxq/core/error.h"

namespace mxq::tune {

#if MXQ_WITH_CUDA
std::unique_ptr<Timer> make_cuda_event_timer();  // src/tune/cuda/cuda_timer.cu
#endif

double SteadyClockTimer::seconds(const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(stop - start).count();
}

std::unique_ptr<Timer> make_timer(Backend backend) {
  if (backend == Backend::kCpu) return std::make_unique<SteadyClockTimer>();
#if MXQ_WITH_CUDA
  return make_cuda_event_timer();
#else
  fail(ErrorCode::kUnsupported, "CUDA timing asked for, but mxq was built without CUDA");
#endif
}

}  // namespace mxq::tune
