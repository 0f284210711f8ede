// main() for multi-GPU test executables (label multigpu): exits with 77 (ctest: skipped) when
// fewer than two GPUs are visible, saying how many, so such a machine never reports them passed.
// A child process a test starts (MXQTEST_CHILD set) runs whatever GPUs it was given.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (std::getenv("MXQTEST_CHILD") == nullptr && (status != cudaSuccess || count < 2)) {
    std::printf("SKIPPED: needs two GPUs, %d visible (%s)\n", status == cudaSuccess ? count : 0,
                status == cudaSuccess ? "cudaGetDeviceCount" : cudaGetErrorName(status));
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
