// The CUDA tactics under the autotuner on a real GPU: tuning block_fp8_linear and
// moe_gpu_forward for one small problem each times every supported candidate after it passed its
// check against the CPU reference; linear() and MoeGpuLayer then run the tactic the cache holds
// (the tuned winner, and a hand-written entry naming a non-default tactic), correctly, also under
// CUDA graph capture; counts the cache does not hold keep the default.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <any>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "linear/linear_test_support.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/prng.h"
#include "mxq/formats/bf16.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"
#include "mxq/linear/tune.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/compare.h"
#include "mxq/moe/gpu_layer.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/cache_file.h"
#include "mxq/tune/fingerprint.h"
#include "mxq/tune/registry.h"

namespace mxq::tune {
namespace {

namespace fs = std::filesystem;
using linear::block_fp8_linear_problem;
using linear::kBlockFp8LinearOp;

constexpr double kMaxNormalizedError = 4e-3;

class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_((fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".json"))
                  .string()) {
    fs::remove(path_);
  }
  ~TempFile() {
    std::error_code ignored;
    fs::remove(path_, ignored);
    fs::remove(path_ + ".lock", ignored);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

MeasureSettings quick_measure() {
  MeasureSettings m;
  m.warmup_runs = 1;
  m.rounds = 3;
  m.min_sample_seconds = 2e-5;
  m.max_calls_per_sample = 20;
  return m;
}

std::unique_ptr<Autotuner> cuda_tuner(const std::string& path, AutotuneMode mode) {
  AutotunerConfig config;
  config.options.mode = mode;
  config.options.cache_path = path;
  config.options.measure = quick_measure();
  config.backend = Backend::kCuda;
  return std::make_unique<Autotuner>(config);
}

// Every candidate was either timed (it passed its check first) or is not supported; at least two
// were timed, so there was a real choice.
void expect_every_candidate_checked_and_timed(const TuneRecord& record) {
  int timed = 0;
  for (const CandidateResult& c : record.candidates) {
    if (c.status == "timed") {
      ++timed;
      EXPECT_GT(c.median_us, 0.0) << c.tactic;
    } else {
      EXPECT_TRUE(c.status.starts_with("unsupported"))
          << c.tactic << ": " << c.status << " (problem " << record.problem << ")";
    }
  }
  EXPECT_GE(timed, 2) << record.problem;
}

// A hand-written cache holding `tactic` for (problem, bucket), fingerprinted for GPU 0.
void write_entry(const std::string& path, const Problem& problem, std::int64_t bucket,
                 const std::string& tactic) {
  CacheEntry e;
  e.problem = problem;
  e.bucket = bucket;
  e.tactic = tactic;
  e.pass = "hand-written";
  e.tuned_at = "2026-01-01T00:00:00Z";
  CacheStore store(path, cuda_fingerprint(0, builtin_tactics()));
  ASSERT_TRUE(store.save(std::vector<CacheEntry>{e}).ok);
}

// ---- block_fp8_linear ----------------------------------------------------------------------

constexpr std::int64_t kN = 512;
constexpr std::int64_t kK = 1024;

const linear::LinearTactic* native_of(const Tactic& tactic) {
  const auto* native = std::any_cast<const linear::LinearTactic*>(&tactic.native);
  return native == nullptr ? nullptr : *native;
}

// Runs linear() on the GPU with `tuner`; checks the output against the CPU reference and returns
// what ran.
linear::LinearRun run_linear(const Autotuner& tuner, std::int64_t m) {
  const linear::BlockFp8Weight w_host =
      linear::quantize_weight(linear::testing::random_f32(kN, kK, 11), {128, 128});
  const Tensor x_host = linear::testing::random_bf16(m, kK, 12);
  const linear::BlockFp8Weight w = w_host.to(Device::cuda(0));
  const Tensor x = x_host.to(Device::cuda(0));
  linear::LinearRun ran;
  linear::LinearOptions options;
  options.tuner = &tuner;
  options.ran = &ran;
  const Tensor y = linear::linear(x, w, nullptr, options);
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor reference = linear::linear_reference(quantize_fp8_groups(x_host, 128), w_host);
  const linear::testing::Comparison c = linear::testing::compare(y, reference);
  EXPECT_EQ(c.nan_mismatches, 0);
  EXPECT_LE(c.normalized_error, kMaxNormalizedError);
  return ran;
}

TEST(CudaTactics, BlockFp8LinearTunesEveryCandidateAndLinearRunsTheWinner) {
  const TempFile file("mxq-cuda-linear-tune");
  const Problem problem = block_fp8_linear_problem(kN, kK, {128, 128});
  const std::unique_ptr<Autotuner> tuner = cuda_tuner(file.path(), AutotuneMode::kTune);
  TuneRecord record;
  {
    TuningSession session(*tuner, "target");
    record = session.tune(problem, 16);
  }
  ASSERT_EQ(record.status, TuneStatus::kTuned) << record.reason;
  expect_every_candidate_checked_and_timed(record);

  const Selection selection = tuner->lookup(problem, 16);
  ASSERT_EQ(selection.source, SelectionSource::kTuned);
  ASSERT_EQ(selection.tactic->id(), record.tactic);
  const linear::LinearRun ran = run_linear(*tuner, 16);
  EXPECT_TRUE(ran.from_tuner);
  const linear::LinearTactic* cached = native_of(*selection.tactic);
  if (cached != nullptr) {
    EXPECT_EQ(ran.tactic, cached) << ran.tactic->name() << " ran, the cache holds "
                                  << record.tactic;
  } else {  // "auto" won: the dispatch rule's choice ran
    linear::LinearProblem p;
    linear::describe_device(p, Device::cuda(0));
    p.m = 16;
    p.n = kN;
    p.k = kK;
    EXPECT_EQ(ran.tactic, &linear::select_tactic(p, "auto"));
  }
  // M = 100 is served by bucket 128, which was not tuned: the dispatch rule, not the cache.
  const linear::LinearRun untuned = run_linear(*tuner, 100);
  EXPECT_FALSE(untuned.from_tuner);
}

TEST(CudaTactics, LinearRunsAHandWrittenNonDefaultTactic) {
  // The general mma.sync path with 64x128 tiles: never the dispatch rule's choice for 128x128
  // blocks on an H100/H200 (the wgmma fast path is preferred there).
  const linear::LinearTactic* wanted = linear::find_tactic("cuda.mma_sync.m64n128k64");
  ASSERT_NE(wanted, nullptr);
  const OpSpec* op = builtin_tactics().find_op(kBlockFp8LinearOp, Backend::kCuda);
  ASSERT_NE(op, nullptr);
  std::string id;
  for (const Tactic* t : builtin_tactics().tactics(*op)) {
    if (native_of(*t) == wanted) id = t->id();
  }
  ASSERT_FALSE(id.empty());
  const TempFile file("mxq-cuda-linear-entry");
  write_entry(file.path(), block_fp8_linear_problem(kN, kK, {128, 128}), 32, id);
  const std::unique_ptr<Autotuner> tuner = cuda_tuner(file.path(), AutotuneMode::kLoad);
  const linear::LinearRun ran = run_linear(*tuner, 20);  // bucket 32 serves (16, 32]
  EXPECT_EQ(ran.tactic, wanted) << ran.tactic->name();
  EXPECT_TRUE(ran.from_tuner);
}

// ---- moe_gpu_forward ------------------------------------------------------------------------

// E=8, H=I=256, top-2, gpt-oss activation and biases, padded to 128 (P = 256); W4A16 or W4A8.
moe::MoeLayer make_layer(moe::ActivationQuant quant = moe::ActivationQuant::kBf16) {
  moe::MoeConfig config;
  config.activation_quant = quant;
  config.hidden_size = 256;
  config.intermediate_size = 256;
  config.num_experts = 8;
  config.top_k = 2;
  config.router = moe::RouterKind::kTopkSoftmax;
  moe::MoeLayer layer = moe::MoeLayer::create(config, 0, {});
  layer.begin_update();
  Xoshiro256 rng(21);
  for (const moe::MoeTensorName& name :
       moe::required_tensor_names(config, 0, moe::CheckpointLayout::kGptOss)) {
    const moe::TensorSpec spec = moe::expected_tensor_spec(config, name.kind);
    Tensor t = Tensor::empty(spec.dtype, spec.shape);
    auto* bytes = static_cast<std::uint8_t*>(t.data());
    if (moe::is_scale(name.kind)) {
      for (std::size_t i = 0; i < t.nbytes(); ++i)
        bytes[i] = static_cast<std::uint8_t>(118 + rng.next() % 4);
    } else if (spec.dtype == DType::kBF16) {
      auto* h = static_cast<std::uint16_t*>(t.data());
      const float amplitude = moe::is_router(name.kind) ? 0.2F : 0.1F;
      for (std::int64_t i = 0; i < t.numel(); ++i)
        h[i] = float_to_bf16(amplitude * rng.uniform_symmetric());
    } else {
      for (std::size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<std::uint8_t>(rng.next());
    }
    layer.load(moe::format_tensor_name(name), t);
  }
  layer.end_update();
  (void)layer.prepare(128);
  return layer;
}

// The layer's forward of `tokens` tokens on the GPU (eagerly, then replayed from a captured CUDA
// graph, bit for bit), checked against the CPU reference.
void check_forward(const moe::MoeGpuLayer& gpu, const moe::MoeLayer& layer, std::int64_t tokens) {
  const Tensor x = moe::synthetic_tokens(tokens, 256, 31);
  const moe::MoeForwardResult ref = layer.forward(x);
  const Tensor out = gpu.forward_host(x);
  std::int64_t nan_mismatches = 0;
  EXPECT_LE(moe::normalized_error(out, ref.output, &nan_mismatches), kMaxNormalizedError);
  EXPECT_EQ(nan_mismatches, 0);

  Tensor xb = Tensor::empty(DType::kBF16, x.shape());
  for (std::int64_t i = 0; i < x.numel(); ++i)
    static_cast<std::uint16_t*>(xb.data())[i] = float_to_bf16(x.data_as<float>()[i]);
  const Tensor x_dev = xb.to(Device::cuda(0));
  const Tensor out_dev = Tensor::empty(DType::kBF16, x.shape(), Device::cuda(0));
  MXQ_CUDA_CHECK(cudaMemset(out_dev.data(), 0xFF, out_dev.nbytes()));
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  gpu.forward(x_dev, out_dev, stream);  // the tuner's lookup happens during capture
  MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  MXQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  MXQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
  const Tensor replayed = out_dev.to(Device::cpu());
  const auto* bits = static_cast<const std::uint16_t*>(replayed.data());
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    ASSERT_EQ(bf16_to_float(bits[i]), out.data_as<float>()[i]) << "element " << i;
  }
}

TEST(CudaTactics, MoeGpuForwardTunesBothVariantsAndTheLayerRunsTheWinner) {
  const moe::MoeLayer layer = make_layer();
  const TempFile file("mxq-cuda-moe-tune");
  const std::unique_ptr<Autotuner> tuner = cuda_tuner(file.path(), AutotuneMode::kTune);
  const moe::MoeGpuLayer gpu = moe::MoeGpuLayer::upload(
      layer, 64, Device::cuda(0), moe::gpu::GemmVariant::kDecodeMma, tuner.get());
  ASSERT_NE(gpu.tune_problem(0), nullptr);
  const Problem problem = *gpu.tune_problem(0);
  EXPECT_EQ(problem.dim("P"), 256);
  EXPECT_EQ(problem.dtype("act"), "swiglu_oai");
  EXPECT_FALSE(gpu.gemm_choice(8).from_tuner);  // nothing tuned yet

  TuneRecord record;
  {
    TuningSession session(*tuner, "target");
    record = session.tune(problem, 8);
  }
  ASSERT_EQ(record.status, TuneStatus::kTuned) << record.reason;
  expect_every_candidate_checked_and_timed(record);
  const moe::MoeGpuLayer::GemmChoice choice = gpu.gemm_choice(8);
  EXPECT_TRUE(choice.from_tuner);
  EXPECT_EQ(moe::gpu::to_string(choice.gemm), record.tactic);
  EXPECT_EQ(gpu.gemm_choice(5).gemm, choice.gemm);  // bucket 8 serves (4, 8]
  EXPECT_FALSE(gpu.gemm_choice(40).from_tuner);     // bucket 64 was not tuned
  check_forward(gpu, layer, 8);
}

TEST(CudaTactics, MoeGpuLayerRunsAHandWrittenPrefillEntry) {
  const moe::MoeLayer layer = make_layer();
  const TempFile file("mxq-cuda-moe-entry");
  {
    const moe::MoeGpuLayer probe = moe::MoeGpuLayer::upload(layer, 64);
    write_entry(file.path(), *probe.tune_problem(0), 16, "prefill_wgmma");
  }
  const std::unique_ptr<Autotuner> tuner = cuda_tuner(file.path(), AutotuneMode::kLoad);
  const moe::MoeGpuLayer gpu = moe::MoeGpuLayer::upload(
      layer, 64, Device::cuda(0), moe::gpu::GemmVariant::kDecodeMma, tuner.get());
  const moe::MoeGpuLayer::GemmChoice choice = gpu.gemm_choice(12);  // bucket 16 serves (8, 16]
  EXPECT_TRUE(choice.from_tuner);
  EXPECT_EQ(choice.gemm, moe::gpu::GemmVariant::kPrefillWgmma);
  EXPECT_EQ(gpu.tactic_name(12), "cuda.moe.w4a16.prefill_wgmma");
  const moe::MoeGpuLayer::GemmChoice other = gpu.gemm_choice(40);
  EXPECT_FALSE(other.from_tuner);
  EXPECT_EQ(other.gemm, moe::gpu::GemmVariant::kDecodeMma);
  check_forward(gpu, layer, 12);
  check_forward(gpu, layer, 40);
}

// A W4A8 layer: its key names its precision (never a W4A16 decision), both variants are tuned
// and checked against the W4A8 reference, and the layer runs the winner.
TEST(CudaTactics, MoeGpuForwardTunesTheW4a8Variants) {
  const moe::MoeLayer layer = make_layer(moe::ActivationQuant::kFp8Group128);
  const TempFile file("mxq-cuda-moe-tune-w4a8");
  const std::unique_ptr<Autotuner> tuner = cuda_tuner(file.path(), AutotuneMode::kTune);
  const moe::MoeGpuLayer gpu = moe::MoeGpuLayer::upload(
      layer, 64, Device::cuda(0), moe::gpu::GemmVariant::kDecodeMma, tuner.get());
  ASSERT_NE(gpu.tune_problem(0), nullptr);
  const Problem problem = *gpu.tune_problem(0);
  EXPECT_EQ(problem.dtype("x"), "fp8_g128");
  EXPECT_NE(problem, *moe::MoeGpuLayer::upload(make_layer(), 64).tune_problem(0));

  TuneRecord record;
  {
    TuningSession session(*tuner, "target");
    record = session.tune(problem, 64);
  }
  ASSERT_EQ(record.status, TuneStatus::kTuned) << record.reason;
  expect_every_candidate_checked_and_timed(record);
  const moe::MoeGpuLayer::GemmChoice choice = gpu.gemm_choice(64);
  EXPECT_TRUE(choice.from_tuner);
  EXPECT_EQ(gpu.tactic_name(64), "cuda.moe.w4a8." + record.tactic);
  check_forward(gpu, layer, 64);
}

}  // namespace
}  // namespace mxq::tune
