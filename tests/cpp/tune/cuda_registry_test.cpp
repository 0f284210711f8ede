// The CUDA tactics in the built-in registry (builds with CUDA; checked without a GPU, since
// registering touches no device): block_fp8_linear adopts every cuda.* linear tactic, each
// mapping back to its linear tactic, with the dispatch rule "auto" as the predicate-free default;
// moe_gpu_forward offers the two GEMM variants with decode_mma as the default. Timing and
// checking them needs a GPU: tests/cpp/tune/cuda_tactics_gpu_test.cu.
#include <gtest/gtest.h>

#include <any>
#include <set>
#include <string>

#include "mxq/linear/dispatch.h"
#include "mxq/linear/tune.h"
#include "mxq/moe/tune.h"
#include "mxq/tune/registry.h"

namespace mxq::tune {
namespace {

using linear::kBlockFp8LinearOp;
using moe::kMoeGpuForwardOp;
using moe::moe_gpu_forward_problem;
using moe::MoeGpuForwardShape;

TEST(CudaRegistry, BlockFp8LinearAdoptsEveryCudaLinearTactic) {
#if !MXQ_WITH_CUDA
  GTEST_SKIP() << "built without CUDA: no CUDA tactics are registered";
#else
  const OpSpec* op = builtin_tactics().find_op(kBlockFp8LinearOp, Backend::kCuda);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->default_tactic, "auto");
  const Tactic& fallback = builtin_tactics().default_tactic(*op);
  EXPECT_FALSE(fallback.supports_fn) << "the default must support every problem";
  EXPECT_TRUE(fallback.tokens.full());
  const auto* rule = std::any_cast<const linear::LinearTactic*>(&fallback.native);
  ASSERT_NE(rule, nullptr);
  EXPECT_EQ(*rule, nullptr) << "auto maps to the dispatch rule, not to one tactic";

  std::set<const linear::LinearTactic*> adopted;
  std::set<std::string> ids;
  for (const Tactic* t : builtin_tactics().tactics(*op)) {
    EXPECT_TRUE(ids.insert(t->id()).second) << t->id();
    const auto* native = std::any_cast<const linear::LinearTactic*>(&t->native);
    ASSERT_NE(native, nullptr) << t->id();
    if (*native == nullptr) continue;
    EXPECT_TRUE((*native)->name().starts_with("cuda.")) << (*native)->name();
    EXPECT_TRUE(t->supports_fn) << t->id();
    EXPECT_TRUE((*native)->name().find(t->variant.substr(0, t->variant.find('.'))) !=
                std::string::npos)
        << t->id() << " adopts " << (*native)->name();
    adopted.insert(*native);
  }
  std::size_t cuda_tactics = 0;
  for (const auto& tactic : linear::linear_tactics()) {
    if (!tactic->name().starts_with("cuda.")) continue;
    ++cuda_tactics;
    EXPECT_EQ(adopted.count(tactic.get()), 1U) << tactic->name() << " is not adopted";
  }
  EXPECT_GT(cuda_tactics, 0U);
  EXPECT_EQ(adopted.size(), cuda_tactics);
#endif
}

TEST(CudaRegistry, MoeGpuForwardOffersBothGemmVariants) {
#if !MXQ_WITH_CUDA
  GTEST_SKIP() << "built without CUDA: no CUDA tactics are registered";
#else
  const OpSpec* op = builtin_tactics().find_op(kMoeGpuForwardOp, Backend::kCuda);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->default_tactic, "decode_mma");
  std::set<std::string> ids;
  for (const Tactic* t : builtin_tactics().tactics(*op)) {
    ids.insert(t->id());
    EXPECT_TRUE(t->native.has_value()) << t->id();
  }
  EXPECT_EQ(ids, (std::set<std::string>{"decode_mma", "prefill_wgmma"}));
  // The other variant's predicate is the kernels' own (top-k at most 8); it needs no device.
  {
    const Tactic* tactic =
        builtin_tactics().find_tactic(kMoeGpuForwardOp, Backend::kCuda, "prefill_wgmma");
    ASSERT_NE(tactic, nullptr);
    MoeGpuForwardShape shape;
    shape.experts = 32;
    shape.experts_local = 32;
    shape.hidden = 2880;
    shape.intermediate_valid = 2880;
    shape.intermediate_after_pad = 2944;
    shape.top_k = 4;
    EXPECT_TRUE(tactic->supports(moe_gpu_forward_problem(shape)).ok);
    shape.activation_quant = moe::ActivationQuant::kFp8Group128;  // W4A8 runs it too
    EXPECT_TRUE(tactic->supports(moe_gpu_forward_problem(shape)).ok);
    shape.top_k = 9;
    const Support nine = tactic->supports(moe_gpu_forward_problem(shape));
    EXPECT_FALSE(nine.ok);
    EXPECT_NE(nine.reason.find("top-k"), std::string::npos) << nine.reason;
  }
#endif
}

}  // namespace
}  // namespace mxq::tune
