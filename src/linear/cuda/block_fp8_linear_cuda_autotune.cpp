// Registers the block-FP8 linear op's CUDA tactics with the autotuner (see
// include/mxq/linear/tune.h): every cuda.* tactic of linear::linear_tactics(), adopted
// as it is (so tactics the linear module adds appear here by themselves), and the default "auto",
// the rule-based dispatch. The workload holds its inputs on the current CUDA device, timed with
// CUDA events (make_timer(Backend::kCuda)) on the legacy default stream the tactics launch on.
//
// Input sets rotate (tune::RotatingBuffers): one set = the quantized activations in the layout
// linear() gives the tactics (rows padded to 16 bytes, scales K-group major), the weight and its
// scales; enough copies that cycling through them touches more than twice the L2 size, and
// every call of run() moves to the next set, so no call finds its weight in L2 (as when serving,
// where the other layers' weights have evicted it). A set larger than twice the L2 size is not
// copied: each call streams most of it from HBM anyway. The output buffer is shared.
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "linear/tune_support.h"
#include "mxq/core/cuda_check.h"
#include "mxq/core/error.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/tune.h"
#include "mxq/tune/cuda_timer.h"
#include "mxq/tune/registry.h"

namespace mxq::tune {
namespace {

using linear::internal::TunedLinearArgs;

// The fp64 CPU reference is computed for every row up to this many multiply-adds per key, for
// an evenly spread subset of rows beyond (about 1 s of host time on a 16-core machine).
constexpr double kMaxReferenceMacs = 4.0e9;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }
std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

Device current_cuda_device() {
  int device = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  return Device::cuda(device);
}

class CudaLinearWorkload final : public Workload {
 public:
  CudaLinearWorkload(const Problem& problem, std::int64_t tokens)
      : inputs_(linear::internal::make_tune_inputs(problem, tokens, current_cuda_device(),
                                                   kMaxReferenceMacs)) {
    const linear::LinearProblem& p = inputs_.problem;
    const std::int64_t groups = ceil_div(p.k, p.block.k);
    const std::int64_t lda = round_up(p.k, 16);
    const std::int64_t scale_ld = round_up(p.m, 4);
    // One input set: [a | a_scale | w | w_scale], each part on a 256-byte boundary.
    const std::size_t a_bytes = static_cast<std::size_t>(p.m * lda);
    const std::size_t a_scale_bytes = static_cast<std::size_t>(groups * scale_ld) * sizeof(float);
    const std::size_t w_bytes = inputs_.weight.q.nbytes();
    const std::size_t w_scale_bytes = inputs_.weight.scale.nbytes();
    const std::size_t a_scale_at = align256(a_bytes);
    const std::size_t w_at = a_scale_at + align256(a_scale_bytes);
    const std::size_t w_scale_at = w_at + align256(w_bytes);
    std::vector<std::uint8_t> set(w_scale_at + w_scale_bytes, 0);
    const auto* q = static_cast<const std::uint8_t*>(inputs_.x.q.data());
    for (std::int64_t row = 0; row < p.m; ++row) {
      std::memcpy(set.data() + row * lda, q + row * p.k, static_cast<std::size_t>(p.k));
    }
    auto* a_scale = reinterpret_cast<float*>(set.data() + a_scale_at);
    const float* x_scale = inputs_.x.scale.data_as<float>();
    for (std::int64_t row = 0; row < p.m; ++row) {
      for (std::int64_t g = 0; g < groups; ++g)
        a_scale[g * scale_ld + row] = x_scale[row * groups + g];
    }
    std::memcpy(set.data() + w_at, inputs_.weight.q.data(), w_bytes);
    std::memcpy(set.data() + w_scale_at, inputs_.weight.scale.data(), w_scale_bytes);
    buffers_ = std::make_unique<RotatingBuffers>(set.size(), 2.0, 1);
    buffers_->fill_from_host(set.data());

    out_ = Tensor::empty(p.out_dtype, {p.m, p.n}, p.device);
    for (int i = 0; i < buffers_->sets(); ++i) {
      auto* base = static_cast<std::uint8_t*>(buffers_->set(i));
      linear::LinearOperands ops;
      ops.a = base;
      ops.lda = lda;
      ops.a_scale = reinterpret_cast<const float*>(base + a_scale_at);
      ops.a_scale_row_stride = 1;
      ops.a_scale_group_stride = scale_ld;
      ops.w = base + w_at;
      ops.ldw = p.k;
      ops.w_scale = reinterpret_cast<const float*>(base + w_scale_at);
      ops.w_scale_ld = inputs_.weight.col_blocks();
      ops.out = out_.data();
      ops.ldo = p.n;
      ops.stream = nullptr;  // the legacy default stream, which the CUDA event timer records on
      operands_.push_back(ops);
    }
    // The dispatch rule's choice, once (null when nothing supports the problem: "auto" then
    // fails its check with the dispatch's error).
    const linear::Explanation explanation = linear::explain(p, "auto");
    dispatch_choice_ = explanation.chosen;
  }

  void run(const Tactic& tactic) override {
    tactic.run(TunedLinearArgs{&operands_[current_], &inputs_.problem, dispatch_choice_});
    current_ = (current_ + 1) % operands_.size();
  }

  CheckResult check(const Tactic& tactic) override {
    MXQ_CUDA_CHECK(cudaMemset(out_.data(), 0xFF, out_.nbytes()));  // NaN poison
    run(tactic);
    // Synchronous: a kernel fault surfaces here, charged to this tactic.
    MXQ_CUDA_CHECK(cudaDeviceSynchronize());
    const Tensor host = out_.to(Device::cpu());
    return linear::internal::check_output(host.data(), host.dtype(), inputs_);
  }

 private:
  linear::internal::TuneInputs inputs_;
  std::unique_ptr<RotatingBuffers> buffers_;
  Tensor out_;
  std::vector<linear::LinearOperands> operands_;
  std::size_t current_ = 0;
  const linear::LinearTactic* dispatch_choice_ = nullptr;
};

}  // namespace

void register_block_fp8_linear_cuda_autotune(TacticRegistry& registry) {
  OpSpec op;
  op.name = std::string(linear::kBlockFp8LinearOp);
  op.backend = Backend::kCuda;
  op.description = "block-FP8 linear y = x W^T (DeepSeek-V3 blocks), CUDA tactics";
  op.buckets = power_of_two_buckets(4096);
  op.default_tactic = "auto";
  op.make_workload = [](const Problem& problem, std::int64_t tokens) {
    return std::make_unique<CudaLinearWorkload>(problem, tokens);
  };
  registry.add_op(std::move(op));
  registry.add_tactic(linear::internal::dispatch_rule_tactic(Backend::kCuda));
  for (const auto& tactic : linear::linear_tactics()) {
    if (!tactic->name().starts_with("cuda.")) continue;
    registry.add_tactic(linear::internal::adopt_tactic(*tactic, Backend::kCuda, registry,
                                                       &current_cuda_device, true));
  }
}

}  // namespace mxq::tune
