// MXFP4 blocks: golden blocks worked out by hand from the definition (both scale rules), the
// all-zero, NaN and Inf blocks, negative zero, saturation, random blocks against a reference
// built from the definition with exact arithmetic, and the tensor-level API.
#include "mxq/formats/mxfp4.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "formats/codec_oracles.h"
#include "mxq/formats/bf16.h"

namespace mxq {
namespace {

using test::from_bits;
using test::to_bits;

using Block = std::array<float, 32>;
using Codes = std::array<std::uint8_t, 32>;

struct QuantizedBlock {
  std::uint8_t scale = 0;
  std::array<std::uint8_t, 16> packed{};
};

QuantizedBlock quantize(const Block& x, ScaleRule rule) {
  QuantizedBlock out;
  quantize_mxfp4_block(x.data(), out.packed.data(), &out.scale, rule);
  return out;
}

Codes unpack(const std::array<std::uint8_t, 16>& packed) {
  Codes codes{};
  for (int j = 0; j < 16; ++j) {
    codes[2 * j] = packed[j] & 0xF;  // element 2j: low nibble
    codes[2 * j + 1] = packed[j] >> 4;
  }
  return codes;
}

Block dequantize(const QuantizedBlock& q) {
  Block out{};
  dequantize_mxfp4_block(q.packed.data(), q.scale, out.data());
  return out;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- reference from the definition -----------------------------------------------------------

// floor: X = 2^(floor(log2 amax) - 2); ceil: the smallest power of two X with 6X >= amax; X
// clamped to >= 2^-127. Elements: RNE of the exact x / X onto E2M1, clamped to +-6. NaN/Inf in
// the block: scale 0xFF, codes 0. All-zero block: scale 0, codes 0.
struct ReferenceBlock {
  std::uint8_t scale = 0;
  Codes codes{};
};

ReferenceBlock reference_block(const float* x, ScaleRule rule) {
  ReferenceBlock out;
  double amax = 0;
  for (int i = 0; i < 32; ++i) {
    if (!std::isfinite(x[i])) {
      out.scale = 0xFF;
      return out;
    }
    amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  }
  if (amax == 0) return out;
  int exponent = 0;
  std::frexp(amax, &exponent);  // amax in [2^(exponent-1), 2^exponent)
  int log2_x = exponent - 1 - 2;
  if (rule == ScaleRule::kCeil) {
    log2_x = exponent - 1 - 4;  // 6 * 2^log2_x < amax here; step up until it is not
    while (6.0 * std::ldexp(1.0, log2_x) < amax) ++log2_x;
  }
  log2_x = std::max(log2_x, -127);
  out.scale = static_cast<std::uint8_t>(log2_x + 127);
  for (int i = 0; i < 32; ++i) {
    out.codes[i] = test::reference_e2m1(std::ldexp(static_cast<double>(x[i]), -log2_x));
  }
  return out;
}

// ---- scale codes -----------------------------------------------------------------------------

TEST(Mxfp4ScaleCode, HandWorkedExamples) {
  struct Case {
    float amax;
    int floor;  // 127 + floor(log2 amax) - 2, clamped to >= 0
    int ceil;   // 127 + ceil(log2(amax / 6)), clamped to >= 0
  };
  const float max = std::numeric_limits<float>::max();
  const Case cases[] = {
      {1.0F, 125, 125},                        // 1/6 -> 2^-2
      {1.5F, 125, 125},                        // 1.5/6 = 2^-2 exactly: ceil does not bump
      {std::nextafter(1.5F, 2.0F), 125, 126},  // significand just above 1.5
      {6.0F, 127, 127},                        // 6/6 = 1
      {std::nextafter(6.0F, 7.0F), 127, 128},
      {7.0F, 127, 128},
      {std::nextafter(8.0F, 0.0F), 127, 128},
      {8.0F, 128, 128},   // 8/6 = 1.33 -> 2
      {0x1p-124F, 1, 1},  // floor 2^-126; ceil: 2^-124/6 = 2^-126.58 -> 2^-126
      {0x1p-126F, 0, 0},  // both below 2^-127: clamped
      {std::numeric_limits<float>::denorm_min(), 0, 0},
      {0.0F, 0, 0},
      {-7.0F, 127, 128},  // the sign is ignored
      {max, 252, 253},    // 2^127.99: floor 2^125; ceil 2^128/6 = 2^125.4 -> 2^126
  };
  for (const Case& c : cases) {
    EXPECT_EQ(mxfp4_scale_code(c.amax, ScaleRule::kFloor), c.floor) << c.amax;
    EXPECT_EQ(mxfp4_scale_code(c.amax, ScaleRule::kCeil), c.ceil) << c.amax;
  }
  for (ScaleRule rule : {ScaleRule::kFloor, ScaleRule::kCeil}) {
    EXPECT_EQ(mxfp4_scale_code(std::numeric_limits<float>::infinity(), rule), 0xFF);
    EXPECT_EQ(mxfp4_scale_code(-std::numeric_limits<float>::quiet_NaN(), rule), 0xFF);
  }
}

// ---- golden blocks ---------------------------------------------------------------------------

// amax = 7 (significand 1.75): the rules give different scales.
const Block kGoldenInput = {0,     -0.0F, 0.25F, -0.25F, 0.5F,   0.75F,  1,       1.25F,
                            1.5F,  1.75F, 2,     2.5F,   3,      3.5F,   4,       5,
                            6,     7,     -7,    0.1F,   -0.1F,  0.3F,   -0.6F,   2.25F,
                            2.75F, 4.5F,  5.5F,  6.5F,   -3.25F, 1e-30F, -1e-30F, 0.125F};

TEST(Mxfp4Block, GoldenFloor) {
  // X = 2^(floor(log2 7) - 2) = 2^0 = 1 -> scale byte 127. x / X = x, rounded to nearest E2M1
  // value (ties to even code), clamped to +-6:
  //  0->0  -0->-0  0.25->0 (tie)  -0.25->-0  0.5->0.5  0.75->1 (tie)  1->1  1.25->1 (tie)
  //  1.5->1.5  1.75->2 (tie)  2->2  2.5->2 (tie)  3->3  3.5->4 (tie)  4->4  5->4 (tie)
  //  6->6  7->6 (clamp)  -7->-6  0.1->0  -0.1->-0  0.3->0.5  -0.6->-0.5  2.25->2
  //  2.75->3  4.5->4  5.5->6  6.5->6  -3.25->-3  1e-30->0  -1e-30->-0  0.125->0
  const Block values = {0, -0.0F, 0,  -0.0F, 0.5F,  1,    1,     1, 1.5F, 2, 2, 2, 3,  4, 4,     4,
                        6, 6,     -6, 0,     -0.0F, 0.5F, -0.5F, 2, 3,    4, 6, 6, -3, 0, -0.0F, 0};
  const Codes codes = {0x0, 0x8, 0x0, 0x8, 0x1, 0x2, 0x2, 0x2, 0x3, 0x4, 0x4,
                       0x4, 0x5, 0x6, 0x6, 0x6, 0x7, 0x7, 0xF, 0x0, 0x8, 0x1,
                       0x9, 0x4, 0x5, 0x6, 0x7, 0x7, 0xD, 0x0, 0x8, 0x0};
  const QuantizedBlock q = quantize(kGoldenInput, ScaleRule::kFloor);
  EXPECT_EQ(q.scale, 0x7F);
  EXPECT_EQ(unpack(q.packed), codes);
  EXPECT_EQ(q.packed[0], 0x80);  // elements 0 (+0, low nibble) and 1 (-0, high nibble)
  EXPECT_EQ(q.packed[9], 0x0F);  // elements 18 (-6 -> 0xF) and 19 (0)
  const Block out = dequantize(q);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(to_bits(out[i]), to_bits(values[i])) << i;  // sign of zero included
  }
}

TEST(Mxfp4Block, GoldenCeil) {
  // X = 2^ceil(log2(7/6)) = 2 -> scale byte 128. x / 2, rounded, never clamped:
  //  0 -0 0.125->0 -0.125->-0 0.25->0 (tie) 0.375->0.5 0.5 0.625->0.5 0.75->1 (tie)
  //  0.875->1 1 1.25->1 (tie) 1.5 1.75->2 (tie) 2 2.5->2 (tie) 3 3.5->4 (tie) -3.5->-4
  //  0.05->0 -0.05->-0 0.15->0 -0.3->-0.5 1.125->1 1.375->1.5 2.25->2 2.75->3 3.25->3
  //  -1.625->-1.5 5e-31->0 -5e-31->-0 0.0625->0
  const Block halves = {0,     -0.0F, 0,    -0.0F, 0, 0.5F, 0.5F,  0.5F, 1,     1,     1,
                        1,     1.5F,  2,    2,     2, 3,    4,     -4,   0,     -0.0F, 0,
                        -0.5F, 1,     1.5F, 2,     3, 3,    -1.5F, 0,    -0.0F, 0};
  const Codes codes = {0x0, 0x8, 0x0, 0x8, 0x0, 0x1, 0x1, 0x1, 0x2, 0x2, 0x2,
                       0x2, 0x3, 0x4, 0x4, 0x4, 0x5, 0x6, 0xE, 0x0, 0x8, 0x0,
                       0x9, 0x2, 0x3, 0x4, 0x5, 0x5, 0xB, 0x0, 0x8, 0x0};
  const QuantizedBlock q = quantize(kGoldenInput, ScaleRule::kCeil);
  EXPECT_EQ(q.scale, 0x80);
  EXPECT_EQ(unpack(q.packed), codes);
  const Block out = dequantize(q);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(to_bits(out[i]), to_bits(2.0F * halves[i])) << i;
  }
}

TEST(Mxfp4Block, FloorIsTheDefaultRule) {
  QuantizedBlock q;
  quantize_mxfp4_block(kGoldenInput.data(), q.packed.data(), &q.scale);
  EXPECT_EQ(q.scale, 0x7F);
}

TEST(Mxfp4Block, AllZeroBlockGetsScaleZeroAndPositiveZeros) {
  Block x{};
  for (int i = 0; i < 32; i += 3) x[i] = -0.0F;
  for (ScaleRule rule : {ScaleRule::kFloor, ScaleRule::kCeil}) {
    const QuantizedBlock q = quantize(x, rule);
    EXPECT_EQ(q.scale, 0x00);
    for (std::uint8_t byte : q.packed) EXPECT_EQ(byte, 0x00);
    for (float v : dequantize(q)) EXPECT_EQ(to_bits(v), 0U);  // +0.0 exactly
  }
}

TEST(Mxfp4Block, NegativeZeroInANonZeroBlockKeepsItsSign) {
  Block x{};
  x[0] = -0.0F;
  x[1] = 3.0F;
  x[2] = -1e-9F;  // rounds to -0 as well
  const QuantizedBlock q = quantize(x, ScaleRule::kFloor);
  // amax 3 -> X = 2^(1-2) = 0.5; 3 / 0.5 = 6 -> code 7.
  EXPECT_EQ(q.scale, 126);
  const Codes codes = unpack(q.packed);
  EXPECT_EQ(codes[0], 0x8);
  EXPECT_EQ(codes[1], 0x7);
  EXPECT_EQ(codes[2], 0x8);
  EXPECT_EQ(codes[3], 0x0);
  const Block out = dequantize(q);
  EXPECT_TRUE(std::signbit(out[0]) && out[0] == 0.0F);
  EXPECT_EQ(out[1], 3.0F);
  EXPECT_FALSE(std::signbit(out[3]));
}

TEST(Mxfp4Block, NanOrInfAnywhereMakesTheWholeBlockNan) {
  const float specials[] = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (float special : specials) {
    for (int position : {0, 17, 31}) {
      Block x{};
      for (int i = 0; i < 32; ++i) x[i] = 0.5F * static_cast<float>(i - 16);
      x[position] = special;
      for (ScaleRule rule : {ScaleRule::kFloor, ScaleRule::kCeil}) {
        const QuantizedBlock q = quantize(x, rule);
        EXPECT_EQ(q.scale, 0xFF) << special << " at " << position;
        for (std::uint8_t byte : q.packed) EXPECT_EQ(byte, 0x00);
        for (float v : dequantize(q)) EXPECT_TRUE(std::isnan(v));
      }
    }
  }
}

TEST(Mxfp4Block, FloorClampsAboveSixAndCeilNeverClamps) {
  // amax = 7.5 * 2^-20 (significand 1.875): floor X = 2^(2-2-20) = 2^-20, and 7.5 clamps to 6;
  // ceil X = 2^-19, 7.5/2 = 3.75 -> 4.
  Block x{};
  x[5] = 7.5F * 0x1p-20F;
  x[6] = -7.0F * 0x1p-20F;
  x[7] = 6.0F * 0x1p-20F;
  const QuantizedBlock floor = quantize(x, ScaleRule::kFloor);
  EXPECT_EQ(floor.scale, 127 - 20);
  EXPECT_EQ(unpack(floor.packed)[5], 0x7);
  EXPECT_EQ(unpack(floor.packed)[6], 0xF);
  EXPECT_EQ(unpack(floor.packed)[7], 0x7);
  EXPECT_EQ(dequantize(floor)[5], 6.0F * 0x1p-20F);
  const QuantizedBlock ceil = quantize(x, ScaleRule::kCeil);
  EXPECT_EQ(ceil.scale, 127 - 19);
  EXPECT_EQ(unpack(ceil.packed)[5], 0x6);  // 3.75 -> 4
  EXPECT_EQ(unpack(ceil.packed)[6], 0xE);  // -3.5 -> -4 (tie to even)
  EXPECT_EQ(unpack(ceil.packed)[7], 0x5);  // 3
  EXPECT_EQ(dequantize(ceil)[5], 8.0F * 0x1p-20F);
}

TEST(Mxfp4Block, BlocksOfExactValuesRoundTripBitExactly) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_int_distribution<int> exponent(-127, 125);
  for (int trial = 0; trial < 20000; ++trial) {
    const float scale = std::ldexp(1.0F, exponent(rng));
    Block x{};
    for (float& v : x)
      v = static_cast<float>(test::e2m1_value(static_cast<std::uint8_t>(code(rng)))) * scale;
    x[static_cast<std::size_t>(trial % 32)] = (trial % 2 ? -6.0F : 4.0F) * scale;  // sets amax
    for (ScaleRule rule : {ScaleRule::kFloor, ScaleRule::kCeil}) {
      const Block out = dequantize(quantize(x, rule));
      for (int i = 0; i < 32; ++i) ASSERT_EQ(to_bits(out[i]), to_bits(x[i])) << trial;
    }
  }
}

// Random blocks of many shapes and magnitudes, both rules, against the definition.
TEST(Mxfp4Block, RandomBlocksMatchTheDefinition) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> binade(-150, 126);
  std::uniform_real_distribution<float> unit(-8.0F, 8.0F);
  std::uniform_int_distribution<int> spread(0, 30);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  int checked = 0;
  for (int trial = 0; trial < 100000; ++trial) {
    Block x{};
    const int base = binade(rng);
    const int kind = trial % 4;
    for (int i = 0; i < 32; ++i) {
      float v = 0;
      if (kind == 0) v = std::ldexp(unit(rng), base);                // one magnitude
      if (kind == 1) v = std::ldexp(unit(rng), base - spread(rng));  // wide dynamic range
      if (kind == 2) v = from_bits(any_bits(rng) & 0xBFFFFFFFU);     // any finite below 2
      if (kind == 3) v = std::ldexp(std::round(unit(rng) * 4) / 4, std::min(base, 100));  // ties
      x[static_cast<std::size_t>(i)] = v;
    }
    for (ScaleRule rule : {ScaleRule::kFloor, ScaleRule::kCeil}) {
      const QuantizedBlock q = quantize(x, rule);
      const ReferenceBlock want = reference_block(x.data(), rule);
      ASSERT_EQ(q.scale, want.scale) << "trial " << trial;
      ASSERT_EQ(unpack(q.packed), want.codes) << "trial " << trial;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 200000);
}

// ---- tensors ---------------------------------------------------------------------------------

Tensor random_tensor(Shape shape, std::uint64_t seed) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::uniform_int_distribution<int> binade(-20, 20);
  float* data = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const int block_binade = static_cast<int>((i / 32) % 41) - 20;  // vary amax per block
    data[i] = std::ldexp(normal(rng), block_binade + (i % 97 == 0 ? binade(rng) : 0));
  }
  return t;
}

// Checks every block of `q` against the reference at its [..., K/32, 16] position, and the
// dequantized tensor against the decode formula.
void expect_matches_reference(const float* x, std::int64_t rows, std::int64_t k,
                              const Mxfp4Tensor& q, ScaleRule rule) {
  const auto* blocks = static_cast<const std::uint8_t*>(q.blocks.data());
  const auto* scales = static_cast<const std::uint8_t*>(q.scales.data());
  const std::int64_t per_row = k / 32;
  const Tensor out = dequantize_mxfp4(q.blocks, q.scales);
  const float* values = out.data_as<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t b = 0; b < per_row; ++b) {
      const std::int64_t block = r * per_row + b;
      const ReferenceBlock want = reference_block(x + r * k + b * 32, rule);
      ASSERT_EQ(scales[block], want.scale) << "row " << r << " block " << b;
      for (int j = 0; j < 16; ++j) {
        const std::uint8_t byte = blocks[block * 16 + j];
        ASSERT_EQ(byte & 0xF, want.codes[2 * j]) << "row " << r << " block " << b;
        ASSERT_EQ(byte >> 4, want.codes[2 * j + 1]) << "row " << r << " block " << b;
      }
      for (int i = 0; i < 32; ++i) {
        const double expected = test::e2m1_value(want.codes[i]) * test::e8m0_value(want.scale);
        ASSERT_EQ(static_cast<double>(values[r * k + b * 32 + i]), expected);
      }
    }
  }
}

TEST(Mxfp4Tensor, ShapesDtypesAndLayout) {
  const Tensor x = random_tensor({2, 3, 96}, 1);
  for (ScaleRule rule : {ScaleRule::kFloor, ScaleRule::kCeil}) {
    const Mxfp4Tensor q = quantize_mxfp4(x, rule);
    EXPECT_EQ(q.blocks.shape(), (Shape{2, 3, 3, 16}));
    EXPECT_EQ(q.blocks.dtype(), DType::kU8);
    EXPECT_EQ(q.scales.shape(), (Shape{2, 3, 3}));
    EXPECT_EQ(q.scales.dtype(), DType::kE8M0);
    expect_matches_reference(x.data_as<float>(), 6, 96, q, rule);
    const Tensor out = dequantize_mxfp4(q.blocks, q.scales);
    EXPECT_EQ(out.shape(), (Shape{2, 3, 96}));
    EXPECT_EQ(out.dtype(), DType::kF32);
  }
}

TEST(Mxfp4Tensor, LargeTensorsSplitAcrossThreadsMatchTheReference) {
  const Tensor x = random_tensor({2880, 2880}, 2);
  for (ScaleRule rule : {ScaleRule::kFloor, ScaleRule::kCeil}) {
    expect_matches_reference(x.data_as<float>(), 2880, 2880, quantize_mxfp4(x, rule), rule);
  }
}

TEST(Mxfp4Tensor, OneDimensionalAndEmptyInputs) {
  const Tensor x = random_tensor({64}, 3);
  const Mxfp4Tensor q = quantize_mxfp4(x);
  EXPECT_EQ(q.blocks.shape(), (Shape{2, 16}));
  EXPECT_EQ(q.scales.shape(), (Shape{2}));
  expect_matches_reference(x.data_as<float>(), 1, 64, q, ScaleRule::kFloor);
  EXPECT_EQ(dequantize_mxfp4(q.blocks, q.scales).shape(), (Shape{64}));

  const Mxfp4Tensor empty = quantize_mxfp4(Tensor::empty(DType::kF32, {0, 32}));
  EXPECT_EQ(empty.blocks.shape(), (Shape{0, 1, 16}));
  EXPECT_EQ(dequantize_mxfp4(empty.blocks, empty.scales).shape(), (Shape{0, 32}));
}

TEST(Mxfp4Tensor, Bf16InputEqualsF32InputOfTheSameValues) {
  const Tensor x = random_tensor({5, 128}, 4);
  Tensor as_bf16 = Tensor::empty(DType::kBF16, x.shape());
  Tensor rounded = Tensor::empty(DType::kF32, x.shape());
  auto* bits = reinterpret_cast<std::uint16_t*>(as_bf16.data());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    bits[i] = float_to_bf16(x.data_as<float>()[i]);
    rounded.data_as<float>()[i] = bf16_to_float(bits[i]);
  }
  const Mxfp4Tensor q = quantize_mxfp4(as_bf16, ScaleRule::kCeil);
  expect_matches_reference(rounded.data_as<float>(), 5, 128, q, ScaleRule::kCeil);
}

TEST(Mxfp4Tensor, DequantizeAcceptsU8ScalesAndE2M1x2Blocks) {
  const Tensor x = random_tensor({4, 64}, 5);
  const Mxfp4Tensor q = quantize_mxfp4(x);
  const TensorView u8_scales(q.scales.data(), DType::kU8, q.scales.shape());
  const TensorView fp4_blocks(q.blocks.data(), DType::kE2M1x2, q.blocks.shape());
  const Tensor a = dequantize_mxfp4(q.blocks, q.scales);
  const Tensor b = dequantize_mxfp4(fp4_blocks, u8_scales);
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_EQ(to_bits(a.data_as<float>()[i]), to_bits(b.data_as<float>()[i]));
  }
}

TEST(Mxfp4Tensor, ClearErrorsAtTheBoundary) {
  const Tensor x = Tensor::zeros(DType::kF32, {4, 48});
  std::string m = message_of([&] { (void)quantize_mxfp4(x); });
  EXPECT_NE(m.find("quantize_mxfp4: x"), std::string::npos) << m;
  EXPECT_NE(m.find("divisible by 32"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 48]"), std::string::npos) << m;

  m = message_of([&] { (void)quantize_mxfp4(Tensor::zeros(DType::kI32, {4, 32})); });
  EXPECT_NE(m.find("expected f32 or bf16, found i32"), std::string::npos) << m;

  m = message_of([&] { (void)quantize_mxfp4(Tensor::zeros(DType::kF32, {})); });
  EXPECT_NE(m.find("rank 1 to 7"), std::string::npos) << m;

  float data[64] = {};
  const TensorView strided(data, DType::kF32, {2, 32}, {1, 2}, Device::cpu());
  m = message_of([&] { (void)quantize_mxfp4(strided); });
  EXPECT_NE(m.find("contiguous"), std::string::npos) << m;

  const Mxfp4Tensor q = quantize_mxfp4(Tensor::zeros(DType::kF32, {4, 64}));
  m = message_of([&] { (void)dequantize_mxfp4(q.blocks, Tensor::zeros(DType::kE8M0, {4, 3})); });
  EXPECT_NE(m.find("dequantize_mxfp4: scales: expected [4, 2]"), std::string::npos) << m;
  EXPECT_NE(m.find("found [4, 3]"), std::string::npos) << m;

  m = message_of([&] { (void)dequantize_mxfp4(Tensor::zeros(DType::kU8, {4, 2, 8}), q.scales); });
  EXPECT_NE(m.find("dequantize_mxfp4: blocks"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 2, 8]"), std::string::npos) << m;

  m = message_of([&] { (void)dequantize_mxfp4(q.blocks, Tensor::zeros(DType::kF32, {4, 2})); });
  EXPECT_NE(m.find("expected e8m0 or u8, found f32"), std::string::npos) << m;
}

TEST(ScaleRule, ParsesAndPrints) {
  EXPECT_EQ(parse_scale_rule("floor"), ScaleRule::kFloor);
  EXPECT_EQ(parse_scale_rule("ceil"), ScaleRule::kCeil);
  EXPECT_EQ(to_string(ScaleRule::kFloor), "floor");
  EXPECT_EQ(to_string(ScaleRule::kCeil), "ceil");
  const std::string m = message_of([] { (void)parse_scale_rule("Floor", "--scale-rule"); });
  EXPECT_EQ(m, "--scale-rule: expected \"floor\" or \"ceil\", found \"Floor\"");
}

}  // namespace
}  // namespace mxq
