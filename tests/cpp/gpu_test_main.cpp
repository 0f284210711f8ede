// main() for GPU test executables: exits with 77 (ctest: skipped) when no GPU is visible, so a
// machine without a GPU reports these tests as skipped, never as passed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no GPU visible (%s)\n",
                status == cudaSuccess ? "0 devices" : cudaGetErrorName(status));
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
