// The autotuner's GPU timing: CUDA events measure kernel time, rotating buffers larger than L2
// make timed reads cold (slower than re-reading one L2-resident buffer), and a CUDA op tunes end
// to end under a "cuda" fingerprint.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <vector>

#include "mxq/core/cuda_check.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/cuda_timer.h"

namespace mxq::tune {
namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void sum_kernel(const float4* in, std::size_t n, float* out) {
  float acc = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float4 v = in[i];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.0f) *out = acc;  // keeps the loads alive
}

__global__ void scale_kernel(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i];
}

TEST(CudaTimer, EventsMeasureKernelTime) {
  int device = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  int clock_khz = 0;
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  CudaEventTimer timer;
  const long long cycles = static_cast<long long>(clock_khz) * 2;  // ~2 ms at the base clock
  spin_kernel<<<1, 1>>>(cycles);                                   // warm-up
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  const double seconds = timer.seconds([&] { spin_kernel<<<1, 1>>>(cycles); });
  // The SM clock may boost above the reported rate: between 0.5 ms and 2.5 ms.
  EXPECT_GT(seconds, 0.5e-3);
  EXPECT_LT(seconds, 2.5e-3);
}

TEST(CudaTimer, RotatingBuffersExceedL2AndMakeReadsCold) {
  const std::size_t l2 = current_device_l2_bytes();
  ASSERT_GT(l2, 0U);
  const std::size_t bytes = l2 / 4;
  RotatingBuffers buffers(bytes);
  EXPECT_GE(buffers.sets(), 9);
  EXPECT_GT(buffers.total_bytes(), 2 * l2);
  std::vector<float> host(bytes / sizeof(float), 1.0f);
  buffers.fill_from_host(host.data());
  float* out = nullptr;
  MXQ_CUDA_CHECK(cudaMalloc(&out, sizeof(float)));
  CudaEventTimer timer;
  const std::size_t n = bytes / sizeof(float4);
  auto read = [&](void* p) { sum_kernel<<<1024, 256>>>(static_cast<const float4*>(p), n, out); };
  std::vector<double> warm;
  std::vector<double> cold;
  for (int i = 0; i < 40; ++i) {
    read(buffers.set(0));  // brings set 0 into L2
    warm.push_back(timer.seconds([&] { read(buffers.set(0)); }));
    buffers.next();
    if (buffers.current() == buffers.set(0)) buffers.next();
    cold.push_back(timer.seconds([&] { read(buffers.current()); }));
  }
  MXQ_CUDA_CHECK(cudaFree(out));
  std::sort(warm.begin(), warm.end());
  std::sort(cold.begin(), cold.end());
  const double warm_median = warm[warm.size() / 2];
  const double cold_median = cold[cold.size() / 2];
  RecordProperty("warm_us", std::to_string(warm_median * 1e6));
  RecordProperty("cold_us", std::to_string(cold_median * 1e6));
  EXPECT_GT(cold_median, 1.2 * warm_median)
      << "cold " << cold_median * 1e6 << " us vs warm " << warm_median * 1e6 << " us";
}

// A CUDA op with two launch configurations, tuned on the GPU.
struct ScaleArgs {
  const float* in;
  float* out;
  int n;
};

class ScaleWorkload final : public Workload {
 public:
  explicit ScaleWorkload(std::int64_t tokens)
      : n_(static_cast<int>(tokens * 4096)), inputs_(static_cast<std::size_t>(n_) * sizeof(float)) {
    std::vector<float> host(static_cast<std::size_t>(n_));
    for (int i = 0; i < n_; ++i) host[static_cast<std::size_t>(i)] = static_cast<float>(i % 97);
    inputs_.fill_from_host(host.data());
    expected_.resize(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) expected_[i] = 2.0f * host[i];
    MXQ_CUDA_CHECK(cudaMalloc(&out_, static_cast<std::size_t>(n_) * sizeof(float)));
  }
  ~ScaleWorkload() override { cudaFree(out_); }
  void run(const Tactic& tactic) override {
    tactic.run(ScaleArgs{static_cast<const float*>(inputs_.current()), out_, n_});
  }
  void rotate() override { inputs_.next(); }
  CheckResult check(const Tactic& tactic) override {
    MXQ_CUDA_CHECK(cudaMemset(out_, 0xFF, static_cast<std::size_t>(n_) * sizeof(float)));
    run(tactic);
    std::vector<float> got(static_cast<std::size_t>(n_));
    MXQ_CUDA_CHECK(
        cudaMemcpy(got.data(), out_, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return got == expected_ ? CheckResult{true, 0, ""} : CheckResult{false, 1, "wrong output"};
  }

 private:
  int n_;
  RotatingBuffers inputs_;
  float* out_ = nullptr;
  std::vector<float> expected_;
};

TEST(CudaTimer, ACudaOpTunesUnderACudaFingerprint) {
  TacticRegistry registry;
  OpSpec op;
  op.name = "gpu_scale";
  op.backend = Backend::kCuda;
  op.buckets = {1, 16, 256};
  op.default_tactic = "scale[threads=32]";
  op.make_workload = [](const Problem&, std::int64_t tokens) {
    return std::make_unique<ScaleWorkload>(tokens);
  };
  registry.add_op(op);
  for (int threads : {32, 256}) {
    Tactic t;
    t.op = "gpu_scale";
    t.backend = Backend::kCuda;
    t.variant = "scale";
    t.params.set("threads", threads);
    t.run = TacticRunner::of<ScaleArgs>([threads](const ScaleArgs& a) {
      scale_kernel<<<(a.n + threads - 1) / threads, threads>>>(a.in, a.out, a.n);
    });
    registry.add_tactic(std::move(t));
  }
  registry.freeze();

  const std::string path = (std::filesystem::temp_directory_path() /
                            ("mxq-gpu-tune-" + std::to_string(::getpid()) + ".json"))
                               .string();
  AutotunerConfig config;
  config.registry = &registry;
  config.backend = Backend::kCuda;
  config.options.mode = AutotuneMode::kTune;
  config.options.cache_path = path;
  Autotuner tuner(config);
  EXPECT_EQ(tuner.fingerprint().backend, "cuda");
  EXPECT_GT(tuner.fingerprint().sm_count, 0);
  EXPECT_GT(tuner.fingerprint().driver_version, 0);
  const Problem problem("gpu_scale", {{"N", 4096}}, {{"x", "f32"}});
  {
    TuningSession session(tuner, "target");
    for (std::int64_t b : {1, 16, 256}) {
      const TuneRecord r = session.tune(problem, b);
      EXPECT_EQ(r.status, TuneStatus::kTuned) << r.reason;
      EXPECT_GT(r.default_us, 0);
    }
  }
  const ReadResult read = read_cache_file(path);
  ASSERT_EQ(read.status, ReadStatus::kOk);
  EXPECT_EQ(read.file.entries.size(), 3U);
  for (const CacheEntry& e : read.file.entries) {
    EXPECT_EQ(tuner.lookup(problem, e.bucket).tactic->id(), e.tactic);
    EXPECT_EQ(e.candidates.size(), 2U) << "both tactics were timed";
  }
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".lock");
}

}  // namespace
}  // namespace mxq::tune
