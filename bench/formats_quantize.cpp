// Times the CPU quantizers and dequantizers of the formats module on a 2880x2880 f32 matrix:
// median wall time and process CPU time of 15 calls each. Not part of the CMake build; after
// `cmake --build build`, from the repository root (one command):
//   g++ -std=c++20 -O3 -DNDEBUG -DMXQ_WITH_CUDA=1 -Iinclude bench/formats_quantize.cpp
//       build/libmxq.a -L/usr/local/cuda/lib64 -lcudart -pthread -o build/formats_quantize
// (drop -DMXQ_WITH_CUDA=1 and the CUDA flags for a build without CUDA). Results: docs/PERF.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <random>
#include <vector>

#include "mxq/formats/fp8_block.h"
#include "mxq/formats/mxfp4.h"

namespace {

double cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + 1e-6 * static_cast<double>(t.tv_nsec);
}

void time(const char* what, const std::function<void()>& f) {
  constexpr int kRuns = 15;
  std::vector<double> wall;
  std::vector<double> cpu;
  for (int i = 0; i < kRuns; ++i) {
    const double cpu_start = cpu_ms();
    const auto start = std::chrono::steady_clock::now();
    f();
    const auto end = std::chrono::steady_clock::now();
    cpu.push_back(cpu_ms() - cpu_start);
    wall.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  std::printf("%-40s median wall %7.2f ms, cpu %7.2f ms\n", what, wall[kRuns / 2], cpu[kRuns / 2]);
}

}  // namespace

int main() {
  using namespace mxq;
  const Tensor x = Tensor::empty(DType::kF32, {2880, 2880});
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = normal(rng);

  Mxfp4Tensor q;
  time("quantize_mxfp4 floor", [&] { q = quantize_mxfp4(x, ScaleRule::kFloor); });
  time("quantize_mxfp4 ceil", [&] { q = quantize_mxfp4(x, ScaleRule::kCeil); });
  time("dequantize_mxfp4", [&] { (void)dequantize_mxfp4(q.blocks, q.scales); });
  Fp8BlockTensor f;
  time("quantize_fp8_block 128x128 fp32", [&] { f = quantize_fp8_block(x, {128, 128}); });
  time("quantize_fp8_block 128x128 ue8m0", [&] {
    f = quantize_fp8_block(x, {128, 128}, ScaleMode::kUe8m0);
  });
  time("quantize_fp8_groups 1x128", [&] { f = quantize_fp8_groups(x, 128, ScaleMode::kFp32); });
  time("dequantize_fp8_block", [&] { (void)dequantize_fp8_block(f.q, f.scale, f.block); });
}
