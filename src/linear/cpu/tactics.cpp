// The CPU tactics of the linear op: the fp64 reference and the blocked fp32 alternative.
#include "linear/cpu/tactics.h"

#include "linear/cpu/block_fp8_linear.h"
#include "mxq/core/error.h"

namespace mxq::linear::internal {
namespace {

Support cpu_checks(const LinearProblem& p) {
  if (!p.device.is_cpu()) {
    return Support::no(detail::concat("runs on the CPU; the problem is on ", p.device));
  }
  if (p.m < 1 || p.n < 1 || p.k < 1) {
    return Support::no(detail::concat("needs M, N, K >= 1; found M=", p.m, " N=", p.n, " K=", p.k));
  }
  if (p.block.n < 1 || p.block.k < 1) {
    return Support::no("needs positive block extents; the block is " + to_string(p.block));
  }
  if (p.out_dtype != DType::kBF16 && p.out_dtype != DType::kF32) {
    return Support::no(detail::concat("needs bf16 or f32 output; the output is ", p.out_dtype));
  }
  return Support::yes();
}

class ReferenceTactic final : public LinearTactic {
 public:
  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] TacticKind kind() const override { return TacticKind::kReference; }
  [[nodiscard]] TacticParams params() const override { return {}; }
  [[nodiscard]] Support check(const LinearProblem& p) const override { return cpu_checks(p); }

 protected:
  void run_supported(const LinearOperands& ops, const LinearProblem& p) const override {
    cpu::linear_reference(ops, p);
  }

 private:
  std::string name_ = "cpu.reference";
};

class BlockedF32Tactic final : public LinearTactic {
 public:
  explicit BlockedF32Tactic(int tile_n)
      : tile_n_(tile_n), name_("cpu.blocked_f32.n" + std::to_string(tile_n)) {}
  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] TacticKind kind() const override { return TacticKind::kFallback; }
  [[nodiscard]] TacticParams params() const override { return {{"tile_n", tile_n_}}; }
  [[nodiscard]] Support check(const LinearProblem& p) const override { return cpu_checks(p); }

 protected:
  void run_supported(const LinearOperands& ops, const LinearProblem& p) const override {
    cpu::linear_blocked_f32(ops, p, tile_n_);
  }

 private:
  int tile_n_;
  std::string name_;
};

}  // namespace

void append_cpu_tactics(std::vector<std::unique_ptr<LinearTactic>>& tactics) {
  tactics.push_back(std::make_unique<BlockedF32Tactic>(64));
  tactics.push_back(std::make_unique<BlockedF32Tactic>(16));
  tactics.push_back(std::make_unique<ReferenceTactic>());
}

}  // namespace mxq::linear::internal
