// The toy_gemm test op, its CPU tactics and presets (see toy_gemm.h).
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/tune/registry.h"
#include "tune/toy_gemm/toy_gemm.h"
#include "tune/toy_gemm/toy_gemm_kernels.h"

namespace mxq::tune {

Problem toy_gemm_problem(std::int64_t n, std::int64_t k) {
  if (n < 1 || k < 1) {
    fail_argument(ErrorCode::kShapeMismatch, "toy_gemm n, k", ">= 1",
                  std::to_string(n) + ", " + std::to_string(k));
  }
  return Problem(std::string(kToyGemmOp), {{"N", n}, {"K", k}},
                 {{"a", "f32"}, {"w", "f32"}, {"out", "f32"}});
}

void toy_gemm_reference(const ToyGemmArgs& args, double* out) {
  for (std::int64_t t = 0; t < args.tokens; ++t) {
    for (std::int64_t j = 0; j < args.n; ++j) {
      double sum = 0;
      for (std::int64_t i = 0; i < args.k; ++i) {
        sum += static_cast<double>(args.a[t * args.k + i]) * args.w[j * args.k + i];
      }
      out[t * args.n + j] = sum;
    }
  }
}

namespace {

// fp32 accumulation over k <= a few thousand terms of [-1, 1] products stays well inside this.
constexpr double kMaxRelativeError = 1e-5;

class ToyGemmWorkload final : public Workload {
 public:
  ToyGemmWorkload(const Problem& problem, std::int64_t tokens)
      : n_(problem.dim("N")), k_(problem.dim("K")), tokens_(tokens) {
    MXQ_CHECK(tokens >= 1, ErrorCode::kInvalidArgument, "toy_gemm workload: tokens=", tokens);
    std::mt19937 rng(static_cast<unsigned>(problem.hash() ^ static_cast<std::uint64_t>(tokens)));
    std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
    a_.resize(static_cast<std::size_t>(tokens_ * k_));
    w_.resize(static_cast<std::size_t>(n_ * k_));
    for (float& x : a_) x = dist(rng);
    for (float& x : w_) x = dist(rng);
    out_.resize(static_cast<std::size_t>(tokens_ * n_));
    reference_.resize(out_.size());
    toy_gemm_reference(args(), reference_.data());
  }

  void run(const Tactic& tactic) override { tactic.run(args()); }

  CheckResult check(const Tactic& tactic) override {
    std::fill(out_.begin(), out_.end(), std::numeric_limits<float>::quiet_NaN());
    tactic.run(args());
    double diff = 0;
    double norm = 0;
    for (std::size_t i = 0; i < out_.size(); ++i) {
      if (!std::isfinite(out_[i])) {
        return {false, INFINITY,
                "output element " + std::to_string(i) + " not written or not finite"};
      }
      const double d = out_[i] - reference_[i];
      diff += d * d;
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
  ToyGemmArgs args() { return {a_.data(), w_.data(), out_.data(), tokens_, n_, k_}; }
  std::int64_t n_, k_, tokens_;
  std::vector<float> a_, w_, out_;
  std::vector<double> reference_;
};

Support multiple_of(const Problem& problem, const char* dim, std::int64_t m) {
  const std::int64_t value = problem.dim(dim);
  if (value % m == 0) return Support::yes();
  return Support::no(std::string(dim) + "=" + std::to_string(value) + " is not a multiple of " +
                     std::to_string(m));
}

Tactic make(std::string variant, TacticParams params, TokenRange tokens,
            std::function<Support(const Problem&)> supports,
            std::function<void(const ToyGemmArgs&)> kernel) {
  Tactic t;
  t.op = std::string(kToyGemmOp);
  t.backend = Backend::kCpu;
  t.variant = std::move(variant);
  t.params = std::move(params);
  t.tokens = tokens;
  t.supports_fn = std::move(supports);
  t.run = TacticRunner::of<ToyGemmArgs>(std::move(kernel));
  return t;
}

}  // namespace

void register_toy_gemm(TacticRegistry& registry) {
  OpSpec op;
  op.name = std::string(kToyGemmOp);
  op.backend = Backend::kCpu;
  op.description = "test fp32 GEMM out = a · w^T (the tuner's own tests)";
  op.buckets = power_of_two_buckets(4096);
  op.default_tactic = "rowwise";
  op.make_workload = [](const Problem& problem, std::int64_t tokens) {
    return std::make_unique<ToyGemmWorkload>(problem, tokens);
  };
  registry.add_op(std::move(op));

  registry.add_tactic(make("rowwise", {}, {}, nullptr, toy_gemm::rowwise));
  for (int lanes : {8, 16}) {
    registry.add_tactic(make(
        "unrolled", {{"lanes", std::to_string(lanes)}}, {},
        [lanes](const Problem& p) { return multiple_of(p, "K", lanes); },
        [lanes](const ToyGemmArgs& a) { toy_gemm::unrolled(a, lanes); }));
  }
  for (int bn : {4, 8}) {
    for (int threads : {1, 2}) {
      registry.add_tactic(make(
          "column_tiled", {{"bn", std::to_string(bn)}, {"threads", std::to_string(threads)}}, {},
          [bn](const Problem& p) { return multiple_of(p, "N", bn); },
          [bn, threads](const ToyGemmArgs& a) { toy_gemm::column_tiled(a, bn, threads); }));
    }
  }
  for (int threads : {1, 2}) {
    registry.add_tactic(make(
        "small_batch", {{"threads", std::to_string(threads)}}, {1, toy_gemm::kMaxSmallBatchRows},
        nullptr, [threads](const ToyGemmArgs& a) { toy_gemm::small_batch(a, threads); }));
  }
  registry.add_tactic(make(
      "row_parallel", {{"threads", "2"}}, {2, TokenRange::kUnbounded},
      [](const Problem& p) { return multiple_of(p, "K", 8); },
      [](const ToyGemmArgs& a) { toy_gemm::row_parallel(a, 2); }));
}

const TacticRegistry& toy_registry() {
  static const TacticRegistry* registry = [] {
    auto* r = new TacticRegistry();  // never destroyed: tuners may outlive static destruction
    register_builtin_tactics(*r);
    register_toy_gemm(*r);
    r->freeze();
    return r;
  }();
  return *registry;
}

namespace {

std::int64_t split(std::int64_t size, int parts, const char* what) {
  return split_evenly(size, parts, what);
}

std::vector<PresetProblem> toy_target(const ParallelLayout& layout) {
  return {
      {toy_gemm_problem(split(512, layout.tp, "toy N=512"), 256), {1, 2, 4, 8, 16, 32, 64}},
      {toy_gemm_problem(256, split(512, layout.tp, "toy K=512")), {1, 2, 4, 8, 16, 32, 64}},
  };
}

// Shares one problem with "toy" (as a draft model shares layer shapes with its target) and
// serves odd draft token counts.
std::vector<PresetProblem> toy_draft(const ParallelLayout& layout) {
  return {
      {toy_gemm_problem(split(512, layout.tp, "toy N=512"), 256), {1, 3, 24}},
      {toy_gemm_problem(split(192, layout.tp, "toy-draft N=192"), 128), {1, 3, 12, 24}},
  };
}

}  // namespace

std::span<const DeploymentPreset> toy_presets() {
  static const std::vector<DeploymentPreset> presets = {
      {"toy", "two toy_gemm layers", toy_target},
      {"toy-draft", "draft model for \"toy\": one shared and one own toy_gemm layer", toy_draft},
  };
  return presets;
}

}  // namespace mxq::tune
