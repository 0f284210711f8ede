// Registers the block-FP8 linear op's CPU tactics with the autotuner (see
// include/mxq/tune/block_fp8_linear.h). The linear module's own tactic objects run; this file
// only maps them to autotuner tactics and builds a workload to time and check them.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/formats/bf16.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"
#include "mxq/tune/block_fp8_linear.h"
#include "mxq/tune/registry.h"

namespace mxq::tune {

Problem block_fp8_linear_problem(std::int64_t n, std::int64_t k, BlockShape block,
                                 ScaleMode activation_scales) {
  if (n < 1 || k < 1 || block.n < 1 || block.k < 1) {
    fail_argument(ErrorCode::kShapeMismatch, "block_fp8_linear N, K, block", ">= 1 each",
                  std::to_string(n) + ", " + std::to_string(k) + ", " + to_string(block));
  }
  const std::string a_scale = activation_scales == ScaleMode::kFp32 ? "f32" : "ue8m0";
  return Problem(
      std::string(kBlockFp8LinearOp),
      {{"N", n}, {"K", k}, {"block_n", block.n}, {"block_k", block.k}},
      {{"a", "e4m3"}, {"a_scale", a_scale}, {"w", "e4m3"}, {"w_scale", "f32"}, {"out", "bf16"}});
}

namespace {

// A tactic's bf16 output against the fp64 reference rounded to bf16: the bound the linear
// module's own tests hold the blocked fp32 tactics to (tests/cpp/linear/reference_test.cpp).
constexpr double kMaxRelativeError = 4e-3;

struct LinearArgs {
  const linear::LinearOperands* operands = nullptr;
  const linear::LinearProblem* problem = nullptr;
};

linear::LinearProblem to_linear_problem(const Problem& problem, std::int64_t tokens) {
  linear::LinearProblem p;
  p.m = tokens;
  p.n = problem.dim("N");
  p.k = problem.dim("K");
  p.block = {problem.dim("block_n"), problem.dim("block_k")};
  p.activation_scales = problem.dtype("a_scale") == "ue8m0" ? ScaleMode::kUe8m0 : ScaleMode::kFp32;
  p.out_dtype = DType::kBF16;
  return p;
}

Tensor random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor t = Tensor::empty(DType::kF32, {rows, cols});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0F, 1.0F);
  float* data = t.data_as<float>();
  for (std::int64_t i = 0; i < rows * cols; ++i) data[i] = dist(rng);
  return t;
}

class LinearWorkload final : public Workload {
 public:
  LinearWorkload(const Problem& problem, std::int64_t tokens) {
    MXQ_CHECK(tokens >= 1, ErrorCode::kInvalidArgument,
              "block_fp8_linear workload: tokens=", tokens);
    const linear::LinearProblem shape = to_linear_problem(problem, tokens);
    const std::uint64_t seed = problem.hash() ^ static_cast<std::uint64_t>(tokens);
    weight_ = linear::quantize_weight(random_matrix(shape.n, shape.k, seed), shape.block);
    x_ = quantize_fp8_groups(random_matrix(shape.m, shape.k, seed + 1), shape.block.k,
                             shape.activation_scales);
    out_ = Tensor::empty(DType::kBF16, {shape.m, shape.n});
    linear::LinearOptions options;
    options.activation_scales = shape.activation_scales;
    options.out_dtype = DType::kBF16;
    prepared_ = linear::prepare_linear(x_, weight_, nullptr, out_, options);
    const Tensor reference = linear::linear_reference(x_, weight_, nullptr, DType::kBF16);
    const auto* bits = static_cast<const std::uint16_t*>(reference.data());
    reference_.resize(static_cast<std::size_t>(reference.numel()));
    for (std::size_t i = 0; i < reference_.size(); ++i) reference_[i] = bf16_to_float(bits[i]);
  }

  void run(const Tactic& tactic) override {
    tactic.run(LinearArgs{&prepared_.operands, &prepared_.problem});
  }

  CheckResult check(const Tactic& tactic) override {
    auto* bits = static_cast<std::uint16_t*>(out_.data());
    std::fill(bits, bits + out_.numel(), std::uint16_t{0x7FC0});  // bf16 NaN
    run(tactic);
    double diff = 0;
    double norm = 0;
    for (std::size_t i = 0; i < reference_.size(); ++i) {
      const double value = bf16_to_float(bits[i]);
      if (!std::isfinite(value)) {
        return {false, INFINITY,
                "output element " + std::to_string(i) + " not written or not finite"};
      }
      diff += (value - reference_[i]) * (value - reference_[i]);
      norm += reference_[i] * reference_[i];
    }
    const double error = std::sqrt(diff / std::max(norm, 1e-300));
    if (error > kMaxRelativeError) {
      return {
          false, error,
          "relative L2 error " + std::to_string(error) + " > " + std::to_string(kMaxRelativeError)};
    }
    return {true, error, ""};
  }

 private:
  linear::BlockFp8Weight weight_;
  Fp8BlockTensor x_;
  Tensor out_;
  linear::PreparedLinear prepared_;
  std::vector<double> reference_;
};

// "cpu.blocked_f32.n64" -> "blocked_f32" with tile_n=64 (from the tactic's params); the
// reference keeps its name without the "cpu." prefix.
Tactic adopt(const linear::LinearTactic& source) {
  Tactic t;
  t.op = std::string(kBlockFp8LinearOp);
  t.backend = Backend::kCpu;
  std::string variant = source.name().substr(std::string_view("cpu.").size());
  if (const auto dot = variant.find('.'); dot != std::string::npos) variant.resize(dot);
  t.variant = variant;
  for (const linear::TacticParam& param : source.params()) t.params.set(param.name, param.value);
  t.tokens = {source.tokens().min, source.tokens().max};
  // The reference accepts every block-FP8 problem (it is the op's default, which the registry
  // requires to carry no predicate); the others say what they do not support.
  if (source.kind() != linear::TacticKind::kReference) {
    t.supports_fn = [&source](const Problem& problem) {
      const linear::Support support = source.supports(to_linear_problem(problem, 1));
      return support.ok() ? Support::yes() : Support::no(support.reason);
    };
  }
  t.run = TacticRunner::of<LinearArgs>(
      [&source](const LinearArgs& args) { source.run(*args.operands, *args.problem); });
  return t;
}

}  // namespace

void register_block_fp8_linear_autotune(TacticRegistry& registry) {
  OpSpec op;
  op.name = std::string(kBlockFp8LinearOp);
  op.backend = Backend::kCpu;
  op.description = "block-FP8 linear y = x W^T (DeepSeek-V3 blocks), CPU tactics";
  op.buckets = power_of_two_buckets(4096);
  op.default_tactic = "reference";
  op.make_workload = [](const Problem& problem, std::int64_t tokens) {
    return std::make_unique<LinearWorkload>(problem, tokens);
  };
  registry.add_op(std::move(op));
  for (const auto& tactic : linear::linear_tactics()) {
    if (tactic->name().starts_with("cpu.")) registry.add_tactic(adopt(*tactic));
  }
}

}  // namespace mxq::tune
