// linear() and explain() consulting an autotuner (LinearOptions::tuner): a cached tactic runs
// for its problem and token bucket, only with "auto", only when it supports the actual call;
// otherwise the dispatch rule decides; explain() says which; `mxq linear` reads the cache named
// by MXQ_AUTOTUNE_CACHE. The cache files are written by hand with this machine's fingerprint so
// that the decisions are known (tuning would pick whichever tactic happens to be fastest).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/cli_test_support.h"
#include "linear/linear_test_support.h"
#include "mxq/io/npy.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"
#include "mxq/linear/tune.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/cache_file.h"
#include "mxq/tune/fingerprint.h"
#include "mxq/tune/registry.h"
#include "tune/tune_test_util.h"

namespace mxq::linear {
namespace {

using mxq::testing::ScratchDir;

constexpr std::int64_t kN = 96;
constexpr std::int64_t kK = 256;
const BlockShape kBlock{64, 64};

using tune::testing::hand_written_entry;
using tune::testing::load_cpu_tuner;
using tune::testing::write_cpu_cache;

BlockFp8Weight weight() { return quantize_weight(testing::random_f32(kN, kK, 1), kBlock); }

std::vector<std::uint16_t> bits_of(const Tensor& t) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(t.numel()));
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

class LinearTuner : public ::testing::Test {
 protected:
  void SetUp() override {
    problem_ = linear::block_fp8_linear_problem(kN, kK, kBlock);
    // Bucket 8 serves M in (4, 8]; bucket 16 is not in the cache.
    write_cpu_cache(dir_.file("cache.json"), tune::builtin_tactics(),
                    {hand_written_entry(problem_, 8, "blocked_f32[tile_n=16]")});
    tuner_ = load_cpu_tuner(dir_.file("cache.json"));
    ASSERT_EQ(tuner_->decisions().size(), 1U);
  }

  ScratchDir dir_{"mxq-linear-tuner"};
  tune::Problem problem_;
  std::unique_ptr<tune::Autotuner> tuner_;
  const BlockFp8Weight w_ = weight();
};

TEST_F(LinearTuner, RunsTheCachedTacticForItsBucketAndTheDispatchRuleOtherwise) {
  const Tensor x = testing::random_bf16(6, kK, 2);
  LinearRun ran;
  LinearOptions options;
  options.tuner = tuner_.get();
  options.ran = &ran;
  const Tensor tuned = linear(x, w_, nullptr, options);
  ASSERT_NE(ran.tactic, nullptr);
  EXPECT_EQ(ran.tactic->name(), "cpu.blocked_f32.n16");
  EXPECT_TRUE(ran.from_tuner);
  // The same bits as forcing that tactic.
  LinearOptions forced;
  forced.tactic = "cpu.blocked_f32.n16";
  EXPECT_EQ(bits_of(tuned), bits_of(linear(x, w_, nullptr, forced)));

  // Without a tuner: the dispatch rule (the CPU reference).
  LinearOptions plain;
  plain.ran = &ran;
  (void)linear(x, w_, nullptr, plain);
  EXPECT_EQ(ran.tactic->name(), "cpu.reference");
  EXPECT_FALSE(ran.from_tuner);

  // M = 12 is served by bucket 16, which the cache does not hold.
  (void)linear(testing::random_bf16(12, kK, 3), w_, nullptr, options);
  EXPECT_EQ(ran.tactic->name(), "cpu.reference");
  EXPECT_FALSE(ran.from_tuner);

  // A forced request never consults the tuner.
  options.tactic = "reference";
  (void)linear(x, w_, nullptr, options);
  EXPECT_EQ(ran.tactic->name(), "cpu.reference");
  EXPECT_FALSE(ran.from_tuner);
}

TEST_F(LinearTuner, PreQuantizedInputsAndAPrebuiltProblemConsultItToo) {
  const Fp8BlockTensor x = quantize_fp8_groups(testing::random_bf16(8, kK, 4), kBlock.k);
  LinearRun ran;
  LinearOptions options;
  options.tuner = tuner_.get();
  options.tune_problem = &problem_;
  options.ran = &ran;
  (void)linear(x, w_, nullptr, options);
  EXPECT_EQ(ran.tactic->name(), "cpu.blocked_f32.n16");
  EXPECT_TRUE(ran.from_tuner);

  // A prebuilt problem of another shape is the caller's mistake.
  const tune::Problem other = linear::block_fp8_linear_problem(kN + 16, kK, kBlock);
  options.tune_problem = &other;
  try {
    (void)linear(x, w_, nullptr, options);
    FAIL() << "a mismatched tune_problem was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("tune_problem"), std::string::npos) << e.what();
  }
}

TEST_F(LinearTuner, ExplainSaysWhetherTheCacheChose) {
  LinearProblem p;
  p.m = 8;
  p.n = kN;
  p.k = kK;
  p.block = kBlock;
  const Explanation cached = explain(p, "auto", tuner_.get());
  ASSERT_NE(cached.chosen, nullptr);
  EXPECT_EQ(cached.chosen->name(), "cpu.blocked_f32.n16");
  EXPECT_TRUE(cached.from_tuner);
  EXPECT_NE(cached.tuner_note.find("cache entry for token bucket 8"), std::string::npos)
      << cached.tuner_note;
  EXPECT_NE(cached.str().find("autotune:"), std::string::npos) << cached.str();
  bool reference_listed = false;
  for (const TacticRejection& r : cached.rejected) {
    if (r.tactic != "cpu.reference") continue;
    reference_listed = true;
    EXPECT_NE(r.reason.find("the dispatch rule's choice"), std::string::npos) << r.reason;
  }
  EXPECT_TRUE(reference_listed);
  EXPECT_EQ(&select_tactic(p, "auto", tuner_.get()), cached.chosen);

  p.m = 12;
  const Explanation missing = explain(p, "auto", tuner_.get());
  EXPECT_EQ(missing.chosen->name(), "cpu.reference");
  EXPECT_FALSE(missing.from_tuner);
  EXPECT_NE(missing.tuner_note.find("no cache entry"), std::string::npos) << missing.tuner_note;

  const Explanation forced = explain(p, "fallback", tuner_.get());
  EXPECT_FALSE(forced.from_tuner);
  EXPECT_NE(forced.tuner_note.find("not consulted"), std::string::npos) << forced.tuner_note;

  const Explanation none = explain(p, "auto");
  EXPECT_TRUE(none.tuner_note.empty());
  EXPECT_EQ(none.str().find("autotune:"), std::string::npos);
}

TEST_F(LinearTuner, ATunerOfAnotherBackendIsRefused) {
  tune::AutotunerConfig config;
  config.options.mode = tune::AutotuneMode::kOff;
  config.backend = tune::Backend::kCuda;
  tune::Fingerprint fingerprint;  // no GPU needed: the tuner is never asked
  fingerprint.backend = "cuda";
  fingerprint.device = "test GPU";
  fingerprint.registry_hash = tune::builtin_tactics().hash();
  config.fingerprint = fingerprint;
  const tune::Autotuner cuda_tuner(config);
  LinearOptions options;
  options.tuner = &cuda_tuner;
  try {
    (void)linear(testing::random_bf16(4, kK, 5), w_, nullptr, options);
    FAIL() << "a CUDA tuner was accepted for a CPU call";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("backend cpu"), std::string::npos) << e.what();
  }
}

// A linear tactic that supports the tuner's problem (so the cache serves it) but never a real call
// (as a tactic can depend on what the key leaves out, e.g. the bias or the weight-scale layout).
class NeverForRealCalls final : public LinearTactic {
 public:
  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] TacticKind kind() const override { return TacticKind::kFallback; }
  [[nodiscard]] TacticParams params() const override { return {}; }

 protected:
  [[nodiscard]] Support check(const LinearProblem&) const override {
    return Support::no("test tactic: never supports a real call");
  }
  void run_supported(const LinearOperands&, const LinearProblem&) const override {
    ADD_FAILURE() << "an unsupported tactic ran";
  }

 private:
  std::string name_ = "test.never";
};

TEST(LinearTunerUnsupported, ACachedTacticThatDoesNotSupportTheCallIsNotUsed) {
  const NeverForRealCalls never;
  tune::TacticRegistry registry;
  tune::OpSpec op;
  op.name = std::string(linear::kBlockFp8LinearOp);
  op.backend = tune::Backend::kCpu;
  op.buckets = tune::power_of_two_buckets(64);
  op.default_tactic = "reference";
  op.make_workload = [](const tune::Problem&, std::int64_t) -> std::unique_ptr<tune::Workload> {
    return nullptr;  // nothing is tuned here
  };
  registry.add_op(std::move(op));
  const auto tactic = [&](std::string variant, const LinearTactic* native) {
    tune::Tactic t;
    t.op = std::string(linear::kBlockFp8LinearOp);
    t.variant = std::move(variant);
    t.run = tune::TacticRunner::of<int>([](const int&) {});
    t.native = native;
    return t;
  };
  registry.add_tactic(tactic("reference", find_tactic("cpu.reference")));
  registry.add_tactic(tactic("never", &never));
  registry.freeze();

  const ScratchDir dir("mxq-linear-tuner-never");
  const tune::Problem problem = linear::block_fp8_linear_problem(kN, kK, kBlock);
  write_cpu_cache(dir.file("cache.json"), registry, {hand_written_entry(problem, 8, "never")});
  const auto tuner = load_cpu_tuner(dir.file("cache.json"), &registry);
  ASSERT_EQ(tuner->lookup(problem, 8).source, tune::SelectionSource::kTuned);

  LinearRun ran;
  LinearOptions options;
  options.tuner = tuner.get();
  options.ran = &ran;
  const BlockFp8Weight w = weight();
  const Tensor x = testing::random_bf16(8, kK, 6);
  const Tensor y = linear(x, w, nullptr, options);
  EXPECT_EQ(ran.tactic->name(), "cpu.reference");
  EXPECT_FALSE(ran.from_tuner);
  EXPECT_EQ(bits_of(y), bits_of(linear(x, w)));

  LinearProblem p = make_problem(x, w, nullptr);
  const Explanation e = explain(p, "auto", tuner.get());
  EXPECT_EQ(e.chosen->name(), "cpu.reference");
  EXPECT_FALSE(e.from_tuner);
  EXPECT_NE(e.tuner_note.find("does not support this problem"), std::string::npos) << e.tuner_note;
}

TEST(LinearTunerCli, MxqLinearReadsTheCacheNamedByTheEnvironment) {
  const ScratchDir dir("mxq-linear-tuner-cli");
  io::write_npy(dir.file("w.npy"), testing::random_f32(kN, kK, 7));
  Tensor x = Tensor::empty(DType::kF32, {8, kK});
  const Tensor xb = testing::random_bf16(8, kK, 8);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.data_as<float>()[i] = bf16_to_float(reinterpret_cast<const std::uint16_t*>(xb.data())[i]);
  }
  io::write_npy(dir.file("x.npy"), x);
  const auto q =
      mxq::testing::run_cli(dir, "quantize fp8-block " + dir.file("w.npy") + " " +
                                     dir.file("w.safetensors") + " --name proj --block 64x64");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  write_cpu_cache(dir.file("cache.json"), tune::builtin_tactics(),
                  {hand_written_entry(linear::block_fp8_linear_problem(kN, kK, kBlock), 8,
                                      "blocked_f32[tile_n=16]")});
  const std::string command = "linear --checkpoint " + dir.file("w.safetensors") +
                              " --name proj --input " + dir.file("x.npy") + " --output " +
                              dir.file("y.npy") + " --explain --json";

  const auto cached = mxq::testing::run_cli(
      dir, command, "MXQ_AUTOTUNE=load MXQ_AUTOTUNE_CACHE=" + dir.file("cache.json"));
  ASSERT_EQ(cached.exit_code, 0) << cached.err;
  const nlohmann::json report = nlohmann::json::parse(cached.out);
  EXPECT_EQ(report["tactic"], "cpu.blocked_f32.n16");
  EXPECT_EQ(report["tactic_from_cache"], true);
  EXPECT_EQ(report["autotune"]["cache"], dir.file("cache.json"));
  EXPECT_EQ(report["explain"]["from_tuner"], true);

  const auto off = mxq::testing::run_cli(
      dir, command, "MXQ_AUTOTUNE=off MXQ_AUTOTUNE_CACHE=" + dir.file("cache.json"));
  ASSERT_EQ(off.exit_code, 0) << off.err;
  const nlohmann::json plain = nlohmann::json::parse(off.out);
  EXPECT_EQ(plain["tactic"], "cpu.reference");
  EXPECT_EQ(plain["tactic_from_cache"], false);
  EXPECT_EQ(plain["autotune"]["cache"], nullptr);
}

}  // namespace
}  // namespace mxq::linear
