// The CUDA MoE forward against the CPU reference (MoeLayer::forward) on identical quantized
// weights and inputs: shapes, top-k, activations, biases, padding, TP/EP splits, experts with
// no tokens, NaN rows, router vs precomputed routing, CUDA graph capture + replay; W4A8 layers
// (fp8_g128 activations) against the CPU's W4A8 reference on the same cases.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mxq/core/cuda_check.h"
#include "mxq/core/prng.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/compare.h"
#include "mxq/moe/cuda_moe_trace.h"
#include "mxq/moe/gpu_layer.h"
#include "mxq/moe/layer.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe {
namespace {

struct Case {
  const char* name;
  std::int64_t experts, hidden, inter, top_k, tokens;
  Activation activation;
  bool bias;
  int tp, ep;
  std::int64_t align;  // 0: not prepared (checkpoint layout)
  bool precomputed;    // routing given (the CPU router's decisions) instead of the GPU router
  bool nan_row;        // token 1 gets a NaN input
  // Scales spread over 40 binades (E8M0 100..139) instead of a few: W4A8's wgmma GEMMs then meet
  // many 128-wide chunks whose blocks cannot share one factor (w4a8_fold_chunk).
  bool scale_spread = false;
};

MoeConfig config_of(const Case& c, ActivationQuant quant) {
  MoeConfig config;
  config.activation_quant = quant;
  config.hidden_size = c.hidden;
  config.intermediate_size = c.inter;
  config.num_experts = c.experts;
  config.top_k = c.top_k;
  config.activation = c.activation;
  config.has_bias = c.bias;
  config.router = RouterKind::kTopkSoftmax;
  return config;
}

// Random checkpoint tensors loaded through the weight-update session (random FP4 codes, scales
// mostly 2^-9..2^-6 with a few above 2 so the wide-scale decode runs too; bf16 router, biases).
MoeLayer make_layer(const Case& c, std::uint64_t seed,
                    ActivationQuant quant = ActivationQuant::kBf16) {
  const MoeConfig config = config_of(c, quant);
  ShardOptions shards;
  shards.tp_size = c.tp;
  shards.ep_size = c.ep;
  MoeLayer layer = MoeLayer::create(config, 0, shards);
  layer.begin_update();
  Xoshiro256 rng(seed);
  const float row_gain = 1.0F / std::sqrt(static_cast<float>(c.hidden));
  for (const MoeTensorName& name : required_tensor_names(config, 0, CheckpointLayout::kGptOss)) {
    const TensorSpec spec = expected_tensor_spec(config, name.kind);
    Tensor t = Tensor::empty(spec.dtype, spec.shape);
    auto* bytes = static_cast<std::uint8_t*>(t.data());
    const std::size_t n = t.nbytes();
    if (is_scale(name.kind)) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t r = rng.next();
        if (c.scale_spread) {
          bytes[i] = static_cast<std::uint8_t>(100 + r % 40);
        } else {
          bytes[i] = (r % 1000 == 0) ? static_cast<std::uint8_t>(129 + r % 2)
                                     : static_cast<std::uint8_t>(118 + r % 4);
        }
      }
    } else if (spec.dtype == DType::kBF16) {
      auto* h = static_cast<std::uint16_t*>(t.data());
      const float amplitude = is_router(name.kind) ? 3.0F * row_gain : 0.1F;
      for (std::int64_t i = 0; i < t.numel(); ++i)
        h[i] = float_to_bf16(amplitude * rng.uniform_symmetric());
    } else {
      for (std::size_t i = 0; i < n; i += 8) {
        const std::uint64_t r = rng.next();
        std::memcpy(bytes + i, &r, std::min<std::size_t>(8, n - i));
      }
    }
    layer.load(format_tensor_name(name), t);
  }
  layer.end_update();
  if (c.align == 0) {
    layer.restore_checkpoint_layout();
  } else {
    layer.prepare(c.align);
  }
  return layer;
}

Tensor make_input(const Case& c, std::uint64_t seed) {
  Tensor x = synthetic_tokens(c.tokens, c.hidden, seed);
  if (c.nan_row && c.tokens > 1) x.data_as<float>()[c.hidden + 5] = std::nanf("");
  return x;
}

struct DeviceBuffers {
  Tensor x, out, ids, weights;
};

// Runs the GPU layer into a poisoned output; returns f32 [T, H].
Tensor run_gpu(const MoeGpuLayer& gpu, const Case& c, const Tensor& x_f32, const Routing* routing,
               cudaStream_t stream, bool capture_graph) {
  Tensor xb = Tensor::empty(DType::kBF16, x_f32.shape());
  auto* xh = static_cast<std::uint16_t*>(xb.data());
  for (std::int64_t i = 0; i < x_f32.numel(); ++i) xh[i] = float_to_bf16(x_f32.data_as<float>()[i]);
  DeviceBuffers d;
  d.x = xb.to(Device::cuda());
  d.out = Tensor::empty(DType::kBF16, {c.tokens, c.hidden}, Device::cuda());
  MXQ_CUDA_CHECK(cudaMemset(d.out.data(), 0xFF, d.out.nbytes()));  // NaN poison
  if (routing != nullptr) {
    d.ids = routing->ids.to(Device::cuda());
    d.weights = routing->weights.to(Device::cuda());
  }
  const TensorView ids = routing ? d.ids.view() : TensorView{};
  const TensorView weights = routing ? d.weights.view() : TensorView{};
  if (capture_graph) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    gpu.forward(d.x, d.out, stream, ids, weights);
    MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) MXQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MXQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
  } else {
    gpu.forward(d.x, d.out, stream, ids, weights);
  }
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  const Tensor host = d.out.to(Device::cpu());
  Tensor out = Tensor::empty(DType::kF32, host.shape());
  const auto* h = static_cast<const std::uint16_t*>(host.data());
  for (std::int64_t i = 0; i < out.numel(); ++i) out.data_as<float>()[i] = bf16_to_float(h[i]);
  return out;
}

// Where the output is off (printed when a comparison fails, to localize a kernel's fault from one
// run): the tokens whose rows are off, and for the first of them the error by blocks of 8 hidden
// rows (a lane's row pair, a warp's 16 rows, a warpgroup's 64 show as patterns).
std::string describe_mismatch(const Tensor& out, const Tensor& ref, std::int64_t hidden) {
  const std::int64_t tokens = out.numel() / hidden;
  const auto* o = out.data_as<float>();
  const auto* r = ref.data_as<float>();
  std::string text = "tokens off (row error / row norm > 1e-2):";
  std::int64_t first_bad = -1;
  int listed = 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    double err = 0.0;
    double norm = 0.0;
    for (std::int64_t h = 0; h < hidden; ++h) {
      const double d = static_cast<double>(o[t * hidden + h]) - r[t * hidden + h];
      err += std::isnan(d) ? 1e30 : d * d;
      norm += static_cast<double>(r[t * hidden + h]) * r[t * hidden + h];
    }
    if (err > 1e-4 * norm) {
      if (first_bad < 0) first_bad = t;
      if (listed++ < 16) text += " " + std::to_string(t);
    }
  }
  text += " (" + std::to_string(listed) + " of " + std::to_string(tokens) + ")";
  if (first_bad >= 0) {
    text += "; token " + std::to_string(first_bad) + ", relative error per 8 rows:";
    for (std::int64_t h0 = 0; h0 < hidden; h0 += 8) {
      double err = 0.0;
      double norm = 1e-30;
      for (std::int64_t h = h0; h < h0 + 8 && h < hidden; ++h) {
        const double d = static_cast<double>(o[first_bad * hidden + h]) - r[first_bad * hidden + h];
        err += d * d;
        norm += static_cast<double>(r[first_bad * hidden + h]) * r[first_bad * hidden + h];
      }
      char buf[16];
      std::snprintf(buf, sizeof(buf), " %.0e", std::sqrt(err / norm));
      text += buf;
    }
  }
  return text;
}

// The GPU layer's output on x against the CPU reference's: normalized error <= 4e-3, NaN at the
// same places (a NaN row gives NaN in every element of that token, and only there), and graph
// capture + replay reproducing the eager output bit for bit.
void expect_matches_reference(const MoeGpuLayer& gpu, const Case& c, const Tensor& x,
                              const MoeForwardResult& ref, const Routing* routing,
                              cudaStream_t stream) {
  const Tensor out = run_gpu(gpu, c, x, routing, stream, /*capture_graph=*/false);
  std::int64_t nan_mismatches = 0;
  const double error = normalized_error(out, ref.output, &nan_mismatches);
  EXPECT_EQ(nan_mismatches, 0) << c.name;
  EXPECT_LE(error, 4e-3) << c.name;
  if (nan_mismatches != 0 || !(error <= 4e-3)) {
    ADD_FAILURE() << c.name << ": " << describe_mismatch(out, ref.output, c.hidden);
  }
  if (c.nan_row) {
    for (std::int64_t h = 0; h < c.hidden; ++h)
      EXPECT_TRUE(std::isnan(out.data_as<float>()[c.hidden + h]));
    EXPECT_FALSE(std::isnan(out.data_as<float>()[0]));
  }
  const Tensor replayed = run_gpu(gpu, c, x, routing, stream, /*capture_graph=*/true);
  EXPECT_EQ(std::memcmp(replayed.data(), out.data(), out.nbytes()), 0) << c.name;
}

class MoeGpuVsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(MoeGpuVsCpu, MatchesTheReference) {
  const Case& c = GetParam();
  const MoeLayer layer = make_layer(c, 1000 + static_cast<std::uint64_t>(c.experts * c.hidden));
  const Tensor x = make_input(c, 77);
  const MoeForwardResult ref = layer.forward(x);
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreate(&stream));
  const Routing* routing = c.precomputed ? &ref.routing : nullptr;
  for (const gpu::GemmVariant variant :
       {gpu::GemmVariant::kDecodeMma, gpu::GemmVariant::kPrefillWgmma, gpu::GemmVariant::kAuto}) {
    SCOPED_TRACE(gpu::to_string(variant));
    const MoeGpuLayer gpu =
        MoeGpuLayer::upload(layer, static_cast<int>(c.tokens), Device::cuda(0), variant);
    expect_matches_reference(gpu, c, x, ref, routing, stream);
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

// W4A8: the layer quantizes x and GEMM1's activations to E4M3 groups of 128 on the device, as the
// CPU reference does, for both GEMM variants (prefill_wgmma: FP8 wgmma with folded block scales,
// and one factor per block where a chunk's scales spread too far).
class MoeGpuW4a8VsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(MoeGpuW4a8VsCpu, MatchesTheReference) {
  const Case& c = GetParam();
  const MoeLayer layer = make_layer(c, 1000 + static_cast<std::uint64_t>(c.experts * c.hidden),
                                    ActivationQuant::kFp8Group128);
  const Tensor x = make_input(c, 77);
  const MoeForwardResult ref = layer.forward(x);
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreate(&stream));
  const Routing* routing = c.precomputed ? &ref.routing : nullptr;
  for (const gpu::GemmVariant variant :
       {gpu::GemmVariant::kDecodeMma, gpu::GemmVariant::kPrefillWgmma, gpu::GemmVariant::kAuto}) {
    SCOPED_TRACE(gpu::to_string(variant));
    const MoeGpuLayer gpu =
        MoeGpuLayer::upload(layer, static_cast<int>(c.tokens), Device::cuda(0), variant);
    const gpu::GemmVariant runs = gpu.gemm_choice(c.tokens).gemm;
    if (variant != gpu::GemmVariant::kAuto) EXPECT_EQ(runs, variant);
    EXPECT_EQ(gpu.tactic_name(c.tokens), std::string("cuda.moe.w4a8.") + gpu::to_string(runs));
    expect_matches_reference(gpu, c, x, ref, routing, stream);
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

const Case kCases[] = {
    {"one_expert_k1", 1, 256, 256, 1, 1000, Activation::kSwigluOai, true, 1, 1, 128, false, false},
    {"e8_k2_clamp_nobias_t4096", 8, 256, 544, 2, 4096, Activation::kSwigluClamp, false, 1, 1, 128,
     true, false},
    {"e32_k4_plain_tp2", 32, 544, 256, 4, 64, Activation::kSwiglu, true, 2, 1, 128, false, true},
    {"e128_gptoss120b_t3", 128, 2880, 2880, 4, 3, Activation::kSwigluOai, true, 1, 1, 128, false,
     false},
    {"e128_gptoss120b_t1", 128, 2880, 2880, 4, 1, Activation::kSwigluOai, true, 1, 1, 128, false,
     false},
    {"e32_k8_tp3_unpadded", 32, 2880, 2880, 8, 16, Activation::kSwigluOai, true, 3, 1, 0, true,
     false},
    {"e8_k8_all_experts", 8, 544, 544, 8, 200, Activation::kSwigluOai, true, 1, 1, 128, false,
     false},
    {"e32_ep2_t1", 32, 256, 544, 4, 1, Activation::kSwigluOai, true, 1, 2, 128, false, false},
    // One token choosing every expert: GEMM1's grid has a row of tiles past the chosen ones.
    {"e8_k8_t1", 8, 544, 544, 8, 1, Activation::kSwigluOai, true, 1, 1, 128, false, false},
    // One token whose 8 x 70 GEMM1 tiles exceed a wave of resident blocks (528 on an H200): the
    // single-token GEMM1 shares tiles between blocks; K has a short last chunk, I is padded.
    {"e16_k8_i1120_t1", 16, 544, 1120, 8, 1, Activation::kSwigluOai, true, 1, 1, 128, false, false},
    // One token with more GEMM1 tiles (8 x 136) than two waves: the grid grows past a wave so
    // that no block's range is longer than two tiles.
    {"e16_k8_i2176_t1", 16, 256, 2176, 8, 1, Activation::kSwiglu, false, 1, 1, 128, false, false},
    {"e32_tp2_ep2_t64", 32, 256, 544, 4, 64, Activation::kSwigluClamp, true, 2, 2, 128, true,
     false},
    // One token over 3 TP ranks, unpadded: I_rank = 960, so GEMM2's K ends in a short chunk.
    {"e32_k4_tp3_unpadded_t1", 32, 2880, 2880, 4, 1, Activation::kSwigluOai, true, 3, 1, 0, false,
     false},
    // Full 128-slot tiles and ragged ones, with block scales far apart (scale_spread).
    {"e8_k2_scale_spread_t512", 8, 544, 544, 2, 512, Activation::kSwigluOai, true, 1, 1, 128, false,
     false, true},
};

INSTANTIATE_TEST_SUITE_P(Shapes, MoeGpuVsCpu, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

INSTANTIATE_TEST_SUITE_P(Shapes, MoeGpuW4a8VsCpu, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

// Experts with chosen slot counts (precomputed top-1 routing, tokens in a shuffled order) through
// the wgmma GEMMs, against the CPU reference, W4A16 and W4A8.
void expect_tiles_match_reference(Case c, const std::vector<int>& counts) {
  ASSERT_EQ(static_cast<std::int64_t>(counts.size()), c.experts);
  c.tokens = 0;
  for (const int n : counts) c.tokens += n;
  const std::int64_t tokens = c.tokens;
  std::vector<int> ids;
  for (std::size_t e = 0; e < counts.size(); ++e)
    ids.insert(ids.end(), counts[e], static_cast<int>(e));
  Xoshiro256 rng(11);
  for (std::size_t i = ids.size() - 1; i > 0; --i) std::swap(ids[i], ids[rng.next() % (i + 1)]);
  Routing routing{Tensor::empty(DType::kI32, {tokens, 1}), Tensor::empty(DType::kF32, {tokens, 1})};
  for (std::int64_t t = 0; t < tokens; ++t) {
    routing.ids.data_as<std::int32_t>()[t] = ids[static_cast<std::size_t>(t)];
    routing.weights.data_as<float>()[t] =
        0.5F + 0.5F * static_cast<float>(rng.next() % 1000) / 1000;
  }
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const ActivationQuant quant : {ActivationQuant::kBf16, ActivationQuant::kFp8Group128}) {
    SCOPED_TRACE(static_cast<int>(quant));
    const MoeLayer layer = make_layer(c, 21, quant);
    const Tensor x = make_input(c, 23);
    const MoeForwardResult ref = layer.forward(x, &routing);
    const MoeGpuLayer gpu = MoeGpuLayer::upload(layer, static_cast<int>(c.tokens), Device::cuda(0),
                                                gpu::GemmVariant::kPrefillWgmma);
    expect_matches_reference(gpu, c, x, ref, &routing, stream);
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Every tile width: 1, 16, 70 (n64 + n16), 90 (n64 + n32), 129 (n128 + n16), 150 (+ n32), 176 and
// 192 (+ n64: W4A16 takes a remainder of up to 64 slots into the expert's last tile), 193 (128 +
// 65: two tiles) and 320 (128 + 192). W4A8 takes up to 32 past 128 (129 and 150 one tile: n128 +
// n16 / n32; 176 and 192 a tile and a remainder).
TEST(MoeGpuLayer, EveryWorkTileWidthMatchesTheReference) {
  expect_tiles_match_reference(
      {"wide_tiles", 10, 256, 544, 1, 0, Activation::kSwigluOai, true, 1, 1, 128, true, false},
      {1, 16, 70, 90, 129, 150, 176, 192, 193, 320});
}

// The same tiles at gpt-oss's H = I = 2880: GEMM1's K ends in a short chunk of 2 MX blocks, and
// GEMM2 streams I = 2880 of the padded 2944.
TEST(MoeGpuLayer, WideWorkTilesAtGptOssWidthsMatchTheReference) {
  expect_tiles_match_reference({"wide_tiles_2880", 3, 2880, 2880, 1, 0, Activation::kSwigluOai,
                                true, 1, 1, 128, true, false},
                               {150, 40, 190});
}

// The block timeline of a trace build (-DMXQ_MOE_BLOCK_TRACE=ON; skipped otherwise): each block's
// points in order, and the kernels in order, as programmatic dependent launch promises — no block
// passes its griddepcontrol.wait before every block of the kernel before it has ended.
TEST(MoeGpuLayer, BlockTraceOrdersBlocksAndKernels) {
  if (!gpu::moe_block_trace_enabled()) GTEST_SKIP() << "built without MXQ_MOE_BLOCK_TRACE";
  for (const std::int64_t tokens : {std::int64_t{3}, std::int64_t{40}}) {  // one / 3 token groups
    SCOPED_TRACE(tokens);
    const Case c{"trace", 8, 256, 256, 2,     tokens, Activation::kSwigluOai,
                 true,    1, 1,   128, false, false};
    const MoeLayer layer = make_layer(c, 5);
    const MoeGpuLayer gpu = MoeGpuLayer::upload(layer, static_cast<int>(c.tokens), Device::cuda(0),
                                                gpu::GemmVariant::kDecodeMma);
    cudaStream_t stream;
    MXQ_CUDA_CHECK(cudaStreamCreate(&stream));
    (void)gpu::moe_block_trace_take();  // whatever ran before
    (void)run_gpu(gpu, c, make_input(c, 9), nullptr, stream, /*capture_graph=*/false);
    const auto trace = gpu::moe_block_trace_take();
    MXQ_CUDA_CHECK(cudaStreamDestroy(stream));

    constexpr int kStart = static_cast<int>(gpu::MoeTracePoint::kStart);
    constexpr int kReleased = static_cast<int>(gpu::MoeTracePoint::kReleased);
    constexpr int kMid = static_cast<int>(gpu::MoeTracePoint::kMid);
    constexpr int kEnd = static_cast<int>(gpu::MoeTracePoint::kEnd);
    std::uint64_t previous_end = 0;  // the last end of the kernel before
    for (int k = 0; k < gpu::kMoeTraceKernels; ++k) {
      SCOPED_TRACE(k);
      ASSERT_FALSE(trace[k].empty());
      std::uint64_t last_end = 0;
      int ended = 0;
      for (const gpu::MoeBlockTraceRecord& b : trace[k]) {
        EXPECT_GT(b.at_ns[kStart], 0U);  // every block of the grid started
        EXPECT_GE(b.at_ns[kReleased], b.at_ns[kStart]);
        if (k != 0) EXPECT_GE(b.at_ns[kReleased], previous_end);
        if (b.at_ns[kMid] != 0) EXPECT_GE(b.at_ns[kMid], b.at_ns[kReleased]);
        if (b.at_ns[kEnd] != 0) {
          EXPECT_GE(b.at_ns[kEnd], std::max(b.at_ns[kReleased], b.at_ns[kMid]));
          last_end = std::max(last_end, b.at_ns[kEnd]);
          ++ended;
        }
      }
      if (k == 0) {
        EXPECT_EQ(ended, 1);  // the routing's lists are built by one block
      } else {
        EXPECT_GT(ended, 0);
      }
      previous_end = last_end;
    }
  }
}

// Top-1 over 4 EP ranks: at T = 1 three of the ranks have no local choice (the single-token
// GEMM1 finds no tile), and each must still write a zero partial. Two tokens whose choices sit on
// different ranks run one after the other through the same layer, so a rank that skipped that
// write would keep the first token's partial.
TEST(MoeGpuLayer, SingleTokenRanksWithoutALocalChoiceWriteZeros) {
  const Case c{"e32_ep4_k1_t1", 32,   256, 256, 1, 1, Activation::kSwigluOai, true, 1, 4, 128,
               false,           false};
  const MoeLayer layer = make_layer(c, 21);
  const MoeGpuLayer gpu =
      MoeGpuLayer::upload(layer, 1, Device::cuda(0), gpu::GemmVariant::kDecodeMma);
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreate(&stream));
  int previous_rank = -1;
  int tokens_run = 0;
  for (std::uint64_t seed = 1; seed < 200 && tokens_run < 2; ++seed) {
    const Tensor x = make_input(c, seed);
    const MoeForwardResult ref = layer.forward(x);
    const int rank = ref.routing.ids.data_as<std::int32_t>()[0] / 8;  // 8 experts a rank
    if (rank == previous_rank) continue;
    SCOPED_TRACE(rank);
    expect_matches_reference(gpu, c, x, ref, nullptr, stream);
    previous_rank = rank;
    ++tokens_run;
  }
  EXPECT_EQ(tokens_run, 2);
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Mid-update the weights are half-loaded in checkpoint layout: an upload then is refused (a copy
// made then would serve torn weights until the next upload), and works again after the update.
TEST(MoeGpuLayer, UploadDuringAWeightUpdateIsRefused) {
  const Case c{"e8_k2_t1", 8, 256, 256, 2,     1,    Activation::kSwigluOai,
               true,       1, 1,   128, false, false};
  MoeLayer layer = make_layer(c, 3);
  layer.begin_update();
  try {
    (void)MoeGpuLayer::upload(layer, 1);
    ADD_FAILURE() << "an upload during a weight update was not refused";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MoeGpuLayer::upload during a weight update"),
              std::string::npos)
        << error.what();
  }
  layer.end_update();
  EXPECT_NO_THROW((void)MoeGpuLayer::upload(layer, 1));
}

// The combine writes 4 outputs a thread when the output is 8-byte aligned and one otherwise: a
// caller's view at any element offset gets the same bits.
TEST(MoeGpuLayer, OutputAtAnyAlignmentGetsTheSameBits) {
  const Case c{"e8_k4_t3", 8, 544, 544, 4,     3,    Activation::kSwigluOai,
               true,       1, 1,   128, false, false};
  const MoeLayer layer = make_layer(c, 5);
  const MoeGpuLayer gpu = MoeGpuLayer::upload(layer, c.tokens);
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const std::int64_t tokens : {std::int64_t{1}, c.tokens}) {
    SCOPED_TRACE(tokens);
    Tensor xb = Tensor::empty(DType::kBF16, {tokens, c.hidden});
    const Tensor x = synthetic_tokens(tokens, c.hidden, 9);
    auto* xh = static_cast<std::uint16_t*>(xb.data());
    for (std::int64_t i = 0; i < x.numel(); ++i) xh[i] = float_to_bf16(x.data_as<float>()[i]);
    const Tensor x_dev = xb.to(Device::cuda());
    const std::int64_t n = tokens * c.hidden;
    Tensor buffer = Tensor::empty(DType::kBF16, {n + 3}, Device::cuda());
    std::vector<std::uint16_t> first;
    for (int offset = 0; offset < 4; ++offset) {  // 8-, 2-, 4- and 2-byte aligned
      MXQ_CUDA_CHECK(cudaMemset(buffer.data(), 0xFF, buffer.nbytes()));
      const TensorView out(static_cast<std::uint16_t*>(buffer.data()) + offset, DType::kBF16,
                           {tokens, c.hidden}, Device::cuda());
      gpu.forward(x_dev, out, stream);
      MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<std::uint16_t> got(static_cast<std::size_t>(n));
      MXQ_CUDA_CHECK(cudaMemcpy(got.data(), out.data(), got.size() * 2, cudaMemcpyDeviceToHost));
      if (offset == 0) {
        first = got;
        EXPECT_FALSE(
            std::any_of(got.begin(), got.end(), [](std::uint16_t v) { return v == 0xFFFF; }));
      } else {
        EXPECT_EQ(got, first) << "offset " << offset;
      }
    }
  }
  MXQ_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(MoeGpuLayer, RejectsBadArguments) {
  const Case c{"small", 4, 64, 64, 2, 4, Activation::kSwigluOai, true, 1, 1, 128, false, false};
  const MoeLayer layer = make_layer(c, 3);
  const MoeGpuLayer gpu = MoeGpuLayer::upload(layer, 4);
  Tensor x = Tensor::empty(DType::kBF16, {5, 64}, Device::cuda());
  Tensor out = Tensor::empty(DType::kBF16, {5, 64}, Device::cuda());
  EXPECT_THROW(gpu.forward(x, out, nullptr), Error);  // more tokens than max_tokens
  Tensor x_host = Tensor::empty(DType::kBF16, {4, 64});
  Tensor out4 = Tensor::empty(DType::kBF16, {4, 64}, Device::cuda());
  EXPECT_THROW(gpu.forward(x_host, out4, nullptr), Error);  // host memory
  Tensor x_f32 = Tensor::empty(DType::kF32, {4, 64}, Device::cuda());
  EXPECT_THROW(gpu.forward(x_f32, out4, nullptr), Error);  // wrong dtype
  const TensorView x_misaligned(static_cast<std::uint16_t*>(x.data()) + 1, DType::kBF16, {4, 64},
                                Device::cuda());
  EXPECT_THROW(gpu.forward(x_misaligned, out4, nullptr), Error);  // not 16-byte aligned
}

}  // namespace
}  // namespace mxq::moe
