// Registers the block-FP8 linear op's CPU tactics with the autotuner (see
// include/mxq/linear/tune.h). The linear module's own tactic objects run; this file
// only maps them to autotuner tactics (src/linear/tune_support.h) and builds a workload on the
// host to time and check them.
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "linear/tune_support.h"
#include "mxq/core/error.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"
#include "mxq/linear/tune.h"
#include "mxq/tune/registry.h"

namespace mxq::tune {
namespace {

using linear::internal::TunedLinearArgs;

class LinearWorkload final : public Workload {
 public:
  LinearWorkload(const Problem& problem, std::int64_t tokens)
      // The CPU reference costs what the default tactic costs: every row is checked.
      : inputs_(linear::internal::make_tune_inputs(problem, tokens, Device::cpu(),
                                                   std::numeric_limits<double>::infinity())) {
    const linear::LinearProblem& shape = inputs_.problem;
    out_ = Tensor::empty(shape.out_dtype, {shape.m, shape.n});
    linear::LinearOptions options;
    options.activation_scales = shape.activation_scales;
    options.out_dtype = shape.out_dtype;
    prepared_ = linear::prepare_linear(inputs_.x, inputs_.weight, nullptr, out_, options);
  }

  void run(const Tactic& tactic) override {
    tactic.run(TunedLinearArgs{&prepared_.operands, &prepared_.problem, nullptr});
  }

  CheckResult check(const Tactic& tactic) override {
    // NaN poison (0xFFFF is a bf16 NaN, 0xFFFFFFFF an f32 NaN): unwritten elements fail.
    std::memset(out_.data(), 0xFF, out_.nbytes());
    run(tactic);
    return linear::internal::check_output(out_.data(), out_.dtype(), inputs_);
  }

 private:
  linear::internal::TuneInputs inputs_;
  Tensor out_;
  linear::PreparedLinear prepared_;
};

Device cpu_device() { return Device::cpu(); }

}  // namespace

void register_block_fp8_linear_autotune(TacticRegistry& registry) {
  OpSpec op;
  op.name = std::string(linear::kBlockFp8LinearOp);
  op.backend = Backend::kCpu;
  op.description = "block-FP8 linear y = x W^T (DeepSeek-V3 blocks), CPU tactics";
  op.buckets = power_of_two_buckets(4096);
  op.default_tactic = "reference";
  op.make_workload = [](const Problem& problem, std::int64_t tokens) {
    return std::make_unique<LinearWorkload>(problem, tokens);
  };
  registry.add_op(std::move(op));
  for (const auto& tactic : linear::linear_tactics()) {
    if (!tactic->name().starts_with("cpu.")) continue;
    // The reference accepts every block-FP8 problem (it is the op's default, which the registry
    // requires to carry no predicate); the others say what they do not support.
    const bool reference = tactic->kind() == linear::TacticKind::kReference;
    registry.add_tactic(
        linear::internal::adopt_tactic(*tactic, Backend::kCpu, registry, &cpu_device, !reference));
  }
}

}  // namespace mxq::tune
