// The linear op's API on the CPU: in-op quantization equals pre-quantization, UE8M0 scales
// (fp32 powers of two or packed) give identical results, bias, and the boundary errors.
#include "mxq/linear/linear.h"

#include <gtest/gtest.h>

#include <cstring>

#include "linear/linear_test_support.h"
#include "mxq/formats/ue8m0_pack.h"
#include "mxq/linear/dispatch.h"

namespace mxq::linear {
namespace {

using testing::code_of;
using testing::compare;
using testing::message_of;
using testing::random_bf16;
using testing::random_f32;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(Linear, QuantizesInsideTheOpLikeTheHostQuantizer) {
  for (const ScaleMode mode : {ScaleMode::kFp32, ScaleMode::kUe8m0}) {
    const Tensor x = random_bf16(5, 300, 11);
    const BlockFp8Weight w = quantize_weight(random_f32(70, 300, 12), BlockShape{64, 128});
    LinearOptions options;
    options.activation_scales = mode;
    const Tensor y = linear(x, w, nullptr, options);
    const Tensor expected = linear_reference(quantize_fp8_groups(x, 128, mode), w);
    EXPECT_TRUE(same_bits(y, expected));
    EXPECT_EQ(y.shape(), (Shape{5, 70}));
    EXPECT_EQ(y.dtype(), DType::kBF16);
  }
}

TEST(Linear, Ue8m0ScalesGiveTheSameResultAsFp32PowersOfTwo) {
  const Tensor x = random_bf16(7, 384, 13);
  // Weight and activation scales rounded up to powers of two (UE8M0 mode), stored as f32.
  const BlockFp8Weight w_f32 =
      quantize_weight(random_f32(130, 384, 14), BlockShape{128, 128}, ScaleMode::kUe8m0);
  const Fp8BlockTensor x_f32 = quantize_fp8_groups(x, 128, ScaleMode::kUe8m0);
  // The same scales packed four per int32.
  const BlockFp8Weight w_packed = w_f32.with_packed_ue8m0_scales();
  ASSERT_EQ(w_packed.scale_layout(), ScaleLayout::kPackedUe8m0);
  ASSERT_EQ(w_packed.scale.shape(), (Shape{1, 4}));  // ceil(3/4) words x round_up(2, 4) rows
  const Fp8BlockTensor x_packed{x_f32.q, pack_ue8m0(x_f32.scale), x_f32.block};

  for (const char* tactic : {"cpu.reference", "cpu.blocked_f32.n64"}) {
    LinearOptions options;
    options.tactic = tactic;
    const Tensor base = linear(x_f32, w_f32, nullptr, options);
    EXPECT_TRUE(same_bits(linear(x_f32, w_packed, nullptr, options), base)) << tactic;
    EXPECT_TRUE(same_bits(linear(x_packed, w_f32, nullptr, options), base)) << tactic;
    EXPECT_TRUE(same_bits(linear(x_packed, w_packed, nullptr, options), base)) << tactic;
  }
  // Unpacking restores the exact fp32 scales.
  EXPECT_TRUE(same_bits(w_packed.with_fp32_scales().scale, w_f32.scale));
  // In-op UE8M0 quantization with a packed weight equals the fp32 path too.
  LinearOptions ue8m0;
  ue8m0.activation_scales = ScaleMode::kUe8m0;
  EXPECT_TRUE(same_bits(linear(x, w_packed, nullptr, ue8m0), linear(x, w_f32, nullptr, ue8m0)));
}

TEST(Linear, BiasIsAddedOnceInEitherDtype) {
  const Tensor x = random_bf16(3, 128, 15);
  const BlockFp8Weight w = quantize_weight(random_f32(32, 128, 16), BlockShape{32, 32});
  Tensor bias_f32 = Tensor::empty(DType::kF32, {32});
  Tensor bias_bf16 = Tensor::empty(DType::kBF16, {32});
  for (int n = 0; n < 32; ++n) {
    const float value = 0.5F * static_cast<float>(n) - 4.0F;  // exact in bf16
    bias_f32.data_as<float>()[n] = value;
    reinterpret_cast<std::uint16_t*>(bias_bf16.data())[n] = float_to_bf16(value);
  }
  LinearOptions f32_out;
  f32_out.out_dtype = DType::kF32;
  const Tensor plain = linear(x, w, nullptr, f32_out);
  const Tensor with_f32 = linear(x, w, &bias_f32.view(), f32_out);
  const Tensor with_bf16 = linear(x, w, &bias_bf16.view(), f32_out);
  EXPECT_TRUE(same_bits(with_f32, with_bf16));
  for (int m = 0; m < 3; ++m) {
    for (int n = 0; n < 32; ++n) {
      const float expected = plain.data_as<float>()[m * 32 + n] + bias_f32.data_as<float>()[n];
      EXPECT_NEAR(with_f32.data_as<float>()[m * 32 + n], expected,
                  1e-5F * std::fabs(expected) + 1e-6F);
    }
  }
}

TEST(Linear, MismatchedKIsAnErrorNamingBothShapes) {
  const BlockFp8Weight w = quantize_weight(random_f32(64, 256, 17), BlockShape{128, 128});
  const Tensor x = random_bf16(2, 200, 18);
  const std::string message = message_of([&] { (void)linear(x, w); });
  EXPECT_NE(
      message.find("x: expected K = 256 columns (the weight is [64, 256]), found 200 columns"),
      std::string::npos)
      << message;
  EXPECT_EQ(code_of([&] { (void)linear(x, w); }), ErrorCode::kShapeMismatch);
}

TEST(Linear, ScaleTensorOfTheWrongShapeIsRejected) {
  const Fp8BlockTensor q = quantize_fp8_block(random_f32(130, 256, 19), BlockShape{128, 128});
  // Scales for 64x64 blocks do not fit 128x128 blocks.
  const Tensor wrong = Tensor::zeros(DType::kF32, {3, 4});
  const std::string message = message_of([&] {
    (void)make_block_fp8_weight(q.q, wrong, BlockShape{128, 128});
  });
  EXPECT_NE(message.find("weight.scale: expected f32 [2, 2]"), std::string::npos) << message;
  EXPECT_NE(message.find("found f32 [3, 4]"), std::string::npos) << message;
  EXPECT_EQ(code_of([&] {
              (void)make_block_fp8_weight(q.q, wrong, BlockShape{128, 128});
            }),
            ErrorCode::kShapeMismatch);
  // A packed scale tensor of the wrong shape, and scales of another dtype.
  EXPECT_EQ(code_of([&] {
              (void)make_block_fp8_weight(q.q, Tensor::zeros(DType::kI32, {1, 2}), {128, 128});
            }),
            ErrorCode::kShapeMismatch);
  EXPECT_EQ(code_of([&] {
              (void)make_block_fp8_weight(q.q, Tensor::zeros(DType::kU8, {2, 2}), {128, 128});
            }),
            ErrorCode::kDtypeMismatch);
  // Pre-quantized activations with scales of the wrong shape.
  const BlockFp8Weight w = make_block_fp8_weight(q.q, q.scale, BlockShape{128, 128});
  const Fp8BlockTensor x = quantize_fp8_groups(random_bf16(4, 256, 20), 128);
  const Fp8BlockTensor bad_x{x.q, Tensor::zeros(DType::kF32, {4, 3}), x.block};
  EXPECT_EQ(code_of([&] { (void)linear(bad_x, w); }), ErrorCode::kShapeMismatch);
  const Fp8BlockTensor other_groups = quantize_fp8_groups(random_bf16(4, 256, 20), 64);
  const std::string groups = message_of([&] { (void)linear(other_groups, w); });
  EXPECT_NE(groups.find("x.block: expected 1x128"), std::string::npos) << groups;
}

TEST(Linear, BadArgumentsAreNamed) {
  const BlockFp8Weight w = quantize_weight(random_f32(64, 128, 21), BlockShape{64, 64});
  const Tensor x_f32 = random_f32(2, 128, 22);
  EXPECT_NE(message_of([&] { (void)linear(x_f32, w); }).find("x: expected bf16, found f32"),
            std::string::npos);
  const Tensor x = random_bf16(2, 128, 23);
  const Tensor bias = Tensor::zeros(DType::kF32, {63});
  EXPECT_NE(message_of([&] { (void)linear(x, w, &bias.view()); }).find("bias: expected [64]"),
            std::string::npos);
  LinearOptions f16;
  f16.out_dtype = DType::kF16;
  EXPECT_EQ(code_of([&] { (void)linear(x, w, nullptr, f16); }), ErrorCode::kDtypeMismatch);
  const Tensor empty_rows = Tensor::empty(DType::kBF16, {0, 128});
  EXPECT_EQ(code_of([&] { (void)linear(empty_rows, w); }), ErrorCode::kShapeMismatch);
  LinearOptions unknown;
  unknown.tactic = "no-such-tactic";
  EXPECT_EQ(code_of([&] { (void)linear(x, w, nullptr, unknown); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              (void)make_block_fp8_weight(w.q, w.scale, BlockShape{0, 64});
            }),
            ErrorCode::kInvalidArgument);
}

TEST(Linear, AnyBlockShapeRunsOnTheCpu) {
  // Blocks that are not multiples of 16 have no CUDA tactic but the CPU takes them.
  const Tensor x = random_bf16(3, 100, 24);
  const BlockFp8Weight w = quantize_weight(random_f32(50, 100, 25), BlockShape{10, 30});
  const Fp8BlockTensor xq = quantize_fp8_groups(x, 30);
  LinearOptions blocked;
  blocked.tactic = "cpu.blocked_f32.n16";
  EXPECT_LE(compare(linear(x, w, nullptr, blocked), linear_reference(xq, w)).normalized_error,
            4e-3);
}

TEST(Linear, ProblemDescribesTheCall) {
  const BlockFp8Weight w = quantize_weight(random_f32(64, 256, 26), BlockShape{128, 128});
  const Tensor x = random_bf16(9, 256, 27);
  const LinearProblem p = make_problem(x, w, nullptr);
  EXPECT_EQ(p.m, 9);
  EXPECT_EQ(p.n, 64);
  EXPECT_EQ(p.k, 256);
  EXPECT_EQ(p.block, (BlockShape{128, 128}));
  EXPECT_TRUE(p.device.is_cpu());
  EXPECT_EQ(p.str(), "M=9 N=64 K=256 block=128x128 w-scales=fp32 a-scales=fp32 out=bf16 cpu");
}

}  // namespace
}  // namespace mxq::linear
