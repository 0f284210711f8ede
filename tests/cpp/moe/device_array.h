// A typed device allocation for the MoE GPU tests: freed when it goes out of scope (also when an
// ASSERT returns early), with whole-array upload and download.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "mxq/core/cuda_check.h"

namespace mxq::testing {

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) { MXQ_CUDA_CHECK(cudaMalloc(&data_, n * sizeof(T))); }
  // A copy of `host` (its size).
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() {  // a destructor cannot throw: report a failed cudaFree as a test failure
    const cudaError_t status = cudaFree(data_);
    if (status != cudaSuccess) ADD_FAILURE() << "cudaFree failed: " << cudaGetErrorString(status);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return data_; }
  void upload(const std::vector<T>& host) {
    MXQ_CUDA_CHECK(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    MXQ_CUDA_CHECK(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t n_;
};

}  // namespace mxq::testing
