// Every CUDA tactic against the CPU reference on identical quantized inputs (outputs poisoned
// with NaN first, so an element a kernel fails to write is caught), over shapes with M = 1,
// ragged N and K, and every block shape; the device activation quantizer bit-exact against the
// host quantizer; the op end to end; UE8M0 scales packed or not giving identical bits; and
// linear_into, the op as engines call it: every activation input form into the caller's output
// within a workspace of exactly the advertised size, captured in a CUDA graph (global capture
// mode, so an allocation or a synchronization inside fails the capture; the graph holds kernel
// nodes only) and replayed bit for bit, and bad arguments refused before any kernel runs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "linear/cuda/launch.h"
#include "linear/linear_test_support.h"
#include "mxq/core/cuda_check.h"
#include "mxq/formats/bf16.h"
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
        // Split K: 13 K-blocks over 2 and 4 blocks (shares of 6/7 and 3/3/3/4), ragged M, and a
        // last tile whose split column parts lie partly or wholly past N.
        Case{37, 528, 1664, {128, 128}, true},
        // 256-row tiles: ragged M, an odd count of 128-wide tiles along N (a cluster's second
        // tile past N) and more clusters' work than fit at once.
        Case{2100, 2112, 512, {128, 128}, true},
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
        Case{1040, 2048, 2048, {64, 64}, false},
        // Long K: 72 K-blocks (split K starts its second block's share at 36), and 65 64-deep
        // blocks over two 64-wide block rows.
        Case{3, 256, 9216, {128, 128}, false}, Case{20, 192, 4160, {64, 64}, true}));

// Activations like a model's after a norm: most channels small, one in 37 thirty times larger,
// at the linear shapes of the tiny DeepSeek-V3 model (M = 24 tokens). The FP8 wgmma keeps about
// 14 bits of its sum inside a K block (DeepSeek-V3's report), so large and small products in one
// block lose the small ones' low bits: on an H100 the wgmma tactics came out 6e-4 to 1.1e-3 from
// the fp64 reference here (bf16 out), about the same when promoted every 64 of K instead of 128,
// and bit-identical to cuBLASLt on the bench's points, while mma.sync's sum is exact (5e-8 with
// fp32 out). Every CUDA tactic against the CPU reference; the errors go to the log.
TEST(LinearOnGpu, EveryTacticStaysWithinTheToleranceOnOutlierActivations) {
  struct Shape2 {
    std::int64_t n, k;
  };
  // Weight blocks 128 deep along K (the fast path), 64 deep (the wgmma fallback then promotes
  // every 64 of K) and 32 deep (mma.sync only): how the error depends on how often the tensor
  // cores' sum is promoted to fp32. fp32 output (mma.sync only) shows the accumulation's error
  // alone.
  for (const BlockShape block : {BlockShape{128, 128}, BlockShape{128, 64}, BlockShape{128, 32}}) {
    for (const Shape2 s : {Shape2{192, 128}, Shape2{128, 256}, Shape2{320, 128}, Shape2{384, 256},
                           Shape2{256, 384}, Shape2{2112, 7168}}) {
      constexpr std::int64_t kM = 24;
      Tensor x = random_bf16(kM, s.k, 121);
      auto* bits = reinterpret_cast<std::uint16_t*>(x.data());
      for (std::int64_t i = 0; i < kM * s.k; ++i) {
        if ((i % s.k) % 37 == 5) bits[i] = float_to_bf16(30.0F * bf16_to_float(bits[i]));
      }
      const BlockFp8Weight w_host = quantize_weight(random_f32(s.n, s.k, 122), block);
      const Fp8BlockTensor x_host = quantize_fp8_groups(x, block.k);
      const Fp8BlockTensor x_gpu = to_gpu(x_host);
      const BlockFp8Weight w_gpu = w_host.to(kGpu);
      for (const DType out_dtype : {DType::kBF16, DType::kF32}) {
        const Tensor reference = linear_reference(x_host, w_host, nullptr, out_dtype);
        const Tensor out = poisoned_output(kM, s.n, out_dtype);
        LinearOptions options;
        options.out_dtype = out_dtype;
        const PreparedLinear prepared = prepare_linear(x_gpu, w_gpu, nullptr, out, options);
        for (const auto& tactic : linear_tactics()) {
          if (!tactic->supports(prepared.problem)) continue;
          MXQ_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.nbytes()));
          tactic->run(prepared.operands, prepared.problem);
          MXQ_CUDA_CHECK(cudaDeviceSynchronize());
          const auto result = compare(out, reference);
          std::cout << "[ error ] block " << block.n << "x" << block.k << " "
                    << (out_dtype == DType::kBF16 ? "bf16" : "f32") << " N=" << s.n << " K=" << s.k
                    << " " << tactic->name() << ": " << result.normalized_error << "\n";
          EXPECT_LE(result.normalized_error, kMaxNormalizedError)
              << tactic->name() << " N=" << s.n << " K=" << s.k;
        }
      }
    }
  }
}

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

// The persistent grid of every fast tile: at least one work unit fits and never more blocks than
// SMs (one block per SM). The counts go to the log: the 2026-12-06 H100 timings of the cluster
// tiles fit far fewer resident clusters than SMs allow (docs/perf-log/linear.md).
TEST(LinearOnGpu, EveryFastTileHasAPersistentGridWithinTheSms) {
  int device = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (const gpu::WgmmaShape& shape : gpu::kWgmmaShapes) {
    const long long units = gpu::resident_wgmma_units(shape);
    const long long blocks = units * shape.cluster * shape.split_k;
    EXPECT_GE(units, 1) << gpu::to_string(shape);
    EXPECT_LE(blocks, sms) << gpu::to_string(shape);
    std::cout << "[ resident ] " << gpu::to_string(shape) << ": " << units << " units, " << blocks
              << " blocks of " << sms << " SMs\n";
  }
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

// ---- linear_into: the op as engines call it ------------------------------------------------

// A device workspace of exactly `bytes` at the start of a larger buffer whose tail holds a
// sentinel: a write past the size linear_workspace_bytes gave shows.
class DeviceWorkspace {
 public:
  explicit DeviceWorkspace(std::size_t bytes)
      : bytes_(bytes),
        memory_(Tensor::empty(DType::kU8, {static_cast<std::int64_t>(bytes + kTail)}, kGpu)) {
    MXQ_CUDA_CHECK(cudaMemset(memory_.data(), 0xA5, memory_.nbytes()));
  }
  [[nodiscard]] TensorView view() const {
    return {memory_.data(), DType::kU8, Shape{static_cast<std::int64_t>(bytes_)}, kGpu};
  }
  // The sentinel past the workspace is intact.
  [[nodiscard]] bool tail_intact() const { return filled_from(bytes_); }
  // Nothing was written at all, the workspace included.
  [[nodiscard]] bool untouched() const { return filled_from(0); }

 private:
  static constexpr std::size_t kTail = 256;

  [[nodiscard]] bool filled_from(std::size_t begin) const {
    const Tensor host = memory_.to(Device::cpu());
    const auto* bytes = static_cast<const std::uint8_t*>(host.data());
    return std::all_of(bytes + begin, bytes + host.nbytes(),
                       [](std::uint8_t b) { return b == 0xA5; });
  }

  std::size_t bytes_;
  Tensor memory_;
};

// The activations of one case on the GPU in every form linear_into takes.
struct DeviceActivations {
  Tensor x;                  // bf16 [M, K]
  Tensor x_q;                // e4m3 [M, K]
  Tensor scale_rows;         // f32 [M, G] row-major
  Tensor scale_storage;      // f32 [G, ld]: the MN-major scales' memory
  TensorView scale_mn;       // f32 [M, G] view, element (m, g) at m + g * ld
  Tensor scale_packed;       // i32 packed UE8M0 [ceil(G/4), round_up(M, 4)]
  Tensor scale_wide;         // f32 [M, 2G]: the scales in its even columns
  TensorView scale_strided;  // f32 [M, G] view of them: neither row-major nor MN-major
};

// UE8M0 (power-of-two) scales, so that every form, packed included, holds the same values.
DeviceActivations device_activations(const Tensor& x_host, std::int64_t group_k,
                                     std::int64_t extra_ld) {
  const Fp8BlockTensor q = quantize_fp8_groups(x_host, group_k, ScaleMode::kUe8m0);
  const std::int64_t m = x_host.shape()[0];
  const std::int64_t groups = q.scale.shape()[1];
  const std::int64_t ld = (m + 3) / 4 * 4 + extra_ld;
  Tensor mn = Tensor::zeros(DType::kF32, {groups, ld});
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t g = 0; g < groups; ++g)
      mn.data_as<float>()[g * ld + r] = q.scale.data_as<float>()[r * groups + g];
  }
  DeviceActivations a;
  a.x = to_gpu(x_host);
  a.x_q = to_gpu(q.q);
  a.scale_rows = to_gpu(q.scale);
  a.scale_storage = to_gpu(mn);
  a.scale_mn =
      TensorView(a.scale_storage.data(), DType::kF32, Shape{m, groups}, Shape{1, ld}, kGpu);
  a.scale_packed = to_gpu(pack_ue8m0(q.scale));
  Tensor wide = Tensor::zeros(DType::kF32, {m, 2 * groups});
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t g = 0; g < groups; ++g)
      wide.data_as<float>()[r * 2 * groups + 2 * g] = q.scale.data_as<float>()[r * groups + g];
  }
  a.scale_wide = to_gpu(wide);
  a.scale_strided =
      TensorView(a.scale_wide.data(), DType::kF32, Shape{m, groups}, Shape{2 * groups, 2}, kGpu);
  return a;
}

constexpr ActivationInput kEveryInput[] = {ActivationInput::kBf16, ActivationInput::kFp8,
                                           ActivationInput::kFp8MnMajor,
                                           ActivationInput::kFp8PackedUe8m0};

// linear_into with the activations of `input`, on `stream`.
void call_linear_into(ActivationInput input, const DeviceActivations& a, const BlockFp8Weight& w,
                      const TensorView* bias, const TensorView& out, const TensorView& workspace,
                      LinearOptions options, cudaStream_t stream) {
  options.stream = stream;
  switch (input) {
    case ActivationInput::kBf16:
      return linear_into(a.x, w, bias, out, workspace, options);
    case ActivationInput::kFp8:
      return linear_into(a.x_q, a.scale_rows, w, bias, out, workspace, options);
    case ActivationInput::kFp8MnMajor:
      return linear_into(a.x_q, a.scale_mn, w, bias, out, workspace, options);
    case ActivationInput::kFp8PackedUe8m0:
      return linear_into(a.x_q, a.scale_packed, w, bias, out, workspace, options);
  }
}

struct IntoCase {
  std::int64_t m, n, k;
  BlockShape block;
  std::int64_t extra_ld;  // MN-major scales: ld = round_up(M, 4) + extra_ld
};

class LinearIntoOnGpu : public ::testing::TestWithParam<IntoCase> {};

TEST_P(LinearIntoOnGpu, EveryInputFormWritesTheSameBitsWithinItsWorkspace) {
  const IntoCase c = GetParam();
  const Tensor x_host = random_bf16(c.m, c.k, 120);
  const BlockFp8Weight w_host =
      quantize_weight(random_f32(c.n, c.k, 121), c.block, ScaleMode::kUe8m0);
  Tensor bias_host = Tensor::empty(DType::kF32, {c.n});
  for (std::int64_t i = 0; i < c.n; ++i) bias_host.data_as<float>()[i] = 0.03F * (i % 17);
  const Tensor bias = to_gpu(bias_host);
  const DeviceActivations a = device_activations(x_host, c.block.k, c.extra_ld);
  const Fp8BlockTensor xq_host = quantize_fp8_groups(x_host, c.block.k, ScaleMode::kUe8m0);
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const bool packed_weight : {false, true}) {
    const BlockFp8Weight w = (packed_weight ? w_host.with_packed_ue8m0_scales() : w_host).to(kGpu);
    for (const DType out_dtype : {DType::kBF16, DType::kF32}) {
      const Tensor reference = linear_reference(xq_host, w_host, &bias_host.view(), out_dtype);
      LinearOptions options;
      options.activation_scales = ScaleMode::kUe8m0;
      Tensor first;
      for (const ActivationInput input : kEveryInput) {
        const std::string what =
            describe(Case{c.m, c.n, c.k, c.block, true}) + " " + std::string(to_string(input)) +
            " out=" + std::string(name(out_dtype)) + (packed_weight ? " packed weight scales" : "");
        const DeviceWorkspace workspace(linear_workspace_bytes(c.m, w, input));
        const Tensor out = poisoned_output(c.m, c.n, out_dtype);
        LinearRun ran;
        options.ran = &ran;
        call_linear_into(input, a, w, &bias.view(), out, workspace.view(), options, stream);
        MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
        ASSERT_NE(ran.tactic, nullptr) << what;
        const auto result = compare(out, reference);
        EXPECT_LE(result.normalized_error, kMaxNormalizedError)
            << what << " " << ran.tactic->name();
        EXPECT_EQ(result.nan_mismatches, 0) << what;
        EXPECT_TRUE(workspace.tail_intact()) << what << ": wrote past its workspace";
        if (!first.defined()) {
          first = out.to(Device::cpu());
        } else {
          // Same quantized inputs (the device quantizer is bit-exact), same tactic: same bits.
          EXPECT_TRUE(same_bits(out, first)) << what;
        }
      }
      // Scales of other strides are copied K-group major into the workspace (kFp8's size).
      ASSERT_EQ(activation_input_of(a.scale_strided), ActivationInput::kFp8);
      const DeviceWorkspace workspace(linear_workspace_bytes(c.m, w, ActivationInput::kFp8));
      const Tensor out = poisoned_output(c.m, c.n, out_dtype);
      options.ran = nullptr;
      linear_into(a.x_q, a.scale_strided, w, &bias.view(), out, workspace.view(), options);
      MXQ_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(same_bits(out, first)) << "strided scales, out=" << name(out_dtype);
      EXPECT_TRUE(workspace.tail_intact());
    }
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearIntoOnGpu,
    ::testing::Values(
        // The fast path (M = 1; ragged M with MN-major ld == M when M % 4 == 0), the wgmma
        // fallback on 64x64 blocks, the mma.sync path (K not a multiple of 16), f32 out and one
        // K-group (G = 1).
        IntoCase{1, 256, 512, {128, 128}, 0}, IntoCase{36, 144, 384, {128, 128}, 0},
        IntoCase{37, 144, 384, {128, 128}, 8}, IntoCase{130, 400, 640, {64, 64}, 4},
        IntoCase{5, 200, 200, {128, 128}, 0}, IntoCase{9, 96, 128, {32, 128}, 4}));

// The nodes a captured graph holds: kernel nodes only (a stream-ordered allocation would add
// memory nodes, a copy or memset their own nodes).
void expect_kernel_nodes_only(cudaGraph_t graph, const std::string& what) {
  std::size_t count = 0;
  MXQ_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  MXQ_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  EXPECT_GT(count, 0U) << what;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    MXQ_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    EXPECT_EQ(type, cudaGraphNodeTypeKernel)
        << what << ": a node of type " << static_cast<int>(type);
  }
}

TEST(LinearIntoOnGpu, CapturedInAGraphItReplaysTheEagerBits) {
  constexpr std::int64_t kM = 48;
  constexpr std::int64_t kN = 256;
  constexpr std::int64_t kK = 1024;
  const BlockFp8Weight w_host =
      quantize_weight(random_f32(kN, kK, 122), {128, 128}, ScaleMode::kUe8m0);
  const Tensor x_first = random_bf16(kM, kK, 123);
  const Tensor x_second = random_bf16(kM, kK, 124);
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const bool packed_weight : {false, true}) {
    const BlockFp8Weight w = (packed_weight ? w_host.with_packed_ue8m0_scales() : w_host).to(kGpu);
    for (const ActivationInput input : kEveryInput) {
      const std::string what =
          std::string(to_string(input)) + (packed_weight ? " packed weight scales" : "");
      // Static buffers the graph reads and writes; the caller refills the input between replays.
      DeviceActivations a = device_activations(x_first, 128, 4);
      const Tensor out = poisoned_output(kM, kN, DType::kBF16);
      const DeviceWorkspace workspace(linear_workspace_bytes(kM, w, input));
      LinearOptions options;
      options.activation_scales = ScaleMode::kUe8m0;
      // Eager results of both inputs, into their own outputs.
      const Tensor eager_first = poisoned_output(kM, kN, DType::kBF16);
      call_linear_into(input, a, w, nullptr, eager_first, workspace.view(), options, stream);
      const DeviceActivations second = device_activations(x_second, 128, 4);
      const Tensor eager_second = poisoned_output(kM, kN, DType::kBF16);
      call_linear_into(input, second, w, nullptr, eager_second, workspace.view(), options, stream);
      MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));

      // Global mode: any call that is unsafe during capture (cudaMalloc, a synchronization)
      // invalidates it, from whichever thread.
      cudaGraph_t graph = nullptr;
      MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      try {
        call_linear_into(input, a, w, nullptr, out, workspace.view(), options, stream);
      } catch (...) {
        (void)cudaStreamEndCapture(stream, &graph);
        throw;
      }
      MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      expect_kernel_nodes_only(graph, what);
      cudaGraphExec_t exec = nullptr;
      MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      // Nothing ran during capture.
      MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_TRUE(same_bits(out, poisoned_output(kM, kN, DType::kBF16))) << what;

      MXQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_TRUE(same_bits(out, eager_first)) << what;
      // New activations in the same buffers: the replay computes them.
      const auto refill = [&](const Tensor& dst, const Tensor& src) {
        MXQ_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(),
                                       cudaMemcpyDeviceToDevice, stream));
      };
      refill(a.x, second.x);
      refill(a.x_q, second.x_q);
      refill(a.scale_rows, second.scale_rows);
      refill(a.scale_storage, second.scale_storage);
      refill(a.scale_packed, second.scale_packed);
      MXQ_CUDA_CHECK(cudaMemsetAsync(out.data(), 0xFF, out.nbytes(), stream));
      MXQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_TRUE(same_bits(out, eager_second)) << what;
      EXPECT_FALSE(same_bits(eager_first, eager_second)) << what;
      EXPECT_TRUE(workspace.tail_intact()) << what;
      MXQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
      MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
    }
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Every fast tile, forced, captured and replayed: the same bits as its eager call. The cluster
// tile launches with a cluster attribute and sizes its grid by an occupancy query; both must
// hold under capture. N = 384: an odd count of 128-wide tiles (a cluster's tile past N).
TEST(LinearIntoOnGpu, EveryFastTileReplaysItsEagerBitsFromAGraph) {
  // Large enough for every fast tactic, the tail split included (153 256x128 tiles: a whole wave
  // on 132 SMs and 21 more, so two launches in the graph).
  constexpr std::int64_t kM = 2100;
  constexpr std::int64_t kN = 2112;
  constexpr std::int64_t kK = 512;
  const BlockFp8Weight w = quantize_weight(random_f32(kN, kK, 125), {128, 128}).to(kGpu);
  const DeviceActivations a = device_activations(random_bf16(kM, kK, 126), 128, 4);
  const DeviceWorkspace workspace(linear_workspace_bytes(kM, w, ActivationInput::kFp8));
  cudaStream_t stream = nullptr;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int tiles = 0;
  for (const auto& tactic : linear_tactics()) {
    if (!tactic->name().starts_with("cuda.sm90_wgmma.")) continue;
    ++tiles;
    LinearOptions options;
    options.tactic = tactic->name();
    const Tensor eager = poisoned_output(kM, kN, DType::kBF16);
    call_linear_into(ActivationInput::kFp8, a, w, nullptr, eager, workspace.view(), options,
                     stream);
    const Tensor replayed = poisoned_output(kM, kN, DType::kBF16);
    cudaGraph_t graph = nullptr;
    MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    try {
      call_linear_into(ActivationInput::kFp8, a, w, nullptr, replayed, workspace.view(), options,
                       stream);
    } catch (...) {
      (void)cudaStreamEndCapture(stream, &graph);
      throw;
    }
    MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    expect_kernel_nodes_only(graph, tactic->name());
    cudaGraphExec_t exec = nullptr;
    MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MXQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(same_bits(replayed, eager)) << tactic->name();
    EXPECT_FALSE(same_bits(eager, poisoned_output(kM, kN, DType::kBF16))) << tactic->name();
    MXQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  EXPECT_GE(tiles, 15);  // 64x16 ... 256x128 in clusters of two, split K, the tail split
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(LinearIntoOnGpu, BadArgumentsAreRefusedBeforeAnyKernelRuns) {
  constexpr std::int64_t kM = 8;
  constexpr std::int64_t kN = 128;
  constexpr std::int64_t kK = 256;
  const BlockFp8Weight w = quantize_weight(random_f32(kN, kK, 125), {128, 128}).to(kGpu);
  const DeviceActivations a = device_activations(random_bf16(kM, kK, 126), 128, 0);
  const std::size_t bytes = linear_workspace_bytes(kM, w, ActivationInput::kBf16);
  const DeviceWorkspace workspace(bytes);
  const Tensor out = poisoned_output(kM, kN, DType::kBF16);
  const Tensor poison = poisoned_output(kM, kN, DType::kBF16);
  const auto refused = [&](const std::function<void()>& call, const std::string& text) {
    const std::string message = testing::message_of(call);
    EXPECT_NE(message.find(text), std::string::npos) << message;
    MXQ_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(out, poison)) << "written before the error: " << message;
    EXPECT_TRUE(workspace.untouched()) << message;
  };
  // An output at an odd offset of a larger buffer: TMA needs 16-byte aligned rows.
  const Tensor bigger = poisoned_output(kM * kN + 8, 1, DType::kBF16);
  const TensorView out_odd(static_cast<std::uint16_t*>(bigger.data()) + 1, DType::kBF16,
                           Shape{kM, kN}, kGpu);
  refused([&] { linear_into(a.x, w, nullptr, out_odd, workspace.view()); },
          "out: expected a 16-byte aligned address (TMA)");
  const TensorView small(workspace.view().data(), DType::kU8,
                         Shape{static_cast<std::int64_t>(bytes) - 1}, kGpu);
  refused([&] { linear_into(a.x, w, nullptr, out, small); }, "workspace: expected at least");
  const Tensor host_out = Tensor::empty(DType::kBF16, {kM, kN});
  refused([&] { linear_into(a.x, w, nullptr, host_out, workspace.view()); },
          "out: expected cuda:0, found cpu");
  const Tensor scales_3 = to_gpu(Tensor::zeros(DType::kF32, {kM, 3}));
  refused([&] { linear_into(a.x_q, scales_3, w, nullptr, out, workspace.view()); },
          "x_scale: expected f32 [8, 2]");
  // A forced tactic that does not support the call fails at dispatch, before the activation
  // quantization is queued.
  LinearOptions forced;
  forced.tactic = "cuda.sm90_wgmma.m64n64";
  const Tensor out_f32 = poisoned_output(kM, kN, DType::kF32);
  EXPECT_EQ(
      testing::code_of([&] { linear_into(a.x, w, nullptr, out_f32, workspace.view(), forced); }),
      ErrorCode::kUnsupported);
  MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(workspace.untouched());
  EXPECT_TRUE(same_bits(out_f32, poisoned_output(kM, kN, DType::kF32)));
}

}  // namespace
}  // namespace mxq::linear
