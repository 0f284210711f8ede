// Every CUDA tactic against the CPU reference on identical quantized inputs (outputs poisoned
// with NaN first, so an element a kernel fails to write is caught), over shapes with M = 1,
// ragged N and K, and every block shape; the device activation quantizer bit-exact against the
// host quantizer; the op end to end; UE8M0 scales packed or not giving identical bits.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "linear/linear_test_support.h"
#include "mxq/core/cuda_check.h"
#include "mxq/formats/ue8m0_pack.h"
#include "mxq/linear/dispatch.h"
#include "mxq/linear/linear.h"

namespace mxq::linear {
namespace {

using testing::compare;
using testing::random_bf16;
using testing::random_f32;

constexpr double kMaxNormalizedError = 4e-3;  // DESIGN.md, "Numbers and tests"
const Device kGpu = Device::cuda(0);

Tensor to_gpu(const Tensor& t) { return t.to(kGpu); }
Fp8BlockTensor to_gpu(const Fp8BlockTensor& t) {
  return Fp8BlockTensor{to_gpu(t.q), to_gpu(t.scale), t.block};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() &&
         std::memcmp(ha.data(), hb.data(), ha.nbytes()) == 0;
}

// An output tensor on the GPU filled with NaN (0xFF bytes are NaN in bf16 and f32).
Tensor poisoned_output(std::int64_t m, std::int64_t n, DType dtype) {
  Tensor out = Tensor::empty(dtype, {m, n}, kGpu);
  MXQ_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.nbytes()));
  return out;
}

// Where `out` departs from `ref` (both [M, N]): the first elements off by more than 5% of the
// reference's RMS, to tell a layout bug (rows, columns, tiles) from a precision problem.
std::string describe_mismatch(const Tensor& out, const Tensor& ref) {
  const std::vector<double> a = testing::values_of(out);
  const std::vector<double> b = testing::values_of(ref);
  const std::int64_t cols = ref.shape()[1];
  double rms = 0.0;
  for (const double v : b) rms += v * v;
  rms = std::sqrt(rms / static_cast<double>(std::max<std::size_t>(b.size(), 1)));
  std::ostringstream text;
  int shown = 0;
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= 0.05 * rms)) {
      ++bad;
      if (shown++ < 6) {
        text << " (m=" << static_cast<std::int64_t>(i) / cols
             << ", n=" << static_cast<std::int64_t>(i) % cols << ": got " << a[i] << ", want "
             << b[i] << ")";
      }
    }
  }
  return std::to_string(bad) + " elements off by > 5% of RMS" + text.str();
}

struct Case {
  std::int64_t m, n, k;
  BlockShape block;
  bool with_bias;
};

std::string describe(const Case& c) {
  std::ostringstream out;
  out << "M=" << c.m << " N=" << c.n << " K=" << c.k << " block=" << c.block
      << (c.with_bias ? " bias" : "");
  return out.str();
}

class EveryCudaTactic : public ::testing::TestWithParam<Case> {};

TEST_P(EveryCudaTactic, MatchesTheReferenceOnIdenticalInputs) {
  const Case c = GetParam();
  const Tensor x = random_bf16(c.m, c.k, 101);
  const BlockFp8Weight w_host = quantize_weight(random_f32(c.n, c.k, 102), c.block);
  const Fp8BlockTensor x_host = quantize_fp8_groups(x, c.block.k);
  Tensor bias_host = Tensor::empty(DType::kBF16, {c.n});
  for (std::int64_t n = 0; n < c.n; ++n) {
    reinterpret_cast<std::uint16_t*>(bias_host.data())[n] =
        float_to_bf16(0.125F * static_cast<float>(n % 13) - 0.75F);
  }
  const TensorView* bias = c.with_bias ? &bias_host.view() : nullptr;
  const Tensor reference_bf16 = linear_reference(x_host, w_host, bias, DType::kBF16);
  const Tensor reference_f32 = linear_reference(x_host, w_host, bias, DType::kF32);

  const Fp8BlockTensor x_gpu = to_gpu(x_host);
  const BlockFp8Weight w_gpu = w_host.to(kGpu);
  const Tensor bias_gpu = to_gpu(bias_host);
  const TensorView* bias_dev = c.with_bias ? &bias_gpu.view() : nullptr;

  int ran = 0;
  int ran_fast = 0;
  int ran_wgmma_fallback = 0;
  for (const DType out_dtype : {DType::kBF16, DType::kF32}) {
    LinearOptions options;
    options.out_dtype = out_dtype;
    const Tensor out = poisoned_output(c.m, c.n, out_dtype);
    const PreparedLinear prepared = prepare_linear(x_gpu, w_gpu, bias_dev, out, options);
    for (const auto& tactic : linear_tactics()) {
      if (!prepared.problem.device.is_cuda() || !tactic->supports(prepared.problem)) continue;
      MXQ_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.nbytes()));
      tactic->run(prepared.operands, prepared.problem);
      MXQ_CUDA_CHECK(cudaDeviceSynchronize());
      const auto result = compare(out, out_dtype == DType::kBF16 ? reference_bf16 : reference_f32);
      EXPECT_LE(result.normalized_error, kMaxNormalizedError)
          << tactic->name() << " " << describe(c) << " out=" << out_dtype << ": "
          << describe_mismatch(out, out_dtype == DType::kBF16 ? reference_bf16 : reference_f32);
      EXPECT_EQ(result.nan_mismatches, 0)
          << tactic->name() << " " << describe(c) << " out=" << out_dtype
          << ": first unwritten or NaN element " << result.first_bad;
      ++ran;
      if (tactic->kind() == TacticKind::kFast) ++ran_fast;
      if (tactic->name().starts_with("cuda.sm90_wgmma_any.")) ++ran_wgmma_fallback;
    }
  }
  EXPECT_GT(ran, 0) << "no CUDA tactic supports " << describe(c);
  const bool fast_eligible = c.block == BlockShape{128, 128} && c.k % 128 == 0 && c.n % 16 == 0;
  EXPECT_EQ(ran_fast > 0, fast_eligible) << describe(c);
  const bool wgmma_fallback_eligible = (c.block.k == 64 || c.block.k == 128) &&
                                       c.block.n % 64 == 0 && c.k % 16 == 0 && c.n % 16 == 0;
  EXPECT_EQ(ran_wgmma_fallback > 0, wgmma_fallback_eligible) << describe(c);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EveryCudaTactic,
    ::testing::Values(
        // Smallest first: one tile and one K-block (the data path), then several K-blocks (the
        // pipeline), so a failure points at its cause.
        Case{64, 128, 128, {128, 128}, false}, Case{128, 128, 128, {128, 128}, false},
        Case{64, 128, 1024, {128, 128}, false},
        // The fast path's layout: M = 1, ragged M, N % 16 == 0 but not a tile multiple.
        Case{1, 256, 512, {128, 128}, false}, Case{3, 144, 384, {128, 128}, true},
        Case{130, 400, 1024, {128, 128}, false}, Case{64, 2112, 256, {128, 128}, true},
        // More tiles than SMs (the persistent loop) and more K-blocks than pipeline stages.
        Case{1040, 2048, 2048, {128, 128}, false},
        // 128x128 blocks the fast path refuses: K not a multiple of 128 (nor of 16), N odd.
        Case{5, 256, 1000, {128, 128}, false}, Case{17, 131, 384, {128, 128}, true},
        Case{2, 200, 200, {128, 128}, false},
        // Every other block shape, with ragged N and K.
        Case{1, 100, 192, {64, 64}, false}, Case{77, 300, 640, {64, 64}, true},
        Case{9, 70, 96, {32, 32}, false}, Case{200, 257, 160, {32, 32}, true},
        Case{33, 250, 512, {128, 64}, false}, Case{1, 130, 300, {128, 64}, true},
        Case{16, 520, 768, {256, 128}, false}, Case{300, 300, 260, {256, 128}, true},
        Case{12, 40, 80, {16, 48}, false}, Case{129, 96, 176, {48, 16}, false},
        // The wgmma fallback (K, N multiples of 16): two 64-wide block rows under a 128-wide
        // tile, the last tile's second row past N (clamped), an odd count of 64-wide K blocks
        // (the last stage's second unit past K), 128x64 and 64x128 blocks, ragged K with 128x128
        // blocks, wide blocks, and more tiles than SMs.
        Case{1, 208, 1088, {64, 64}, true}, Case{130, 400, 640, {64, 64}, true},
        Case{64, 256, 1024, {128, 64}, false}, Case{70, 192, 384, {64, 128}, true},
        Case{5, 256, 1040, {128, 128}, false}, Case{9, 512, 576, {256, 128}, false},
        Case{1040, 2048, 2048, {64, 64}, false}));

TEST(QuantizeActivationsOnGpu, BitExactWithTheHostQuantizer) {
  struct Shape2 {
    std::int64_t m, k, group;
  };
  for (const Shape2 s : {Shape2{1, 128, 128}, Shape2{7, 1000, 128}, Shape2{130, 200, 64},
                         Shape2{5, 1001, 128}, Shape2{3, 96, 48}, Shape2{2, 30, 16}}) {
    for (const ScaleMode mode : {ScaleMode::kFp32, ScaleMode::kUe8m0}) {
      Tensor x = random_bf16(s.m, s.k, 103);
      auto* bits = reinterpret_cast<std::uint16_t*>(x.data());
      bits[0] = 0x7FC0;                     // NaN: its group's scale and codes become NaN
      if (s.k > 2) bits[s.k - 1] = 0x0000;  // a zero
      const Fp8BlockTensor host = quantize_fp8_groups(x, s.group, mode);
      const Fp8BlockTensor device = quantize_activations(to_gpu(x), s.group, mode);
      MXQ_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(same_bits(device.q, host.q)) << "codes, M=" << s.m << " K=" << s.k;
      EXPECT_TRUE(same_bits(device.scale, host.scale)) << "scales, M=" << s.m << " K=" << s.k;
    }
  }
}

TEST(LinearOnGpu, EndToEndMatchesTheCpu) {
  for (const BlockShape block : {BlockShape{128, 128}, BlockShape{64, 64}}) {
    for (const std::int64_t m : {1, 37, 256}) {
      const Tensor x = random_bf16(m, 1024, 104);
      const BlockFp8Weight w = quantize_weight(random_f32(512, 1024, 105), block);
      Tensor bias = Tensor::empty(DType::kF32, {512});
      for (int n = 0; n < 512; ++n) bias.data_as<float>()[n] = 0.01F * static_cast<float>(n);
      const Tensor cpu = linear(x, w, &bias.view());
      const Tensor gpu_bias = to_gpu(bias);
      const Tensor gpu = linear(to_gpu(x), w.to(kGpu), &gpu_bias.view());
      MXQ_CUDA_CHECK(cudaDeviceSynchronize());
      const auto result = compare(gpu, cpu);
      EXPECT_LE(result.normalized_error, kMaxNormalizedError) << "block " << block << " M=" << m;
      EXPECT_EQ(result.nan_mismatches, 0);
    }
  }
}

TEST(LinearOnGpu, TheFastPathIsChosenOnThisGpuForDeepSeekBlocks) {
  const Tensor x = to_gpu(random_bf16(64, 512, 106));
  const BlockFp8Weight w =
      quantize_weight(random_f32(256, 512, 107), BlockShape{128, 128}).to(kGpu);
  const LinearProblem problem = make_problem(x, w, nullptr);
  if (problem.sm != 90) GTEST_SKIP() << "not an sm_90 GPU: " << problem.str();
  const Explanation e = explain(problem);
  ASSERT_NE(e.chosen, nullptr) << e.str();
  EXPECT_EQ(e.chosen->kind(), TacticKind::kFast) << e.str();
  const BlockFp8Weight w64 =
      quantize_weight(random_f32(256, 512, 107), BlockShape{64, 64}).to(kGpu);
  EXPECT_EQ(explain(make_problem(x, w64, nullptr)).chosen->kind(), TacticKind::kFallback);
}

TEST(LinearOnGpu, PackedUe8m0ScalesGiveIdenticalBits) {
  const Tensor x = random_bf16(19, 768, 108);
  const BlockFp8Weight w =
      quantize_weight(random_f32(272, 768, 109), BlockShape{128, 128}, ScaleMode::kUe8m0);
  const Fp8BlockTensor xq = quantize_fp8_groups(x, 128, ScaleMode::kUe8m0);
  const Fp8BlockTensor xq_packed{xq.q, pack_ue8m0(xq.scale), xq.block};
  const BlockFp8Weight w_packed = w.with_packed_ue8m0_scales();
  for (const char* tactic : {"fast", "fallback"}) {
    LinearOptions options;
    options.tactic = tactic;
    const Tensor base = linear(to_gpu(xq), w.to(kGpu), nullptr, options);
    const Tensor packed = linear(to_gpu(xq_packed), w_packed.to(kGpu), nullptr, options);
    MXQ_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(base, packed)) << tactic;
    // The device unpacking of the weight's scales is exact.
    EXPECT_TRUE(same_bits(w_packed.to(kGpu).with_fp32_scales().scale, w.scale)) << tactic;
  }
}

TEST(LinearOnGpu, BlocksNotAMultipleOf16AreRefusedWithTheReason) {
  const Tensor x = to_gpu(random_bf16(4, 256, 112));
  const BlockFp8Weight w =
      quantize_weight(random_f32(100, 256, 113), BlockShape{100, 128}).to(kGpu);
  const std::string message = testing::message_of([&] { (void)linear(x, w); });
  EXPECT_NE(message.find("needs block extents that are multiples of 16; the block is 100x128"),
            std::string::npos)
      << message;
  EXPECT_EQ(testing::code_of([&] { (void)linear(x, w); }), ErrorCode::kUnsupported);
}

TEST(LinearOnGpu, AnUnsupportedTacticIsNeverRun) {
  const Fp8BlockTensor x = to_gpu(quantize_fp8_groups(random_bf16(4, 256, 110), 64));
  const BlockFp8Weight w = quantize_weight(random_f32(64, 256, 111), BlockShape{64, 64}).to(kGpu);
  const Tensor out = poisoned_output(4, 64, DType::kBF16);
  const PreparedLinear prepared = prepare_linear(x, w, nullptr, out);
  const LinearTactic* fast = find_tactic("cuda.sm90_wgmma.m128n128");
  ASSERT_NE(fast, nullptr);
  EXPECT_EQ(testing::code_of([&] { fast->run(prepared.operands, prepared.problem); }),
            ErrorCode::kUnsupported);
  LinearOptions forced;
  forced.tactic = "cuda.sm90_wgmma.m128n128";
  EXPECT_EQ(testing::code_of([&] { (void)linear(x, w, nullptr, forced); }),
            ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace mxq::linear
