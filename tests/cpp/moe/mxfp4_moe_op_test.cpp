// The engine-facing MoE op on the CPU (mxq/moe/mxfp4_moe.h): its preparation equals the layer's
// (MoeLayer::prepare, then the kernels' layout) bit for bit from either checkpoint layout and
// from inputs already sliced to the rank (a rank's own read of the checkpoint too); one rank per
// call, the ranks' partials summed in rank order equal the layer's fp32 sum bit for bit; bad
// arguments are refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "moe/layout/mxfp4_device_layout.h"
#include "moe/layout/w4a8_layout.h"
#include "moe/moe_test_util.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/checkpoint_experts.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/mxfp4_moe.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe {
namespace {

constexpr std::int64_t kPitchBlock = 16;
std::int64_t pitch_of(std::int64_t k) {
  return (k / 32 + kPitchBlock - 1) / kPitchBlock * kPitchBlock;
}

// A copy (aligned, owned) of a checkpoint tensor.
Tensor copy_of(const TensorView& view) {
  Tensor out = Tensor::empty(view.dtype(), view.shape());
  std::memcpy(out.data(), view.data(), view.nbytes());
  return out;
}

struct Experts {
  Tensor w13, w13_scale, w13_bias, w2, w2_scale, w2_bias;
  CheckpointLayout layout = CheckpointLayout::kGptOss;
  [[nodiscard]] MoeExpertTensors view() const {
    return {layout, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias};
  }
};

Experts gpt_oss_experts(const MoeCheckpoint& checkpoint) {
  const std::string p = "model.layers.0.mlp.experts.";
  return {copy_of(checkpoint.view(p + "gate_up_proj_blocks")),
          copy_of(checkpoint.view(p + "gate_up_proj_scales")),
          copy_of(checkpoint.view(p + "gate_up_proj_bias")),
          copy_of(checkpoint.view(p + "down_proj_blocks")),
          copy_of(checkpoint.view(p + "down_proj_scales")),
          copy_of(checkpoint.view(p + "down_proj_bias")),
          CheckpointLayout::kGptOss};
}

// The same experts de-interleaved (gate rows, then up rows: what vLLM holds), optionally cut to a
// rank's experts [e0, e0 + ne) and channels [c0, c0 + nc).
Experts native_experts(const Experts& g, std::int64_t i, std::int64_t e0, std::int64_t ne,
                       std::int64_t c0, std::int64_t nc) {
  const std::int64_t h = g.w2.shape()[1];
  const auto rows_of = [&](const Tensor& t, std::int64_t row_bytes) {
    Tensor out = Tensor::empty(
        t.dtype(), {ne, 2 * nc, row_bytes / static_cast<std::int64_t>(size_of(t.dtype()))});
    const auto* in = static_cast<const std::uint8_t*>(t.data());
    auto* o = static_cast<std::uint8_t*>(out.data());
    for (std::int64_t e = 0; e < ne; ++e) {
      for (std::int64_t half = 0; half < 2; ++half) {
        for (std::int64_t c = 0; c < nc; ++c) {
          const std::int64_t src = (e0 + e) * 2 * i + 2 * (c0 + c) + half;
          const std::int64_t dst = e * 2 * nc + half * nc + c;
          std::memcpy(o + dst * row_bytes, in + src * row_bytes,
                      static_cast<std::size_t>(row_bytes));
        }
      }
    }
    return out;
  };
  const auto cols_of = [&](const Tensor& t, std::int64_t per_channel_num,
                           std::int64_t per_channel_den, std::int64_t in_row, DType dtype) {
    const std::int64_t out_row = nc * per_channel_num / per_channel_den;
    Tensor out = Tensor::empty(dtype, {ne, h, out_row});
    const auto* in = static_cast<const std::uint8_t*>(t.data());
    auto* o = static_cast<std::uint8_t*>(out.data());
    for (std::int64_t e = 0; e < ne; ++e) {
      for (std::int64_t r = 0; r < h; ++r) {
        std::memcpy(o + (e * h + r) * out_row,
                    in + ((e0 + e) * h + r) * in_row + c0 * per_channel_num / per_channel_den,
                    static_cast<std::size_t>(out_row));
      }
    }
    return out;
  };
  Experts n;
  n.layout = CheckpointLayout::kNative;
  n.w13 = rows_of(g.w13, h / 2);
  n.w13_scale = rows_of(g.w13_scale, h / 32);
  n.w13_bias = Tensor::empty(DType::kBF16, {ne, 2 * nc});
  {
    const auto* in = static_cast<const std::uint16_t*>(g.w13_bias.data());
    auto* o = static_cast<std::uint16_t*>(n.w13_bias.data());
    for (std::int64_t e = 0; e < ne; ++e)
      for (std::int64_t half = 0; half < 2; ++half)
        for (std::int64_t c = 0; c < nc; ++c)
          o[e * 2 * nc + half * nc + c] = in[(e0 + e) * 2 * i + 2 * (c0 + c) + half];
  }
  n.w2 = cols_of(g.w2, 1, 2, i / 2, DType::kU8);
  n.w2_scale = cols_of(g.w2_scale, 1, 32, i / 32, DType::kU8);
  n.w2_bias = Tensor::empty(DType::kBF16, {ne, h});
  std::memcpy(n.w2_bias.data(), static_cast<const std::uint16_t*>(g.w2_bias.data()) + e0 * h,
              static_cast<std::size_t>(ne * h) * 2);
  return n;
}

struct Prepared {
  Tensor w13, w13_scale, w13_bias, w2, w2_scale, w2_bias;
  [[nodiscard]] PreparedMoe view() const {
    return {w13, w13_scale, w13_bias, w2, w2_scale, w2_bias};
  }
};

// Allocated with garbage, so unwritten bytes show.
Prepared allocate(const PreparedMoeShapes& s) {
  Prepared p{Tensor::empty(DType::kU8, s.w13),        Tensor::empty(DType::kU8, s.w13_scale),
             Tensor::empty(DType::kBF16, s.w13_bias), Tensor::empty(DType::kU8, s.w2),
             Tensor::empty(DType::kU8, s.w2_scale),   Tensor::empty(DType::kBF16, s.w2_bias)};
  for (const Tensor* t : {&p.w13, &p.w13_scale, &p.w13_bias, &p.w2, &p.w2_scale, &p.w2_bias}) {
    std::memset(t->data(), 0xA5, t->nbytes());
  }
  return p;
}

// The layer's prepared rank weights in the op's layout: packed rows in the kernels' layout, scale
// rows padded to the pitch with zeros.
Prepared expected_from_layer(const MoeRankWeights& rank, ActivationQuant quant) {
  const MoeRankShape& shape = rank.shape();
  const std::int64_t p = shape.intermediate_size_per_partition_after_pad;
  const std::int64_t h = shape.hidden;
  const std::int64_t e = shape.experts_local();
  Prepared out;
  const auto packed = [&](const TensorView& v, std::int64_t rows, std::int64_t k) {
    Tensor t = copy_of(v);
    if (quant == ActivationQuant::kFp8Group128) {
      gpu::detail::to_w4a8_layout_host(static_cast<std::uint8_t*>(t.data()),
                                       static_cast<std::size_t>(rows), static_cast<int>(k));
    } else {
      gpu::detail::to_device_layout_host(static_cast<std::uint8_t*>(t.data()),
                                         static_cast<std::size_t>(rows), static_cast<int>(k));
    }
    return t;
  };
  const auto pitched = [&](const TensorView& v, std::int64_t rows, std::int64_t k) {
    Tensor t = Tensor::zeros(DType::kU8, {rows, pitch_of(k)});
    for (std::int64_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<std::uint8_t*>(t.data()) + r * pitch_of(k),
                  static_cast<const std::uint8_t*>(v.data()) + r * (k / 32),
                  static_cast<std::size_t>(k / 32));
    }
    return t;
  };
  out.w13 = packed(rank.w13(), e * 2 * p, h);
  out.w13_scale = pitched(rank.w13_scale(), e * 2 * p, h);
  out.w2 = packed(rank.w2(), e * h, p);
  out.w2_scale = pitched(rank.w2_scale(), e * h, p);
  out.w13_bias = copy_of(rank.w13_bias());
  out.w2_bias = copy_of(rank.w2_bias());
  return out;
}

void expect_same_bytes(const Prepared& a, const Prepared& b, const std::string& what) {
  const auto same = [&](const Tensor& x, const Tensor& y, const char* name) {
    ASSERT_EQ(x.nbytes(), y.nbytes()) << what << " " << name;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << what << " " << name;
  };
  same(a.w13, b.w13, "w13");
  same(a.w13_scale, b.w13_scale, "w13_scale");
  same(a.w13_bias, b.w13_bias, "w13_bias");
  same(a.w2, b.w2, "w2");
  same(a.w2_scale, b.w2_scale, "w2_scale");
  same(a.w2_bias, b.w2_bias, "w2_bias");
}

class Mxfp4MoeOp : public ::testing::Test {
 protected:
  void SetUp() override {
    write_synthetic_checkpoint(dir_.path(), testing::small_spec());
    checkpoint_ = MoeCheckpoint::open(dir_.path());
    config_ = checkpoint_.resolve_config(0);
    layer_shape_ = {config_.num_experts, config_.hidden_size, config_.intermediate_size,
                    config_.has_bias};
    experts_ = gpt_oss_experts(checkpoint_);
  }

  MoeLayer prepared_layer(int tp, int ep, ActivationQuant quant = ActivationQuant::kBf16) const {
    MoeConfig config = config_;
    config.activation_quant = quant;
    MoeLayer layer = MoeLayer::load(checkpoint_, 0, config, ShardOptions{tp, ep, 0});
    layer.prepare(128);
    return layer;
  }

  testing::TempDir dir_{"ckpt"};
  MoeCheckpoint checkpoint_;
  MoeConfig config_;
  MoeLayerShape layer_shape_;
  Experts experts_;
};

TEST_F(Mxfp4MoeOp, ShapesFollowTheLayersSharding) {
  // I = 96 over TP = 2: width 64 on both ranks (rank 1 holds 32 channels), padded to 128.
  const PreparedMoeShapes s = prepared_moe_shapes(layer_shape_, MoeRank{1, 2, 1, 2});
  EXPECT_EQ(s.intermediate_size_per_partition, 64);
  EXPECT_EQ(s.intermediate_size_per_partition_after_pad, 128);
  EXPECT_EQ(s.tp.valid, 32);
  EXPECT_EQ(s.ep.begin, 3);
  EXPECT_EQ(s.ep.count, 3);
  EXPECT_EQ(s.w13, (Shape{3, 256, 32}));
  EXPECT_EQ(s.w13_scale, (Shape{3, 256, 16}));
  EXPECT_EQ(s.w2, (Shape{3, 64, 64}));
  EXPECT_EQ(s.w2_scale, (Shape{3, 64, 16}));
  MoeRank unpadded{0, 1, 0, 1};
  unpadded.alignment = 0;
  EXPECT_EQ(prepared_moe_shapes(layer_shape_, unpadded).intermediate_size_per_partition_after_pad,
            96);
  EXPECT_NE(testing::error_of([&] {
              (void)prepared_moe_shapes(layer_shape_, MoeRank{0, 1, 0, 7});
            }).find("ep_size"),
            std::string::npos);
}

TEST_F(Mxfp4MoeOp, PreparationEqualsTheLayersFromEitherLayoutAndFromSlicedInputs) {
  for (const ActivationQuant quant : {ActivationQuant::kBf16, ActivationQuant::kFp8Group128}) {
    for (const auto& [tp, ep] : {std::pair{1, 1}, {2, 1}, {1, 2}, {2, 2}, {3, 1}}) {
      const MoeLayer layer = prepared_layer(tp, ep, quant);
      for (int r = 0; r < layer.num_ranks(); ++r) {
        const MoeRankShape& shape = layer.rank(r).shape();
        MoeRank rank{shape.tp.rank, tp, shape.ep.rank, ep};
        rank.activation_quant = quant;
        const PreparedMoeShapes s = prepared_moe_shapes(layer_shape_, rank);
        const std::string what = "tp " + std::to_string(tp) + " ep " + std::to_string(ep) +
                                 " rank " + std::to_string(r) + " " + std::string(to_string(quant));
        const Prepared expected = expected_from_layer(layer.rank(r), quant);
        Prepared from_gpt_oss = allocate(s);
        prepare_mxfp4_moe(experts_.view(), layer_shape_, rank, from_gpt_oss.view());
        expect_same_bytes(from_gpt_oss, expected, what + " gpt-oss");
        const Experts native = native_experts(experts_, config_.intermediate_size, 0,
                                              config_.num_experts, 0, config_.intermediate_size);
        Prepared from_native = allocate(s);
        prepare_mxfp4_moe(native.view(), layer_shape_, rank, from_native.view());
        expect_same_bytes(from_native, expected, what + " native");
        if (s.tp.valid == 0) continue;  // no channels to hand over
        const Experts sliced = native_experts(experts_, config_.intermediate_size, s.ep.begin,
                                              s.ep.count, s.tp.begin, s.tp.valid);
        Prepared from_sliced = allocate(s);
        prepare_mxfp4_moe(sliced.view(), layer_shape_, rank, from_sliced.view());
        expect_same_bytes(from_sliced, expected, what + " sliced");
      }
    }
  }
}

TEST_F(Mxfp4MoeOp, CheckpointExpertsOfEitherLayoutPrepareAsTheLayer) {
  // The same synthetic layer written in the native layout (the same bytes, per expert).
  testing::TempDir native_dir{"native"};
  SyntheticSpec spec = testing::small_spec();
  spec.layout = CheckpointLayout::kNative;
  write_synthetic_checkpoint(native_dir.path(), spec);
  const MoeCheckpoint native = MoeCheckpoint::open(native_dir.path());
  const MoeLayer layer = prepared_layer(2, 2);
  for (const MoeCheckpoint* source : {static_cast<const MoeCheckpoint*>(&checkpoint_), &native}) {
    const CheckpointExperts read = read_checkpoint_experts(*source, 1);
    EXPECT_EQ(read.layout, source->layout(1));
    EXPECT_EQ(read.config, source->resolve_config(1));
    ASSERT_EQ(read.router_weight.shape(), (Shape{config_.num_experts, config_.hidden_size}));
    EXPECT_EQ(testing::bytes_of(read.router_weight),
              testing::bytes_of(source->view("model.layers.1.mlp.router.weight")));
  }
  // Layer 0 from each layout prepares into the layer's bytes on every rank.
  for (const MoeCheckpoint* source : {static_cast<const MoeCheckpoint*>(&checkpoint_), &native}) {
    const CheckpointExperts read = read_checkpoint_experts(*source, 0);
    for (int r = 0; r < layer.num_ranks(); ++r) {
      const MoeRankShape& shape = layer.rank(r).shape();
      const MoeRank rank{shape.tp.rank, 2, shape.ep.rank, 2};
      Prepared got = allocate(prepared_moe_shapes(read.layer_shape(), rank));
      prepare_mxfp4_moe(read.expert_tensors(), read.layer_shape(), rank, got.view());
      expect_same_bytes(got, expected_from_layer(layer.rank(r), ActivationQuant::kBf16),
                        std::string(to_string(read.layout)) + " rank " + std::to_string(r));
    }
  }
  EXPECT_NE(testing::error_of([&] { (void)read_checkpoint_experts(checkpoint_, 5); }).find("5"),
            std::string::npos);
}

TEST_F(Mxfp4MoeOp, ARanksReadHoldsOnlyItsShardsAndPreparesAsTheWholeRead) {
  testing::TempDir native_dir{"native"};
  SyntheticSpec spec = testing::small_spec();
  spec.layout = CheckpointLayout::kNative;
  write_synthetic_checkpoint(native_dir.path(), spec);
  const MoeCheckpoint native = MoeCheckpoint::open(native_dir.path());
  const std::int64_t h = config_.hidden_size;
  for (const MoeCheckpoint* source : {static_cast<const MoeCheckpoint*>(&checkpoint_), &native}) {
    const CheckpointExperts whole = read_checkpoint_experts(*source, 0);
    // TP = 4 over I = 96: width 32, and rank 3 is past the last channel (it reads 0 channels).
    for (const auto& [tp, ep] : {std::pair{1, 1}, {2, 1}, {1, 2}, {2, 3}, {4, 1}}) {
      for (int r = 0; r < tp * ep; ++r) {
        const MoeRank rank{r % tp, tp, r / tp, ep};
        const PreparedMoeShapes s = prepared_moe_shapes(whole.layer_shape(), rank);
        const CheckpointExperts part = read_checkpoint_experts(*source, 0, {}, rank);
        const std::string what = std::string(to_string(whole.layout)) + " tp " +
                                 std::to_string(tp) + " ep " + std::to_string(ep) + " rank " +
                                 std::to_string(r);
        EXPECT_EQ(part.layout, whole.layout) << what;
        EXPECT_EQ(part.config, whole.config) << what;
        EXPECT_EQ(part.w13.shape(), (Shape{s.ep.count, 2 * s.tp.valid, h / 32, 16})) << what;
        EXPECT_EQ(part.w13_scale.shape(), (Shape{s.ep.count, 2 * s.tp.valid, h / 32})) << what;
        EXPECT_EQ(part.w13_bias.shape(), (Shape{s.ep.count, 2 * s.tp.valid})) << what;
        EXPECT_EQ(part.w2.shape(), (Shape{s.ep.count, h, s.tp.valid / 32, 16})) << what;
        EXPECT_EQ(part.w2_scale.shape(), (Shape{s.ep.count, h, s.tp.valid / 32})) << what;
        EXPECT_EQ(part.w2_bias.shape(), (Shape{s.ep.count, h})) << what;
        EXPECT_EQ(testing::bytes_of(part.router_weight), testing::bytes_of(whole.router_weight));
        EXPECT_EQ(testing::bytes_of(part.router_bias), testing::bytes_of(whole.router_bias));
        Prepared from_whole = allocate(s);
        prepare_mxfp4_moe(whole.expert_tensors(), whole.layer_shape(), rank, from_whole.view());
        Prepared from_part = allocate(s);
        prepare_mxfp4_moe(part.expert_tensors(), part.layer_shape(), rank, from_part.view());
        expect_same_bytes(from_part, from_whole, what);
      }
    }
  }
  // A rank the layer cannot have is refused by name before anything is read.
  EXPECT_NE(testing::error_of([&] {
              (void)read_checkpoint_experts(checkpoint_, 0, {}, MoeRank{2, 2, 0, 1});
            }).find("tp_rank"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              (void)read_checkpoint_experts(checkpoint_, 0, {}, MoeRank{0, 1, 0, 7});
            }).find("ep_size"),
            std::string::npos);
}

TEST_F(Mxfp4MoeOp, OneRankPerCallSumsToTheLayerBitForBit) {
  const Tensor x = synthetic_tokens(9, config_.hidden_size, 5);
  for (const auto& [tp, ep] : {std::pair{1, 1}, {2, 1}, {2, 3}}) {
    const MoeLayer layer = prepared_layer(tp, ep);
    const MoeForwardResult want = layer.forward(x);
    const std::int64_t t = x.shape()[0];
    std::vector<float> sum(static_cast<std::size_t>(t * config_.hidden_size), 0.0F);
    for (int r = 0; r < layer.num_ranks(); ++r) {
      const MoeRankShape& shape = layer.rank(r).shape();
      const MoeRank rank{shape.tp.rank, tp, shape.ep.rank, ep};
      Prepared prepared = allocate(prepared_moe_shapes(layer_shape_, rank));
      prepare_mxfp4_moe(experts_.view(), layer_shape_, rank, prepared.view());
      Mxfp4MoeOptions options;
      options.top_k = config_.top_k;
      Tensor out = Tensor::empty(DType::kF32, {t, config_.hidden_size});
      const MoeRouting routing{{}, {}, layer.router_weight(), layer.router_bias()};
      mxfp4_moe(x, prepared.view(), layer_shape_, rank, routing, options, out, {});
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += out.data_as<float>()[i];
    }
    EXPECT_EQ(std::memcmp(sum.data(), want.accumulator.data(), sum.size() * sizeof(float)), 0)
        << "tp " << tp << " ep " << ep;
    if (tp * ep != 1) continue;
    // One rank: the bf16 output is the layer's, and the engine's own routing gives the same.
    const MoeRank rank{};
    Prepared prepared = allocate(prepared_moe_shapes(layer_shape_, rank));
    prepare_mxfp4_moe(experts_.view(), layer_shape_, rank, prepared.view());
    Mxfp4MoeOptions options;
    options.top_k = config_.top_k;
    Tensor out = Tensor::empty(DType::kBF16, {t, config_.hidden_size});
    const MoeRouting given{want.routing.ids, want.routing.weights, {}, {}};
    mxfp4_moe(x, prepared.view(), layer_shape_, rank, given, options, out, {});
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      ASSERT_EQ(bf16_to_float(static_cast<const std::uint16_t*>(out.data())[i]),
                want.output.data_as<float>()[i])
          << i;
    }
  }
}

TEST_F(Mxfp4MoeOp, TheRouterAloneRoutesAsTheLayer) {
  const MoeLayer layer = prepared_layer(1, 1);
  const Tensor x = synthetic_tokens(11, config_.hidden_size, 8);
  const MoeForwardResult want = layer.forward(x);
  Tensor ids = Tensor::empty(DType::kI32, {11, config_.top_k});
  Tensor weights = Tensor::empty(DType::kF32, {11, config_.top_k});
  moe_route(x, layer.router_weight(), layer.router_bias(), config_.top_k, ids, weights, {});
  EXPECT_EQ(std::memcmp(ids.data(), want.routing.ids.data(), ids.nbytes()), 0);
  EXPECT_EQ(std::memcmp(weights.data(), want.routing.weights.data(), weights.nbytes()), 0);
  Tensor short_ids = Tensor::empty(DType::kI32, {11, config_.top_k - 1});
  EXPECT_NE(testing::error_of([&] {
              moe_route(x, layer.router_weight(), layer.router_bias(), config_.top_k, short_ids,
                        weights, {});
            }).find("topk_ids: expected"),
            std::string::npos);
}

TEST_F(Mxfp4MoeOp, PreparingAgainIsBitIdenticalToAFreshPreparation) {
  const MoeRank rank{1, 2, 0, 1};
  Prepared fresh = allocate(prepared_moe_shapes(layer_shape_, rank));
  prepare_mxfp4_moe(experts_.view(), layer_shape_, rank, fresh.view());
  // A weight update: other weights first, then the original ones again, into the same storage.
  Experts other = gpt_oss_experts(checkpoint_);
  std::memset(other.w13.data(), 0x37, other.w13.nbytes());
  Prepared reused = allocate(prepared_moe_shapes(layer_shape_, rank));
  prepare_mxfp4_moe(other.view(), layer_shape_, rank, reused.view());
  prepare_mxfp4_moe(experts_.view(), layer_shape_, rank, reused.view());
  expect_same_bytes(reused, fresh, "again");
}

TEST_F(Mxfp4MoeOp, BadArgumentsAreRefusedByName) {
  const MoeRank rank{};
  Prepared prepared = allocate(prepared_moe_shapes(layer_shape_, rank));
  prepare_mxfp4_moe(experts_.view(), layer_shape_, rank, prepared.view());
  const std::int64_t h = config_.hidden_size;
  const Tensor x = synthetic_tokens(3, h, 1);
  Tensor out = Tensor::empty(DType::kF32, {3, h});
  Tensor router = Tensor::zeros(DType::kBF16, {config_.num_experts, h});
  Mxfp4MoeOptions options;
  options.top_k = 2;
  const auto error = [&](const TensorView& xv, const MoeRouting& routing, const TensorView& o,
                         const Mxfp4MoeOptions& opt) {
    return testing::error_of(
        [&] { mxfp4_moe(xv, prepared.view(), layer_shape_, rank, routing, opt, o, {}); });
  };
  const MoeRouting by_router{{}, {}, router, {}};
  EXPECT_EQ(error(x, by_router, out, options), "");
  const Tensor x_bad = Tensor::zeros(DType::kF32, {3, h + 32});
  EXPECT_NE(error(x_bad, by_router, out, options).find("x: expected"), std::string::npos);
  const Tensor out_bad = Tensor::zeros(DType::kF32, {4, h});
  EXPECT_NE(error(x, by_router, out_bad, options).find("out: expected"), std::string::npos);
  const Tensor out_i32 = Tensor::zeros(DType::kI32, {3, h});
  EXPECT_NE(error(x, by_router, out_i32, options).find("out: expected f32 or bf16"),
            std::string::npos);
  EXPECT_NE(error(x, MoeRouting{}, out, options).find("routing: expected either"),
            std::string::npos);
  Tensor ids = Tensor::zeros(DType::kI32, {3, 2});
  const Tensor weights = Tensor::zeros(DType::kF32, {3, 2});
  ids.data_as<std::int32_t>()[3] = static_cast<std::int32_t>(config_.num_experts);  // out of range
  EXPECT_NE(error(x, MoeRouting{ids, weights, {}, {}}, out, options).find("ids"),
            std::string::npos);
  Mxfp4MoeOptions wide = options;
  wide.top_k = config_.num_experts + 1;
  EXPECT_NE(error(x, by_router, out, wide).find("options.top_k"), std::string::npos);
  Mxfp4MoeOptions small = options;
  small.max_tokens = 2;
  EXPECT_NE(error(x, by_router, out, small).find("max_tokens"), std::string::npos);
  // A prepared tensor of the wrong shape: another rank's.
  const MoeRank other{0, 1, 0, 2};  // half the experts
  Prepared wrong = allocate(prepared_moe_shapes(layer_shape_, other));
  EXPECT_NE(testing::error_of([&] {
              mxfp4_moe(x, wrong.view(), layer_shape_, rank, by_router, options, out, {});
            }).find("prepared.w13: expected"),
            std::string::npos);
  // Expert tensors that are neither every expert nor this rank's.
  Experts cut = experts_;
  cut.w13 = Tensor::zeros(DType::kU8, {2, 2 * config_.intermediate_size, h / 2});
  EXPECT_NE(testing::error_of([&] {
              prepare_mxfp4_moe(cut.view(), layer_shape_, rank, prepared.view());
            }).find("experts.w13: expected [E = 6"),
            std::string::npos);
}

// The CUDA kernels read x, the router and the packed weights in 16-byte vectors: a device view at
// an element offset (a slice of a larger buffer) is refused by name before the device is touched
// (the views below are labelled CUDA over host memory; nothing reads them).
TEST_F(Mxfp4MoeOp, MisalignedDeviceInputsAreRefusedBeforeAnyLaunch) {
  const MoeRank rank{};
  const PreparedMoeShapes s = prepared_moe_shapes(layer_shape_, rank);
  const std::int64_t h = config_.hidden_size;
  std::vector<std::uint8_t> bytes(1 << 20);
  auto* const base = bytes.data() + (16 - reinterpret_cast<std::uintptr_t>(bytes.data()) % 16);
  const auto on_device = [&](std::size_t offset, DType dtype, const Shape& shape) {
    return TensorView(base + offset, dtype, shape, Device::cuda());
  };
  PreparedMoe prepared;
  prepared.w13 = on_device(0, DType::kU8, s.w13);
  prepared.w13_scale = on_device(0, DType::kU8, s.w13_scale);
  prepared.w2 = on_device(0, DType::kU8, s.w2);
  prepared.w2_scale = on_device(0, DType::kU8, s.w2_scale);
  if (layer_shape_.has_bias) {
    prepared.w13_bias = on_device(0, DType::kBF16, s.w13_bias);
    prepared.w2_bias = on_device(0, DType::kBF16, s.w2_bias);
  }
  const TensorView router = on_device(0, DType::kBF16, {config_.num_experts, h});
  const TensorView out = on_device(0, DType::kBF16, {3, h});
  Mxfp4MoeOptions options;
  options.top_k = 2;
  const auto forward_error = [&](const TensorView& x, const PreparedMoe& p, const TensorView& r) {
    return testing::error_of([&] {
      mxfp4_moe(x, p, layer_shape_, rank, {{}, {}, r, {}}, options, out, {});
    });
  };
  const std::string expected = ": expected a 16-byte aligned address";
  EXPECT_NE(
      forward_error(on_device(2, DType::kBF16, {3, h}), prepared, router).find("x" + expected),
      std::string::npos);
  EXPECT_NE(forward_error(on_device(0, DType::kBF16, {3, h}), prepared,
                          on_device(8, DType::kBF16, {config_.num_experts, h}))
                .find("routing.router_weight" + expected),
            std::string::npos);
  PreparedMoe shifted = prepared;
  shifted.w2 = on_device(4, DType::kU8, s.w2);
  EXPECT_NE(forward_error(on_device(0, DType::kBF16, {3, h}), shifted, router)
                .find("prepared.w2" + expected),
            std::string::npos);
  const TensorView ids = on_device(0, DType::kI32, {3, 2});
  const TensorView weights = on_device(0, DType::kF32, {3, 2});
  EXPECT_NE(
      testing::error_of([&] {
        moe_route(on_device(2, DType::kBF16, {3, h}), router, {}, 2, ids, weights, {}, 0, nullptr);
      }).find("x" + expected),
      std::string::npos);
}

}  // namespace
}  // namespace mxq::moe
