// The CPU reference forward pass against a direct, independent evaluation of the documented
// formulas (decode with the formats module, naive sums, the activation written out here), for
// every activation variant; routing against its formula; NaN inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "moe_test_util.h"
#include "mxq/core/prng.h"
#include "mxq/formats/bf16.h"
#include "mxq/formats/e4m3.h"
#include "mxq/formats/fp8_block.h"
#include "mxq/formats/mxfp4.h"
#include "mxq/moe/activation.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/layer.h"

namespace mxq::moe {
namespace {

using testing::error_of;

// A tiny layer built from hand-chosen codes and scales (native per-expert tensors).
struct TinyLayer {
  MoeConfig config;
  // Per expert: decoded weights [I][H] (gate, up) and [H][I] (down), biases as floats.
  std::vector<std::vector<float>> gate, up, down, gate_bias, up_bias, down_bias;
  std::vector<std::pair<std::string, Tensor>> tensors;  // checkpoint tensors (native names)
};

Tensor random_bytes(Xoshiro256& rng, const Shape& shape, int low, int high) {
  Tensor t = Tensor::empty(DType::kU8, shape);
  auto* p = t.data_as<std::uint8_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    p[i] = static_cast<std::uint8_t>(low + static_cast<int>(rng.next() % (high - low + 1)));
  }
  return t;
}

// bf16 tensor of multiples of 1/64 in [-1, 1]; also returns the values.
Tensor random_bias(Xoshiro256& rng, std::int64_t n, std::vector<float>* values) {
  Tensor t = Tensor::empty(DType::kBF16, {n});
  values->resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(static_cast<int>(rng.next() % 129) - 64) / 64.0F;
    (*values)[static_cast<std::size_t>(i)] = v;
    const std::uint16_t bits = float_to_bf16(v);
    std::memcpy(static_cast<std::byte*>(t.data()) + 2 * i, &bits, 2);
  }
  return t;
}

std::vector<float> decoded(const Tensor& blocks, const Tensor& scales) {
  const Tensor values = dequantize_mxfp4(blocks, scales);  // the formats module's decoder
  const auto* p = values.data_as<float>();
  return {p, p + values.numel()};
}

TinyLayer make_tiny_layer(Activation activation, std::uint64_t seed, std::int64_t hidden = 64,
                          std::int64_t inter = 64) {
  TinyLayer tiny;
  MoeConfig& c = tiny.config;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_experts = 3;
  c.top_k = 2;
  c.activation = activation;
  c.router = RouterKind::kPrecomputed;
  Xoshiro256 rng(seed);
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  for (std::int64_t e = 0; e < c.num_experts; ++e) {
    // Scales 2^-2 .. 2^2: with inputs on a 1/16 grid every sum below is exact in fp64.
    Tensor gb = random_bytes(rng, {i, h / 32, 16}, 0, 255);
    Tensor gs = random_bytes(rng, {i, h / 32}, 125, 129);
    Tensor ub = random_bytes(rng, {i, h / 32, 16}, 0, 255);
    Tensor us = random_bytes(rng, {i, h / 32}, 125, 129);
    Tensor db = random_bytes(rng, {h, i / 32, 16}, 0, 255);
    Tensor ds = random_bytes(rng, {h, i / 32}, 122, 126);
    tiny.gate.push_back(decoded(gb, gs));
    tiny.up.push_back(decoded(ub, us));
    tiny.down.push_back(decoded(db, ds));
    tiny.gate_bias.emplace_back();
    tiny.up_bias.emplace_back();
    tiny.down_bias.emplace_back();
    Tensor gbias = random_bias(rng, i, &tiny.gate_bias.back());
    Tensor ubias = random_bias(rng, i, &tiny.up_bias.back());
    Tensor dbias = random_bias(rng, h, &tiny.down_bias.back());
    const auto add = [&](MoeTensorKind kind, Tensor t) {
      tiny.tensors.emplace_back(format_tensor_name({0, kind, e}), std::move(t));
    };
    add(MoeTensorKind::kGateBlocks, std::move(gb));
    add(MoeTensorKind::kGateScales, std::move(gs));
    add(MoeTensorKind::kGateBias, std::move(gbias));
    add(MoeTensorKind::kUpBlocks, std::move(ub));
    add(MoeTensorKind::kUpScales, std::move(us));
    add(MoeTensorKind::kUpBias, std::move(ubias));
    add(MoeTensorKind::kExpertDownBlocks, std::move(db));
    add(MoeTensorKind::kExpertDownScales, std::move(ds));
    add(MoeTensorKind::kExpertDownBias, std::move(dbias));
  }
  return tiny;
}

MoeLayer build(const TinyLayer& tiny, const ShardOptions& shards) {
  MoeLayer layer = MoeLayer::create(tiny.config, 0, shards);
  layer.begin_update();
  for (const auto& [name, tensor] : tiny.tensors) layer.load(name, tensor);
  layer.end_update();
  return layer;
}

// The activations, written out from the documentation.
double direct_activation(Activation activation, double g, double u) {
  const double limit = 7.0;
  const double alpha = 1.702;
  switch (activation) {
    case Activation::kSwigluOai: {
      const double gc = g > limit ? limit : g;
      const double uc = u > limit ? limit : (u < -limit ? -limit : u);
      return (uc + 1.0) * gc * (1.0 / (1.0 + std::exp(-alpha * gc)));
    }
    case Activation::kSwigluClamp: {
      const double gc = g > limit ? limit : g;
      const double uc = u > limit ? limit : (u < -limit ? -limit : u);
      return gc * (1.0 / (1.0 + std::exp(-gc))) * uc;
    }
    case Activation::kSwiglu:
      return g * (1.0 / (1.0 + std::exp(-g))) * u;
  }
  return 0.0;
}

struct Oracle {
  std::vector<float> accumulator;  // fp32 [T, H]
  std::vector<float> output;       // bf16 values
  int gates_above_limit = 0;
  int ups_beyond_limit = 0;
};

// W4A8 activations, the independent way: the formats module's quantize_fp8_groups (groups of 128)
// on one row, dequantized exactly in double from its codes and scales.
std::vector<double> fp8_groups_of(const std::vector<double>& row) {
  Tensor t = Tensor::empty(DType::kF32, {1, static_cast<std::int64_t>(row.size())});
  for (std::size_t j = 0; j < row.size(); ++j) t.data_as<float>()[j] = static_cast<float>(row[j]);
  const Fp8BlockTensor q = quantize_fp8_groups(t, 128);
  std::vector<double> out(row.size());
  for (std::size_t j = 0; j < row.size(); ++j) {
    out[j] = static_cast<double>(e4m3_to_float(static_cast<const std::uint8_t*>(q.q.data())[j])) *
             static_cast<double>(q.scale.data_as<float>()[j / 128]);
  }
  return out;
}

Oracle direct_forward(const TinyLayer& tiny, const std::vector<float>& x_in, std::int64_t tokens,
                      const std::vector<std::int32_t>& ids, const std::vector<float>& weights) {
  const bool fp8 = tiny.config.activation_quant == ActivationQuant::kFp8Group128;
  std::vector<double> x(x_in.begin(), x_in.end());
  if (fp8) {
    const auto h = static_cast<std::size_t>(tiny.config.hidden_size);
    for (std::int64_t t = 0; t < tokens; ++t) {
      const auto begin = x.begin() + static_cast<std::ptrdiff_t>(t * h);
      const std::vector<double> q = fp8_groups_of(std::vector<double>(begin, begin + h));
      std::copy(q.begin(), q.end(), begin);
    }
  }
  const std::int64_t h = tiny.config.hidden_size;
  const std::int64_t inter = tiny.config.intermediate_size;
  const std::int64_t k = tiny.config.top_k;
  Oracle oracle;
  oracle.accumulator.assign(static_cast<std::size_t>(tokens * h), 0.0F);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t s = 0; s < k; ++s) {
      const auto e = static_cast<std::size_t>(ids[static_cast<std::size_t>(t * k + s)]);
      std::vector<double> act(static_cast<std::size_t>(inter));
      for (std::int64_t c = 0; c < inter; ++c) {
        double g = 0.0;
        double u = 0.0;
        for (std::int64_t j = 0; j < h; ++j) {
          const double xv = x[static_cast<std::size_t>(t * h + j)];
          g += xv * tiny.gate[e][static_cast<std::size_t>(c * h + j)];
          u += xv * tiny.up[e][static_cast<std::size_t>(c * h + j)];
        }
        const auto gf = static_cast<float>(g + tiny.gate_bias[e][static_cast<std::size_t>(c)]);
        const auto uf = static_cast<float>(u + tiny.up_bias[e][static_cast<std::size_t>(c)]);
        oracle.gates_above_limit += gf > 7.0F;
        oracle.ups_beyond_limit += std::fabs(uf) > 7.0F;
        act[static_cast<std::size_t>(c)] =
            round_to_bf16(static_cast<float>(direct_activation(tiny.config.activation, gf, uf)));
      }
      if (fp8) act = fp8_groups_of(act);
      const float w = weights[static_cast<std::size_t>(t * k + s)];
      for (std::int64_t j = 0; j < h; ++j) {
        double y = 0.0;
        for (std::int64_t c = 0; c < inter; ++c) {
          y += act[static_cast<std::size_t>(c)] *
               tiny.down[e][static_cast<std::size_t>(j * inter + c)];
        }
        const auto yf = static_cast<float>(y + tiny.down_bias[e][static_cast<std::size_t>(j)]);
        const auto contribution = static_cast<float>(static_cast<double>(w) * yf);
        oracle.accumulator[static_cast<std::size_t>(t * h + j)] += contribution;
      }
    }
  }
  for (float v : oracle.accumulator) oracle.output.push_back(round_to_bf16(v));
  return oracle;
}

struct Batch {
  Tensor x;
  std::vector<float> values;
  Routing routing;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

Batch make_batch(std::int64_t tokens, const MoeConfig& config, std::uint64_t seed) {
  Xoshiro256 rng(seed);
  Batch batch;
  batch.x = Tensor::empty(DType::kF32, {tokens, config.hidden_size});
  for (std::int64_t i = 0; i < tokens * config.hidden_size; ++i) {
    const float v = static_cast<float>(static_cast<int>(rng.next() % 65) - 32) / 16.0F;
    batch.x.data_as<float>()[i] = v;
    batch.values.push_back(v);
  }
  batch.routing.ids = Tensor::empty(DType::kI32, {tokens, config.top_k});
  batch.routing.weights = Tensor::empty(DType::kF32, {tokens, config.top_k});
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<std::int32_t> experts(static_cast<std::size_t>(config.num_experts));
    std::iota(experts.begin(), experts.end(), 0);
    for (std::int64_t s = 0; s < config.top_k; ++s) {
      const auto pick = static_cast<std::size_t>(
          s + static_cast<std::int64_t>(rng.next() %
                                        static_cast<std::uint64_t>(config.num_experts - s)));
      std::swap(experts[static_cast<std::size_t>(s)], experts[pick]);
      const std::int32_t id = experts[static_cast<std::size_t>(s)];
      const float w = static_cast<float>(1 + rng.next() % 255) / 256.0F;
      batch.routing.ids.data_as<std::int32_t>()[t * config.top_k + s] = id;
      batch.routing.weights.data_as<float>()[t * config.top_k + s] = w;
      batch.ids.push_back(id);
      batch.weights.push_back(w);
    }
  }
  return batch;
}

class ActivationVariant : public ::testing::TestWithParam<Activation> {};

TEST_P(ActivationVariant, ForwardEqualsTheDirectFormulaBitForBit) {
  const TinyLayer tiny = make_tiny_layer(GetParam(), 11);
  const Batch batch = make_batch(9, tiny.config, 5);
  const Oracle oracle = direct_forward(tiny, batch.values, 9, batch.ids, batch.weights);
  // The data must exercise the clamps (the limit only matters for the clamped variants).
  EXPECT_GT(oracle.gates_above_limit, 0);
  EXPECT_GT(oracle.ups_beyond_limit, 0);
  for (const ShardOptions& shards : {ShardOptions{}, ShardOptions{1, 3, 0}}) {
    const MoeLayer layer = build(tiny, shards);
    const MoeForwardResult result = layer.forward(batch.x, &batch.routing);
    const auto* out = result.output.data_as<float>();
    const auto* acc = result.accumulator.data_as<float>();
    for (std::size_t i = 0; i < oracle.output.size(); ++i) {
      ASSERT_EQ(acc[i], oracle.accumulator[i]) << "element " << i << " ep " << shards.ep_size;
      ASSERT_EQ(out[i], oracle.output[i]) << "element " << i;
    }
  }
}

TEST_P(ActivationVariant, VariantsDifferFromEachOther) {
  // Guards the test above: the three formulas must give different outputs on this data.
  const Batch batch = make_batch(4, make_tiny_layer(GetParam(), 11).config, 5);
  const Activation other =
      GetParam() == Activation::kSwiglu ? Activation::kSwigluOai : Activation::kSwiglu;
  const MoeLayer a = build(make_tiny_layer(GetParam(), 11), {});
  const MoeLayer b = build(make_tiny_layer(other, 11), {});
  EXPECT_FALSE(testing::same_bits(a.forward(batch.x, &batch.routing).output,
                                  b.forward(batch.x, &batch.routing).output));
}

INSTANTIATE_TEST_SUITE_P(Moe, ActivationVariant,
                         ::testing::Values(Activation::kSwigluOai, Activation::kSwigluClamp,
                                           Activation::kSwiglu),
                         [](const auto& param_info) {
                           return std::string(to_string(param_info.param));
                         });

// W4A8 (ActivationQuant::kFp8Group128) against the direct formula with the activations quantized
// by the formats module. H = 192 gives GEMM1 two groups (128 + a partial 64). x is the usual batch
// divided by 4 (a 1/64 grid in [-1/2, 1/2], so few gates saturate) with one element per group set
// to +-7/8: every group's amax is 7/8 = 448 * 2^-9, its scale a power of two, and GEMM1's sums are
// exact as in the test above (v / scale = 512 v lands on multiples of 8 up to 256, which E4M3
// rounds above 128). GEMM2's group scale has arbitrary bits, so its fp64 sums (summed in another
// order here) may round: the fp32 accumulators must agree to 2 units in the last place.
TEST(ActivationQuant, Fp8GroupsEqualTheDirectFormulaBitForBit) {
  TinyLayer tiny = make_tiny_layer(Activation::kSwigluOai, 23, /*hidden=*/192, /*inter=*/64);
  tiny.config.activation_quant = ActivationQuant::kFp8Group128;
  Batch batch = make_batch(7, tiny.config, 9);
  const std::int64_t h = tiny.config.hidden_size;
  for (std::int64_t i = 0; i < 7 * h; ++i) {
    batch.x.data_as<float>()[i] /= 4.0F;
    batch.values[static_cast<std::size_t>(i)] /= 4.0F;
  }
  for (std::int64_t t = 0; t < 7; ++t) {
    for (std::int64_t g = 0; g < h; g += 128) {
      const float v = ((t + g / 128) % 2 == 0) ? 0.875F : -0.875F;
      batch.x.data_as<float>()[t * h + g + 3] = v;
      batch.values[static_cast<std::size_t>(t * h + g + 3)] = v;
    }
  }
  const Oracle oracle = direct_forward(tiny, batch.values, 7, batch.ids, batch.weights);
  TinyLayer plain = tiny;
  plain.config.activation_quant = ActivationQuant::kBf16;
  const Oracle bf16 = direct_forward(plain, batch.values, 7, batch.ids, batch.weights);
  EXPECT_NE(oracle.output, bf16.output);  // the quantization changes the result on this data
  for (const ShardOptions& shards : {ShardOptions{}, ShardOptions{1, 3, 0}}) {
    const MoeLayer layer = build(tiny, shards);
    const MoeForwardResult result = layer.forward(batch.x, &batch.routing);
    const auto* acc = result.accumulator.data_as<float>();
    for (std::size_t i = 0; i < oracle.output.size(); ++i) {
      const float want = oracle.accumulator[i];
      const float ulp =
          std::nextafter(std::fabs(want), std::numeric_limits<float>::infinity()) - std::fabs(want);
      ASSERT_LE(std::fabs(acc[i] - want), 2.0F * ulp)
          << "element " << i << " ep " << shards.ep_size << ": " << acc[i] << " vs " << want;
    }
  }
}

TEST(ActivationQuant, Fp8GroupsGiveIdenticalPaddedAndUnpaddedOutputs) {
  TinyLayer tiny = make_tiny_layer(Activation::kSwigluOai, 29, /*hidden=*/192, /*inter=*/96);
  tiny.config.activation_quant = ActivationQuant::kFp8Group128;
  const Batch batch = make_batch(5, tiny.config, 13);
  MoeLayer padded = build(tiny, {});
  const MoeForwardResult unpadded_result = build(tiny, {}).forward(batch.x, &batch.routing);
  (void)padded.prepare(128);  // I 96 -> 128: the last group holds 32 zero channels
  EXPECT_TRUE(
      testing::same_bits(padded.forward(batch.x, &batch.routing).output, unpadded_result.output));
}

TEST(ActivationQuant, NamesRoundTrip) {
  for (const ActivationQuant q : {ActivationQuant::kBf16, ActivationQuant::kFp8Group128})
    EXPECT_EQ(activation_quant_from_name(to_string(q)), q);
  EXPECT_FALSE(activation_quant_from_name("fp8").has_value());
}

TEST(Activation, ZeroGateAndUpGiveExactlyZero) {
  // Why padded channels contribute nothing.
  MoeConfig config;
  for (Activation a : {Activation::kSwigluOai, Activation::kSwigluClamp, Activation::kSwiglu}) {
    config.activation = a;
    const double out = apply_activation(config, 0.0, 0.0);
    EXPECT_EQ(out, 0.0);
    EXPECT_FALSE(std::signbit(out));
  }
}

TEST(Routing, TopKSoftmaxMatchesTheFormulaAndBreaksTiesTowardsLowerIndices) {
  const std::int64_t e = 5;
  const std::int64_t h = 32;
  const std::int64_t k = 3;
  // Experts 1 and 3 share a row, and 0 and 4 share another: equal logits.
  Tensor weight = Tensor::empty(DType::kBF16, {e, h});
  Tensor bias = Tensor::empty(DType::kBF16, {e});
  Xoshiro256 rng(3);
  std::vector<float> w(static_cast<std::size_t>(e * h));
  for (std::int64_t r = 0; r < e; ++r) {
    for (std::int64_t j = 0; j < h; ++j) {
      const std::int64_t source = r == 3 ? 1 : (r == 4 ? 0 : r);
      float v = static_cast<float>(static_cast<int>(rng.next() % 33) - 16) / 16.0F;
      if (source != r) v = w[static_cast<std::size_t>(source * h + j)];
      w[static_cast<std::size_t>(r * h + j)] = v;
      const std::uint16_t bits = float_to_bf16(v);
      std::memcpy(static_cast<std::byte*>(weight.data()) + 2 * (r * h + j), &bits, 2);
    }
    const std::uint16_t zero = 0;
    std::memcpy(static_cast<std::byte*>(bias.data()) + 2 * r, &zero, 2);
  }
  Tensor x = Tensor::empty(DType::kF32, {4, h});
  for (std::int64_t i = 0; i < 4 * h; ++i) {
    x.data_as<float>()[i] = static_cast<float>(static_cast<int>(rng.next() % 17) - 8) / 8.0F;
  }
  const std::vector<std::uint8_t> finite(4, 1);
  const Routing routing = route_topk_softmax(x, finite.data(), weight, bias, k);
  for (std::int64_t t = 0; t < 4; ++t) {
    std::vector<double> logits(static_cast<std::size_t>(e));
    for (std::int64_t r = 0; r < e; ++r) {
      double sum = 0.0;
      for (std::int64_t j = 0; j < h; ++j) {
        sum += static_cast<double>(x.data_as<float>()[t * h + j]) *
               w[static_cast<std::size_t>(r * h + j)];
      }
      logits[static_cast<std::size_t>(r)] = static_cast<float>(sum);
    }
    std::vector<std::int32_t> order(static_cast<std::size_t>(e));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
    });
    double total = 0.0;
    for (std::int64_t s = 0; s < k; ++s) {
      total += std::exp(logits[static_cast<std::size_t>(order[static_cast<std::size_t>(s)])] -
                        logits[static_cast<std::size_t>(order[0])]);
    }
    for (std::int64_t s = 0; s < k; ++s) {
      const std::int32_t id = routing.ids.data_as<std::int32_t>()[t * k + s];
      EXPECT_EQ(id, order[static_cast<std::size_t>(s)]) << "token " << t << " slot " << s;
      const double expected = std::exp(logits[static_cast<std::size_t>(id)] -
                                       logits[static_cast<std::size_t>(order[0])]) /
                              total;
      EXPECT_EQ(routing.weights.data_as<float>()[t * k + s], static_cast<float>(expected));
    }
  }
  // All-equal logits: experts 0, 1, 2 in that order, weight 1/3 each.
  Tensor zero_x = Tensor::zeros(DType::kF32, {1, h});
  const Routing tie = route_topk_softmax(zero_x, finite.data(), weight, bias, k);
  for (std::int32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(tie.ids.data_as<std::int32_t>()[s], s);
    EXPECT_EQ(tie.weights.data_as<float>()[s], static_cast<float>(1.0 / 3.0));
  }
}

TEST(Forward, NonFiniteInputRowsGiveNaNRowsAndLeaveOtherTokensUnchanged) {
  const TinyLayer tiny = make_tiny_layer(Activation::kSwigluOai, 11);
  const MoeLayer layer = build(tiny, {});
  const Batch batch = make_batch(4, tiny.config, 5);
  const MoeForwardResult clean = layer.forward(batch.x, &batch.routing);
  Tensor poisoned = Tensor::empty(DType::kF32, batch.x.shape());
  std::memcpy(poisoned.data(), batch.x.data(), batch.x.nbytes());
  const std::int64_t h = tiny.config.hidden_size;
  poisoned.data_as<float>()[1 * h + 5] = std::numeric_limits<float>::quiet_NaN();
  poisoned.data_as<float>()[3 * h + 0] = -std::numeric_limits<float>::infinity();
  const MoeForwardResult result = layer.forward(poisoned, &batch.routing);
  for (std::int64_t t = 0; t < 4; ++t) {
    for (std::int64_t j = 0; j < h; ++j) {
      const float got = result.output.data_as<float>()[t * h + j];
      if (t == 1 || t == 3) {
        ASSERT_TRUE(std::isnan(got)) << "token " << t;
      } else {
        ASSERT_EQ(got, clean.output.data_as<float>()[t * h + j]);
      }
    }
  }
  EXPECT_EQ(result.routing.ids.data_as<std::int32_t>()[1 * 2], -1);
}

TEST(Forward, RejectsBadInputsAndRouting) {
  const TinyLayer tiny = make_tiny_layer(Activation::kSwiglu, 1);
  const MoeLayer layer = build(tiny, {});
  const Batch batch = make_batch(2, tiny.config, 1);
  EXPECT_NE(error_of([&] { (void)layer.forward(batch.x); }).find("needs routing"),
            std::string::npos);
  Tensor wrong = Tensor::zeros(DType::kF32, {2, 32});
  EXPECT_NE(error_of([&] { (void)layer.forward(wrong, &batch.routing); }).find("x: expected"),
            std::string::npos);
  Tensor ints = Tensor::zeros(DType::kI32, {2, 64});
  EXPECT_NE(error_of([&] { (void)layer.forward(ints, &batch.routing); }).find("dtype"),
            std::string::npos);
  Routing bad;
  bad.ids = Tensor::zeros(DType::kI32, {2, 2});
  bad.weights = Tensor::zeros(DType::kF32, {2, 2});
  bad.ids.data_as<std::int32_t>()[3] = 3;  // only experts 0..2 exist
  EXPECT_NE(error_of([&] { (void)layer.forward(batch.x, &bad); }).find("routing.ids[1, 1]"),
            std::string::npos);
}

}  // namespace
}  // namespace mxq::moe

namespace mxq::moe {
namespace {

TEST(Forward, ALayerWithoutBiasesEqualsOneWithZeroBiases) {
  TinyLayer with_zero = make_tiny_layer(Activation::kSwigluOai, 4);
  TinyLayer without = make_tiny_layer(Activation::kSwigluOai, 4);
  without.config.has_bias = false;
  std::vector<std::pair<std::string, Tensor>> kept;
  for (auto& [name, tensor] : with_zero.tensors) {
    if (is_bias(parse_tensor_name(name)->kind)) {
      std::memset(tensor.data(), 0, tensor.nbytes());
    } else {
      Tensor copy = Tensor::empty(tensor.dtype(), tensor.shape());
      std::memcpy(copy.data(), tensor.data(), tensor.nbytes());
      kept.emplace_back(name, std::move(copy));
    }
  }
  without.tensors = std::move(kept);
  const Batch batch = make_batch(6, with_zero.config, 2);
  const MoeLayer a = build(with_zero, {});
  const MoeLayer b = build(without, {1, 2, 0});
  EXPECT_FALSE(b.rank(0).has(MoeParam::kW2Bias));
  EXPECT_TRUE(testing::same_bits(a.forward(batch.x, &batch.routing).output,
                                 b.forward(batch.x, &batch.routing).output));
}

TEST(Forward, AnEmptyBatchGivesAnEmptyOutput) {
  const TinyLayer tiny = make_tiny_layer(Activation::kSwiglu, 2);
  const MoeLayer layer = build(tiny, {});
  Routing routing;
  routing.ids = Tensor::empty(DType::kI32, {0, 2});
  routing.weights = Tensor::empty(DType::kF32, {0, 2});
  const MoeForwardResult result = layer.forward(Tensor::empty(DType::kF32, {0, 64}), &routing);
  EXPECT_EQ(result.output.shape(), (Shape{0, 64}));
}

// route_topk_softmax is public: bad arguments are named errors, not crashes or host reads of
// device memory.
TEST(RouteTopkSoftmax, RejectsBadArgumentsByName) {
  const Tensor weight = Tensor::zeros(DType::kBF16, {4, 32});
  const Tensor x = Tensor::zeros(DType::kF32, {2, 32});
  const std::vector<std::uint8_t> finite(2, 1);
  const auto message = [&](const TensorView& input, const std::uint8_t* rows) {
    return testing::error_of([&] { (void)route_topk_softmax(input, rows, weight, {}, 2); });
  };
  EXPECT_EQ(message(x, finite.data()), "");
  EXPECT_NE(message(x, nullptr).find("finite_rows: expected 2 bytes"), std::string::npos);
  EXPECT_EQ(message(TensorView(x.data(), DType::kF32, {2, 32}, Device::cuda(0)), finite.data()),
            "x: expected cpu, found cuda:0");
  const Tensor bf16 = Tensor::zeros(DType::kBF16, {2, 32});
  EXPECT_EQ(message(bf16, finite.data()), "x: expected f32, found bf16");
}

}  // namespace
}  // namespace mxq::moe
