// Times the CPU tactics of the block-FP8 linear op (the fp64 reference and the blocked fp32
// tactics) on DeepSeek-V3 decode shapes: median wall time of 5 calls each on pre-quantized
// activations. Not part of the CMake build; after `cmake --build build`, from the repository
// root (one command):
//   g++ -std=c++20 -O3 -DNDEBUG -DMXQ_WITH_CUDA=1 -Iinclude bench/linear_cpu.cpp
//       build/libmxq.a -L/usr/local/cuda/lib64 -lcudart -pthread -o build/linear_cpu
// (drop -DMXQ_WITH_CUDA=1 and the CUDA flags for a build without CUDA). Results: docs/PERF.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "mxq/formats/bf16.h"
#include "mxq/linear/linear.h"

namespace {

mxq::Tensor random_f32(std::int64_t rows, std::int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  mxq::Tensor t = mxq::Tensor::empty(mxq::DType::kF32, {rows, cols});
  for (std::int64_t i = 0; i < rows * cols; ++i) t.data_as<float>()[i] = normal(rng);
  return t;
}

}  // namespace

int main() {
  using mxq::linear::LinearOptions;
  struct Shape {
    int m, n, k;
  };
  for (const Shape s : {Shape{1, 2112, 7168}, Shape{16, 2112, 7168}, Shape{16, 7168, 2048}}) {
    const mxq::linear::BlockFp8Weight w =
        mxq::linear::quantize_weight(random_f32(s.n, s.k, 1), {128, 128});
    const mxq::Fp8BlockTensor x = mxq::quantize_fp8_groups(random_f32(s.m, s.k, 2), 128);
    for (const char* tactic : {"cpu.reference", "cpu.blocked_f32.n64", "cpu.blocked_f32.n16"}) {
      LinearOptions options;
      options.tactic = tactic;
      std::vector<double> ms;
      for (int run = 0; run < 5; ++run) {
        const auto start = std::chrono::steady_clock::now();
        (void)mxq::linear::linear(x, w, nullptr, options);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                               start)
                         .count());
      }
      std::sort(ms.begin(), ms.end());
      const double gflops = 2.0 * s.m * s.n * static_cast<double>(s.k) / (ms[2] * 1e-3) / 1e9;
      std::printf("M=%-3d N=%-5d K=%-5d %-22s %9.1f ms %7.2f GFLOP/s\n", s.m, s.n, s.k, tactic,
                  ms[2], gflops);
    }
  }
  return 0;
}
