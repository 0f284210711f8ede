// Block-scaled FP8: hand-worked groups, block shapes other than 128x128 with ragged edges
// against a reference written from the definition, dequantization, NaN/Inf blocks, bf16 input,
// BlockShape parsing and the boundary errors.
#include "mxq/formats/fp8_block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/codec_oracles.h"
#include "mxq/formats/bf16.h"

namespace mxq {
namespace {

using test::from_bits;
using test::to_bits;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Tensor matrix(std::int64_t n, std::int64_t k, const std::vector<float>& values) {
  Tensor t = Tensor::empty(DType::kF32, {n, k});
  std::copy(values.begin(), values.end(), t.data_as<float>());
  return t;
}

const std::uint8_t* codes(const Fp8BlockTensor& q) {
  return static_cast<const std::uint8_t*>(q.q.data());
}

// ---- hand-worked -----------------------------------------------------------------------------

TEST(Fp8Groups, HandWorkedFp32Scales) {
  // Groups of 1x2. Row 0: amax 1000 -> scale 1000/448; 1000/scale = 448 -> 0x7E;
  // -3/scale = -1.344, between 1.25 and 1.375 above their midpoint 1.3125 -> -1.375 = 0xBB.
  // Row 1: amax 448 -> scale 1; 448 -> 0x7E, 0 -> 0x00.
  const Fp8BlockTensor q =
      quantize_fp8_groups(matrix(2, 2, {1000, -3, 448, 0}), 2, ScaleMode::kFp32);
  EXPECT_EQ(q.block, (BlockShape{1, 2}));
  EXPECT_EQ(q.q.dtype(), DType::kE4M3);
  EXPECT_EQ(q.scale.shape(), (Shape{2, 1}));
  EXPECT_EQ(q.scale.data_as<float>()[0], 1000.0F / 448.0F);
  EXPECT_EQ(q.scale.data_as<float>()[1], 1.0F);
  EXPECT_EQ(codes(q)[0], 0x7E);
  EXPECT_EQ(codes(q)[1], 0xBB);
  EXPECT_EQ(codes(q)[2], 0x7E);
  EXPECT_EQ(codes(q)[3], 0x00);
}

TEST(Fp8Groups, HandWorkedUe8m0Scales) {
  // Row 0: 1000/448 = 2.23 rounds up to 4; 1000/4 = 250 -> 256 (0x78, nearer than 240);
  // -3/4 = -0.75 = -1.5 * 2^-1 -> 0xB4. Row 1: 448/448 = 1 is a power of two already.
  const Fp8BlockTensor q =
      quantize_fp8_groups(matrix(2, 2, {1000, -3, 448, 0}), 2, ScaleMode::kUe8m0);
  EXPECT_EQ(q.scale.data_as<float>()[0], 4.0F);
  EXPECT_EQ(q.scale.data_as<float>()[1], 1.0F);
  EXPECT_EQ(codes(q)[0], 0x78);
  EXPECT_EQ(codes(q)[1], 0xB4);
  EXPECT_EQ(codes(q)[2], 0x7E);
  EXPECT_EQ(codes(q)[3], 0x00);
}

TEST(Fp8Groups, AllZeroGroupUsesTheAmaxFloor) {
  const Tensor x = Tensor::zeros(DType::kF32, {1, 128});
  const Fp8BlockTensor fp32 = quantize_fp8_groups(x, 128, ScaleMode::kFp32);
  EXPECT_EQ(fp32.scale.data_as<float>()[0], 1e-4F / 448.0F);
  const Fp8BlockTensor ue8m0 = quantize_fp8_groups(x, 128, ScaleMode::kUe8m0);
  EXPECT_EQ(ue8m0.scale.data_as<float>()[0], 0x1p-22F);  // 2.2e-7 rounds up to 2^-22 = 2.4e-7
  for (int i = 0; i < 128; ++i) EXPECT_EQ(codes(fp32)[i], 0x00);
}

TEST(Fp8BlockScale, Ue8m0RoundsUpToAPowerOfTwo) {
  EXPECT_EQ(fp8_block_scale(448.0F, ScaleMode::kUe8m0), 1.0F);
  EXPECT_EQ(fp8_block_scale(std::nextafter(448.0F, 1e9F), ScaleMode::kUe8m0), 2.0F);
  EXPECT_EQ(fp8_block_scale(896.0F, ScaleMode::kUe8m0), 2.0F);
  EXPECT_EQ(fp8_block_scale(-896.0F, ScaleMode::kUe8m0), 2.0F);
  EXPECT_EQ(fp8_block_scale(1.0F, ScaleMode::kUe8m0), 0x1p-8F);  // 1/448 = 2^-8.8 -> 2^-8
  EXPECT_TRUE(
      std::isnan(fp8_block_scale(std::numeric_limits<float>::infinity(), ScaleMode::kFp32)));
  EXPECT_TRUE(
      std::isnan(fp8_block_scale(std::numeric_limits<float>::quiet_NaN(), ScaleMode::kUe8m0)));
}

// ---- reference from the definition -----------------------------------------------------------

struct Reference {
  std::vector<float> scale;
  std::vector<std::uint8_t> q;
};

// Smallest power of two >= s (frexp, exact).
float pow2_ceil(float s) {
  int exponent = 0;
  const double fraction = std::frexp(static_cast<double>(s), &exponent);
  return static_cast<float>(std::ldexp(1.0, fraction == 0.5 ? exponent - 1 : exponent));
}

Reference reference(const float* x, std::int64_t n, std::int64_t k, BlockShape block,
                    ScaleMode mode) {
  const std::int64_t rows = (n + block.n - 1) / block.n;
  const std::int64_t cols = (k + block.k - 1) / block.k;
  Reference out{std::vector<float>(static_cast<std::size_t>(rows * cols)),
                std::vector<std::uint8_t>(static_cast<std::size_t>(n * k))};
  for (std::int64_t bi = 0; bi < rows; ++bi) {
    for (std::int64_t bj = 0; bj < cols; ++bj) {
      float amax = 0;
      for (std::int64_t i = bi * block.n; i < std::min(n, (bi + 1) * block.n); ++i) {
        for (std::int64_t j = bj * block.k; j < std::min(k, (bj + 1) * block.k); ++j) {
          amax = std::max(amax, std::fabs(x[i * k + j]));
        }
      }
      float s = std::max(amax, 1e-4F) / 448.0F;
      if (mode == ScaleMode::kUe8m0) s = pow2_ceil(s);
      out.scale[static_cast<std::size_t>(bi * cols + bj)] = s;
      for (std::int64_t i = bi * block.n; i < std::min(n, (bi + 1) * block.n); ++i) {
        for (std::int64_t j = bj * block.k; j < std::min(k, (bj + 1) * block.k); ++j) {
          out.q[static_cast<std::size_t>(i * k + j)] = test::reference_e4m3(x[i * k + j] / s, true);
        }
      }
    }
  }
  return out;
}

// Values whose magnitude changes from block to block (so every block has its own scale), some
// exact zeros, one all-zero region, and a few elements far above their neighbours.
Tensor random_matrix(std::int64_t n, std::int64_t k, std::uint64_t seed) {
  Tensor t = Tensor::empty(DType::kF32, {n, k});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  float* data = t.data_as<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < k; ++j) {
      const int binade = static_cast<int>((i / 16 * 7 + j / 16 * 3) % 40) - 24;
      float v = std::ldexp(normal(rng), binade);
      if ((i * k + j) % 11 == 0) v = 0;
      if (i < 8 && j < 8) v = 0;
      if ((i * k + j) % 997 == 0) v *= 1e6F;
      data[i * k + j] = v;
    }
  }
  return t;
}

void expect_matches_reference(const Tensor& x, BlockShape block, ScaleMode mode) {
  const std::int64_t n = x.shape()[0];
  const std::int64_t k = x.shape()[1];
  const Fp8BlockTensor q = quantize_fp8_block(x, block, mode);
  const Reference want = reference(x.data_as<float>(), n, k, block, mode);
  const std::int64_t rows = (n + block.n - 1) / block.n;
  const std::int64_t cols = (k + block.k - 1) / block.k;
  ASSERT_EQ(q.scale.shape(), (Shape{rows, cols}));
  ASSERT_EQ(q.q.shape(), (Shape{n, k}));
  EXPECT_EQ(q.block, block);
  for (std::int64_t b = 0; b < rows * cols; ++b) {
    ASSERT_EQ(to_bits(q.scale.data_as<float>()[b]),
              to_bits(want.scale[static_cast<std::size_t>(b)]))
        << "block " << b << " of " << to_string(block);
  }
  for (std::int64_t i = 0; i < n * k; ++i) {
    ASSERT_EQ(codes(q)[i], want.q[static_cast<std::size_t>(i)])
        << "element " << i << " of " << to_string(block);
  }
  // Dequantization = q * scale of the element's block, in fp32.
  const Tensor out = dequantize_fp8_block(q.q, q.scale, block);
  ASSERT_EQ(out.shape(), (Shape{n, k}));
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < k; ++j) {
      const float s = want.scale[static_cast<std::size_t>((i / block.n) * cols + j / block.k)];
      const float expected = static_cast<float>(test::e4m3_pattern_value(
                                 want.q[static_cast<std::size_t>(i * k + j)])) *
                             s;
      ASSERT_EQ(to_bits(out.data_as<float>()[i * k + j]), to_bits(expected)) << i << "," << j;
    }
  }
}

TEST(Fp8Block, BlockShapesWithRaggedEdgesMatchTheReference) {
  const Tensor x = random_matrix(300, 200, 1);  // 300 = 2*128 + 44 = 4*64 + 44; 200 = 3*64 + 8
  for (const BlockShape block :
       {BlockShape{64, 64}, BlockShape{32, 32}, BlockShape{128, 64}, BlockShape{256, 128},
        BlockShape{128, 128}, BlockShape{1, 128}, BlockShape{7, 300}, BlockShape{512, 512}}) {
    for (ScaleMode mode : {ScaleMode::kFp32, ScaleMode::kUe8m0}) {
      SCOPED_TRACE(to_string(block) + " " + std::string(to_string(mode)));
      expect_matches_reference(x, block, mode);
    }
  }
}

TEST(Fp8Block, ExactMultiplesAndLargeMatricesMatchTheReference) {
  expect_matches_reference(random_matrix(256, 384, 2), BlockShape{128, 128}, ScaleMode::kFp32);
  // Large enough to be split across threads.
  expect_matches_reference(random_matrix(1024, 1000, 3), BlockShape{128, 128}, ScaleMode::kUe8m0);
  expect_matches_reference(random_matrix(777, 1024, 4), BlockShape{1, 128}, ScaleMode::kFp32);
}

TEST(Fp8Block, HugeBlockExtentsDoNotOverflow) {
  const BlockShape huge = parse_block_shape("9223372036854775807x9223372036854775807");
  const Tensor x = random_matrix(33, 65, 9);
  const Fp8BlockTensor q = quantize_fp8_block(x, huge);
  EXPECT_EQ(q.scale.shape(), (Shape{1, 1}));
  const Reference want = reference(x.data_as<float>(), 33, 65, {33, 65}, ScaleMode::kFp32);
  EXPECT_EQ(q.scale.data_as<float>()[0], want.scale[0]);
  EXPECT_EQ(dequantize_fp8_block(q.q, q.scale, huge).shape(), (Shape{33, 65}));
}

TEST(Fp8Block, ScalesHaveTheDeepSeekShape) {
  const Fp8BlockTensor q = quantize_fp8_block(random_matrix(300, 200, 5), BlockShape{128, 64});
  EXPECT_EQ(q.scale.shape(), (Shape{3, 4}));  // ceil(300/128), ceil(200/64)
  EXPECT_EQ(q.scale.dtype(), DType::kF32);
}

TEST(Fp8Block, NanOrInfMakesItsBlockNanAndLeavesOthersAlone) {
  Tensor x = random_matrix(64, 64, 6);
  const Tensor clean = random_matrix(64, 64, 6);
  x.data_as<float>()[5 * 64 + 3] = std::numeric_limits<float>::quiet_NaN();    // block (0, 0)
  x.data_as<float>()[40 * 64 + 50] = -std::numeric_limits<float>::infinity();  // block (1, 1)
  const BlockShape block{32, 32};
  const Fp8BlockTensor q = quantize_fp8_block(x, block);
  const Fp8BlockTensor q_clean = quantize_fp8_block(clean, block);
  const float* scales = q.scale.data_as<float>();
  EXPECT_TRUE(std::isnan(scales[0]));
  EXPECT_TRUE(std::isnan(scales[3]));
  EXPECT_EQ(scales[1], q_clean.scale.data_as<float>()[1]);
  EXPECT_EQ(scales[2], q_clean.scale.data_as<float>()[2]);
  const Tensor out = dequantize_fp8_block(q.q, q.scale, block);
  for (std::int64_t i = 0; i < 64; ++i) {
    for (std::int64_t j = 0; j < 64; ++j) {
      const bool poisoned = (i < 32) == (j < 32);  // blocks (0,0) and (1,1)
      EXPECT_EQ(std::isnan(out.data_as<float>()[i * 64 + j]), poisoned) << i << "," << j;
      if (poisoned) {
        EXPECT_EQ(codes(q)[i * 64 + j], 0x7F);
      } else {
        EXPECT_EQ(codes(q)[i * 64 + j], codes(q_clean)[i * 64 + j]);
      }
    }
  }
}

TEST(Fp8Block, Bf16InputEqualsF32InputOfTheSameValues) {
  const Tensor x = random_matrix(100, 260, 7);
  Tensor as_bf16 = Tensor::empty(DType::kBF16, x.shape());
  Tensor rounded = Tensor::empty(DType::kF32, x.shape());
  auto* bits = reinterpret_cast<std::uint16_t*>(as_bf16.data());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    bits[i] = float_to_bf16(x.data_as<float>()[i]);
    rounded.data_as<float>()[i] = bf16_to_float(bits[i]);
  }
  const Fp8BlockTensor from_bf16 = quantize_fp8_groups(as_bf16, 128, ScaleMode::kUe8m0);
  const Reference want = reference(rounded.data_as<float>(), 100, 260, {1, 128}, ScaleMode::kUe8m0);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(codes(from_bf16)[i], want.q[static_cast<std::size_t>(i)]) << i;
  }
  for (std::int64_t b = 0; b < from_bf16.scale.numel(); ++b) {
    ASSERT_EQ(from_bf16.scale.data_as<float>()[b], want.scale[static_cast<std::size_t>(b)]) << b;
  }
}

TEST(Fp8Groups, AreOneByGroupKBlocks) {
  const Tensor x = random_matrix(9, 300, 8);
  const Fp8BlockTensor groups = quantize_fp8_groups(x, 128, ScaleMode::kFp32);
  const Fp8BlockTensor blocks = quantize_fp8_block(x, BlockShape{1, 128}, ScaleMode::kFp32);
  EXPECT_EQ(groups.block, (BlockShape{1, 128}));
  EXPECT_EQ(groups.scale.shape(), (Shape{9, 3}));
  for (std::int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(codes(groups)[i], codes(blocks)[i]);
}

TEST(Fp8Block, IntoTheCallersMemoryEqualsTheAllocatingForm) {
  const Tensor x = random_matrix(70, 300, 9);
  for (const ScaleMode mode : {ScaleMode::kFp32, ScaleMode::kUe8m0}) {
    const Fp8BlockTensor want = quantize_fp8_block(x, BlockShape{32, 128}, mode);
    Tensor q = Tensor::empty(DType::kE4M3, {70, 300});
    Tensor scale = Tensor::empty(DType::kF32, {3, 3});
    quantize_fp8_block_into(x, BlockShape{32, 128}, mode, q, scale);
    EXPECT_EQ(std::memcmp(q.data(), want.q.data(), q.nbytes()), 0);
    EXPECT_EQ(std::memcmp(scale.data(), want.scale.data(), scale.nbytes()), 0);
  }
  Tensor q = Tensor::empty(DType::kE4M3, {70, 300});
  const Tensor wrong = Tensor::empty(DType::kF32, {3, 2});
  const std::string m = message_of([&] {
    quantize_fp8_block_into(x, BlockShape{32, 128}, ScaleMode::kFp32, q, wrong);
  });
  EXPECT_NE(m.find("quantize_fp8_block: scale: expected [3, 3], found [3, 2]"), std::string::npos)
      << m;
  const Tensor as_f32 = Tensor::empty(DType::kF32, {70, 300});
  EXPECT_NE(message_of([&] {
              quantize_fp8_block_into(x, BlockShape{32, 128}, ScaleMode::kFp32, as_f32, wrong);
            }).find("quantize_fp8_block: q: expected e4m3, found f32"),
            std::string::npos);
}

// ---- BlockShape ------------------------------------------------------------------------------

TEST(BlockShape, ParsesPrintsAndComparesAsAValue) {
  EXPECT_EQ(parse_block_shape("128x128"), (BlockShape{128, 128}));
  EXPECT_EQ(parse_block_shape("1x128"), (BlockShape{1, 128}));
  EXPECT_EQ(parse_block_shape("256x64"), (BlockShape{256, 64}));
  EXPECT_EQ(to_string(BlockShape{128, 64}), "128x64");
  EXPECT_EQ(parse_block_shape(to_string(BlockShape{7, 300})), (BlockShape{7, 300}));
  EXPECT_NE((BlockShape{128, 64}), (BlockShape{64, 128}));
  const BlockShape from_text = parse_block_shape("128x128");
  EXPECT_TRUE(from_text == BlockShape{});  // the default is DeepSeek's 128x128
}

TEST(BlockShape, RejectsBadText) {
  for (const char* text :
       {"", "128", "x128", "128x", "0x128", "128x0", "-1x128", "128x-1", "128x128x1", "abc",
        "128 x 128", " 128x128", "128X128", "1.5x2", "99999999999999999999x1", "+1x1"}) {
    const std::string m = message_of([&] { (void)parse_block_shape(text, "--block"); });
    EXPECT_EQ(m, std::string("--block: expected NxK with positive integers N and K (e.g. 128x128), "
                             "found \"") +
                     text + "\"")
        << text;
  }
}

TEST(ScaleMode, ParsesAndPrints) {
  EXPECT_EQ(parse_scale_mode("fp32"), ScaleMode::kFp32);
  EXPECT_EQ(parse_scale_mode("ue8m0"), ScaleMode::kUe8m0);
  EXPECT_EQ(to_string(ScaleMode::kUe8m0), "ue8m0");
  EXPECT_NE(message_of([] { (void)parse_scale_mode("UE8M0"); }).find("found \"UE8M0\""),
            std::string::npos);
}

// ---- errors ----------------------------------------------------------------------------------

TEST(Fp8Block, ClearErrorsAtTheBoundary) {
  std::string m = message_of([] {
    (void)quantize_fp8_block(Tensor::zeros(DType::kF32, {2, 3, 4}), {});
  });
  EXPECT_NE(m.find("quantize_fp8_block: x: expected a 2-D tensor, found shape [2, 3, 4]"),
            std::string::npos)
      << m;
  m = message_of([] { (void)quantize_fp8_block(Tensor::zeros(DType::kF16, {2, 4}), {}); });
  EXPECT_NE(m.find("expected f32 or bf16, found f16"), std::string::npos) << m;
  m = message_of([] { (void)quantize_fp8_block(Tensor::zeros(DType::kF32, {2, 4}), {0, 128}); });
  EXPECT_NE(m.find("quantize_fp8_block: block: expected positive extents"), std::string::npos) << m;
  EXPECT_NE(m.find("found 0x128"), std::string::npos) << m;
  m = message_of([] {
    (void)quantize_fp8_groups(Tensor::zeros(DType::kF32, {2, 4}), 0, ScaleMode::kFp32);
  });
  EXPECT_NE(m.find("quantize_fp8_groups: group_k"), std::string::npos) << m;

  const Fp8BlockTensor q = quantize_fp8_block(Tensor::zeros(DType::kF32, {200, 100}), {128, 64});
  m = message_of([&] { (void)dequantize_fp8_block(q.q, q.scale, {128, 128}); });
  EXPECT_NE(m.find("dequantize_fp8_block: scale: expected [2, 1]"), std::string::npos) << m;
  EXPECT_NE(m.find("found [2, 2]"), std::string::npos) << m;
  const TensorView as_u8(q.q.data(), DType::kU8, q.q.shape());
  m = message_of([&] { (void)dequantize_fp8_block(as_u8, q.scale, {128, 64}); });
  EXPECT_NE(m.find("dequantize_fp8_block: q: expected e4m3, found u8"), std::string::npos) << m;
}

}  // namespace
}  // namespace mxq
