#include "linear/tune_support.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "mxq/core/error.h"
#include "mxq/core/prng.h"
#include "mxq/formats/bf16.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"
#include "mxq/linear/tune.h"

namespace mxq {

namespace linear {

using tune::Problem;

Problem block_fp8_linear_problem(std::int64_t n, std::int64_t k, BlockShape block,
                                 ScaleMode activation_scales, DType out) {
  if (n < 1 || k < 1 || block.n < 1 || block.k < 1) {
    fail_argument(ErrorCode::kShapeMismatch, "block_fp8_linear N, K, block", ">= 1 each",
                  std::to_string(n) + ", " + std::to_string(k) + ", " + to_string(block));
  }
  if (out != DType::kBF16 && out != DType::kF32) {
    fail_argument(ErrorCode::kDtypeMismatch, "block_fp8_linear out", "bf16 or f32", out);
  }
  const std::string a_scale = activation_scales == ScaleMode::kFp32 ? "f32" : "ue8m0";
  return Problem(std::string(kBlockFp8LinearOp),
                 {{"N", n}, {"K", k}, {"block_n", block.n}, {"block_k", block.k}},
                 {{"a", "e4m3"},
                  {"a_scale", a_scale},
                  {"w", "e4m3"},
                  {"w_scale", "f32"},
                  {"out", out == DType::kBF16 ? "bf16" : "f32"}});
}

}  // namespace linear

namespace linear::internal {
namespace {

// The bound of the linear module's GPU tests (and of its CPU blocked tactics).
constexpr double kMaxRelativeError = 4e-3;

std::string_view scale_name(ScaleMode mode) { return mode == ScaleMode::kFp32 ? "f32" : "ue8m0"; }
std::string_view out_name(DType dtype) { return dtype == DType::kBF16 ? "bf16" : "f32"; }

// Uniform in [-1, 1): cheap enough for the 117M-element weights of the largest presets.
Tensor random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor t = Tensor::empty(DType::kF32, {rows, cols});
  Xoshiro256 rng(seed);
  float* data = t.data_as<float>();
  for (std::int64_t i = 0; i < rows * cols; ++i) data[i] = rng.uniform_symmetric();
  return t;
}

// `count` rows of [0, rows), evenly spread, the first and the last included.
std::vector<std::int64_t> spread_rows(std::int64_t rows, std::int64_t count) {
  if (count >= rows) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) all[static_cast<std::size_t>(i)] = i;
    return all;
  }
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < count; ++i) {
    out.push_back(count == 1 ? 0 : i * (rows - 1) / (count - 1));
  }
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Rows `rows` of pre-quantized activations (each row has its own scales, so a subset of rows is
// exactly what quantizing those rows alone gives).
Fp8BlockTensor select_rows(const Fp8BlockTensor& x, const std::vector<std::int64_t>& rows) {
  const std::int64_t k = x.q.shape()[1];
  const std::int64_t groups = x.scale.shape()[1];
  const auto count = static_cast<std::int64_t>(rows.size());
  Fp8BlockTensor out{Tensor::empty(DType::kE4M3, {count, k}),
                     Tensor::empty(DType::kF32, {count, groups}), x.block};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(static_cast<std::uint8_t*>(out.q.data()) + static_cast<std::int64_t>(i) * k,
                static_cast<const std::uint8_t*>(x.q.data()) + rows[i] * k,
                static_cast<std::size_t>(k));
    std::memcpy(out.scale.data_as<float>() + static_cast<std::int64_t>(i) * groups,
                x.scale.data_as<float>() + rows[i] * groups,
                static_cast<std::size_t>(groups) * sizeof(float));
  }
  return out;
}

double value_at(const void* data, DType dtype, std::int64_t index) {
  if (dtype == DType::kBF16) return bf16_to_float(static_cast<const std::uint16_t*>(data)[index]);
  return static_cast<const float*>(data)[index];
}

}  // namespace

LinearProblem linear_problem_of(const tune::Problem& problem, std::int64_t tokens, Device device) {
  LinearProblem p;
  p.m = tokens;
  p.n = problem.dim("N");
  p.k = problem.dim("K");
  p.block = {problem.dim("block_n"), problem.dim("block_k")};
  p.activation_scales = problem.dtype("a_scale") == "ue8m0" ? ScaleMode::kUe8m0 : ScaleMode::kFp32;
  p.out_dtype = problem.dtype("out") == "f32" ? DType::kF32 : DType::kBF16;
  describe_device(p, device);
  return p;
}

tune::Problem tune_problem_of(const LinearProblem& problem) {
  return linear::block_fp8_linear_problem(problem.n, problem.k, problem.block,
                                          problem.activation_scales, problem.out_dtype);
}

bool tune_problem_matches(const tune::Problem& tuned, const LinearProblem& problem) {
  if (tuned.op() != linear::kBlockFp8LinearOp) return false;
  const auto dim_is = [&](std::string_view name, std::int64_t value) {
    const auto found = tuned.find_dim(name);
    return found.has_value() && *found == value;
  };
  const auto dtype_is = [&](std::string_view name, std::string_view value) {
    for (const tune::DtypeField& field : tuned.dtypes()) {
      if (field.name == name) return field.dtype == value;
    }
    return false;
  };
  return dim_is("N", problem.n) && dim_is("K", problem.k) && dim_is("block_n", problem.block.n) &&
         dim_is("block_k", problem.block.k) &&
         dtype_is("a_scale", scale_name(problem.activation_scales)) &&
         dtype_is("out", out_name(problem.out_dtype));
}

tune::Tactic adopt_tactic(const LinearTactic& source, tune::Backend backend,
                          const tune::TacticRegistry& registry, Device (*device)(),
                          bool with_predicate) {
  tune::Tactic t;
  t.op = std::string(linear::kBlockFp8LinearOp);
  t.backend = backend;
  const std::string& name = source.name();
  const auto first_dot = name.find('.');
  const std::string rest = first_dot == std::string::npos ? name : name.substr(first_dot + 1);
  t.variant = rest.substr(0, rest.find('.'));
  t.params = source.params();
  if (registry.find_tactic(t.op, backend, t.id()) != nullptr) t.variant = rest;
  t.tokens = source.tokens();
  if (with_predicate) {
    t.supports_fn = [&source, device](const tune::Problem& problem) {
      return source.supports(linear_problem_of(problem, 1, device()));
    };
  }
  t.run = tune::TacticRunner::of<TunedLinearArgs>(
      [&source](const TunedLinearArgs& args) { source.run(*args.operands, *args.problem); });
  t.native = &source;
  return t;
}

tune::Tactic dispatch_rule_tactic(tune::Backend backend) {
  tune::Tactic t;
  t.op = std::string(linear::kBlockFp8LinearOp);
  t.backend = backend;
  t.variant = "auto";
  t.run = tune::TacticRunner::of<TunedLinearArgs>([](const TunedLinearArgs& args) {
    const LinearTactic& chosen = args.dispatch_choice != nullptr
                                     ? *args.dispatch_choice
                                     : select_tactic(*args.problem, "auto");
    chosen.run(*args.operands, *args.problem);
  });
  t.native = static_cast<const LinearTactic*>(nullptr);
  return t;
}

TuneInputs make_tune_inputs(const tune::Problem& problem, std::int64_t tokens, Device device,
                            double max_reference_macs) {
  MXQ_CHECK(tokens >= 1, ErrorCode::kInvalidArgument, "block_fp8_linear workload: tokens=", tokens);
  TuneInputs in;
  in.problem = linear_problem_of(problem, tokens, device);
  const LinearProblem& p = in.problem;
  const std::uint64_t seed = problem.hash() ^ static_cast<std::uint64_t>(tokens);
  in.weight = quantize_weight(random_matrix(p.n, p.k, seed), p.block);
  in.x = quantize_fp8_groups(random_matrix(p.m, p.k, seed + 1), p.block.k, p.activation_scales);
  const double macs_per_row = static_cast<double>(p.n) * static_cast<double>(p.k);
  const auto affordable = static_cast<std::int64_t>(
      std::clamp(std::floor(max_reference_macs / macs_per_row), 2.0, 1e12));
  in.reference_rows = spread_rows(p.m, affordable);
  const bool all_rows = static_cast<std::int64_t>(in.reference_rows.size()) == p.m;
  const Tensor reference = linear_reference(all_rows ? in.x : select_rows(in.x, in.reference_rows),
                                            in.weight, nullptr, p.out_dtype);
  in.reference.resize(static_cast<std::size_t>(reference.numel()));
  for (std::size_t i = 0; i < in.reference.size(); ++i) {
    in.reference[i] = value_at(reference.data(), p.out_dtype, static_cast<std::int64_t>(i));
  }
  return in;
}

tune::CheckResult check_output(const void* out, DType dtype, const TuneInputs& inputs) {
  const std::int64_t m = inputs.problem.m;
  const std::int64_t n = inputs.problem.n;
  for (std::int64_t i = 0; i < m * n; ++i) {
    if (!std::isfinite(value_at(out, dtype, i))) {
      return {false, std::numeric_limits<double>::infinity(),
              "output element " + std::to_string(i) + " (row " + std::to_string(i / n) +
                  ") not written or not finite"};
    }
  }
  double diff = 0;
  double norm = 0;
  for (std::size_t r = 0; r < inputs.reference_rows.size(); ++r) {
    const std::int64_t row = inputs.reference_rows[r];
    for (std::int64_t j = 0; j < n; ++j) {
      const double value = value_at(out, dtype, row * n + j);
      const double expected =
          inputs.reference[r * static_cast<std::size_t>(n) + static_cast<std::size_t>(j)];
      diff += (value - expected) * (value - expected);
      norm += expected * expected;
    }
  }
  const double error = std::sqrt(diff / std::max(norm, 1e-300));
  if (error > kMaxRelativeError) {
    return {false, error,
            "relative L2 error " + std::to_string(error) + " > " +
                std::to_string(kMaxRelativeError) + " over " +
                std::to_string(inputs.reference_rows.size()) + " reference row(s)"};
  }
  return {true, error, ""};
}

}  // namespace linear::internal
}  // namespace mxq
