#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/tune/cuda_timer.h"

namespace mxq::tune {

CudaEventTimer::CudaEventTimer(void* stream) : stream_(stream) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  MXQ_CUDA_CHECK(cudaEventCreate(&start));
  MXQ_CUDA_CHECK(cudaEventCreate(&stop));
  start_ = start;
  stop_ = stop;
}

CudaEventTimer::~CudaEventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

double CudaEventTimer::seconds(const std::function<void()>& body) {
  auto* stream = static_cast<cudaStream_t>(stream_);
  MXQ_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_), stream));
  body();
  MXQ_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_), stream));
  MXQ_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0;
  MXQ_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)));
  return static_cast<double>(ms) * 1e-3;
}

std::unique_ptr<Timer> make_cuda_event_timer() { return std::make_unique<CudaEventTimer>(); }

std::size_t current_device_l2_bytes() {
  int device = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  int bytes = 0;
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
  return static_cast<std::size_t>(bytes);
}

RotatingBuffers::RotatingBuffers(std::size_t bytes_per_set, double l2_factor, int min_sets)
    : bytes_per_set_(bytes_per_set) {
  if (bytes_per_set == 0) {
    fail_argument(ErrorCode::kInvalidArgument, "bytes_per_set", "> 0", bytes_per_set);
  }
  const double wanted = l2_factor * static_cast<double>(current_device_l2_bytes());
  const auto count = std::max<std::size_t>(
      static_cast<std::size_t>(std::max(min_sets, 1)),
      static_cast<std::size_t>(std::floor(wanted / static_cast<double>(bytes_per_set))) + 1);
  const std::size_t stride = (bytes_per_set + 255) / 256 * 256;
  MXQ_CUDA_CHECK(cudaMalloc(&base_, stride * count));
  for (std::size_t i = 0; i < count; ++i) sets_.push_back(static_cast<char*>(base_) + i * stride);
}

RotatingBuffers::~RotatingBuffers() { cudaFree(base_); }

void RotatingBuffers::fill_from_host(const void* host) {
  for (void* p : sets_) MXQ_CUDA_CHECK(cudaMemcpy(p, host, bytes_per_set_, cudaMemcpyHostToDevice));
}

}  // namespace mxq::tune
