// The engine-facing MoE op on the GPU (mxq/moe/mxfp4_moe.h): preparation on the device gives the
// host preparation's bytes; the forward matches the CPU op on the same prepared tensors (the
// DESIGN bound on bf16 outputs), per rank and summed over TP x EP ranks run one call each; a
// forward captured in a CUDA graph (global capture mode: any allocation inside would fail the
// capture) replays bitwise equal to eager; a too-small workspace is refused before any launch.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "moe/moe_test_util.h"
#include "mxq/core/cuda_check.h"
#include "mxq/formats/bf16.h"
#include "mxq/moe/checkpoint.h"
#include "mxq/moe/compare.h"
#include "mxq/moe/mxfp4_moe.h"
#include "mxq/moe/synthetic.h"

namespace mxq::moe {
namespace {

Tensor copy_of(const TensorView& view) {
  Tensor out = Tensor::empty(view.dtype(), view.shape());
  std::memcpy(out.data(), view.data(), view.nbytes());
  return out;
}

struct Set {  // six tensors: expert tensors or prepared ones
  Tensor t[6];
};

Set gpt_oss_experts(const MoeCheckpoint& checkpoint) {
  const std::string p = "model.layers.0.mlp.experts.";
  return {{copy_of(checkpoint.view(p + "gate_up_proj_blocks")),
           copy_of(checkpoint.view(p + "gate_up_proj_scales")),
           copy_of(checkpoint.view(p + "gate_up_proj_bias")),
           copy_of(checkpoint.view(p + "down_proj_blocks")),
           copy_of(checkpoint.view(p + "down_proj_scales")),
           copy_of(checkpoint.view(p + "down_proj_bias"))}};
}

Set on(const Set& s, Device device) {
  Set out;
  for (int i = 0; i < 6; ++i) out.t[i] = s.t[i].to(device);
  return out;
}

MoeExpertTensors experts_view(const Set& s) {
  return {CheckpointLayout::kGptOss, s.t[0], s.t[1], s.t[2], s.t[3], s.t[4], s.t[5]};
}
PreparedMoe prepared_view(const Set& s) { return {s.t[0], s.t[1], s.t[2], s.t[3], s.t[4], s.t[5]}; }

Set allocate(const PreparedMoeShapes& s, Device device) {
  const Shape shapes[6] = {s.w13, s.w13_scale, s.w13_bias, s.w2, s.w2_scale, s.w2_bias};
  const DType dtypes[6] = {DType::kU8, DType::kU8, DType::kBF16,
                           DType::kU8, DType::kU8, DType::kBF16};
  Set out;
  for (int i = 0; i < 6; ++i) {
    out.t[i] = Tensor::empty(dtypes[i], shapes[i], device);
    if (device.is_cuda()) {
      MXQ_CUDA_CHECK(cudaMemset(out.t[i].data(), 0xA5, out.t[i].nbytes()));
    } else {
      std::memset(out.t[i].data(), 0xA5, out.t[i].nbytes());
    }
  }
  return out;
}

Tensor bf16_of(const Tensor& x_f32) {
  Tensor out = Tensor::empty(DType::kBF16, x_f32.shape());
  auto* h = static_cast<std::uint16_t*>(out.data());
  for (std::int64_t i = 0; i < x_f32.numel(); ++i) h[i] = float_to_bf16(x_f32.data_as<float>()[i]);
  return out;
}

class Mxfp4MoeOpGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticSpec spec = testing::small_spec();
    spec.hidden = 256;
    spec.intermediate = 544;  // uneven over TP = 2 (288 + 256 channels) and padded to 384
    spec.experts = 8;
    write_synthetic_checkpoint(dir_.path(), spec);
    checkpoint_ = MoeCheckpoint::open(dir_.path());
    config_ = checkpoint_.resolve_config(0);
    layer_ = {config_.num_experts, config_.hidden_size, config_.intermediate_size, true};
    experts_ = gpt_oss_experts(checkpoint_);
    router_ = copy_of(checkpoint_.view("model.layers.0.mlp.router.weight"));
    router_bias_ = copy_of(checkpoint_.view("model.layers.0.mlp.router.bias"));
    MXQ_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override { MXQ_CUDA_CHECK(cudaStreamDestroy(stream_)); }

  testing::TempDir dir_{"ckpt"};
  MoeCheckpoint checkpoint_;
  MoeConfig config_;
  MoeLayerShape layer_;
  Set experts_;
  Tensor router_, router_bias_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(Mxfp4MoeOpGpu, DevicePreparationGivesTheHostBytes) {
  const Set experts_dev = on(experts_, Device::cuda());
  for (const ActivationQuant quant : {ActivationQuant::kBf16, ActivationQuant::kFp8Group128}) {
    for (const auto& [tp, ep] : {std::pair{1, 1}, {2, 2}, {4, 1}}) {
      for (int t = 0; t < tp; ++t) {
        for (int e = 0; e < ep; ++e) {
          MoeRank rank{t, tp, e, ep};
          rank.activation_quant = quant;
          const PreparedMoeShapes s = prepared_moe_shapes(layer_, rank);
          Set host = allocate(s, Device::cpu());
          prepare_mxfp4_moe(experts_view(experts_), layer_, rank, prepared_view(host));
          Set dev = allocate(s, Device::cuda());
          prepare_mxfp4_moe(experts_view(experts_dev), layer_, rank, prepared_view(dev), stream_);
          MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
          for (int i = 0; i < 6; ++i) {
            const Tensor back = dev.t[i].to(Device::cpu());
            EXPECT_EQ(std::memcmp(back.data(), host.t[i].data(), back.nbytes()), 0)
                << "tensor " << i << " tp " << t << "/" << tp << " ep " << e << "/" << ep << " "
                << to_string(quant);
          }
        }
      }
    }
  }
}

// Every rank of a TP x EP split run as its own call (as one process per rank would), on the
// device and on the CPU from the same prepared tensors; each rank's partial and their sum
// within the bound.
TEST_F(Mxfp4MoeOpGpu, RankPartialsMatchTheCpuOpAndSumOverTheRanks) {
  const std::int64_t h = config_.hidden_size;
  for (const std::int64_t tokens : {1, 7, 300}) {
    const Tensor x = synthetic_tokens(tokens, h, 3);
    const Tensor x_dev = bf16_of(x).to(Device::cuda());
    for (const auto& [tp, ep] : {std::pair{1, 1}, {2, 2}}) {
      std::vector<float> sum_cpu(static_cast<std::size_t>(tokens * h), 0.0F);
      std::vector<float> sum_gpu(sum_cpu.size(), 0.0F);
      for (int t = 0; t < tp; ++t) {
        for (int e = 0; e < ep; ++e) {
          const MoeRank rank{t, tp, e, ep};
          const PreparedMoeShapes s = prepared_moe_shapes(layer_, rank);
          Set host = allocate(s, Device::cpu());
          prepare_mxfp4_moe(experts_view(experts_), layer_, rank, prepared_view(host));
          const Set dev = on(host, Device::cuda());  // the same prepared bytes, moved
          Mxfp4MoeOptions options;
          options.top_k = config_.top_k;
          options.max_tokens = tokens;
          Tensor out_cpu = Tensor::empty(DType::kF32, {tokens, h});
          mxfp4_moe(x, prepared_view(host), layer_, rank, {{}, {}, router_, router_bias_}, options,
                    out_cpu, {});
          const Tensor router_dev = router_.to(Device::cuda());
          const Tensor bias_dev = router_bias_.to(Device::cuda());
          Tensor workspace = Tensor::zeros(DType::kU8,
                                           {static_cast<std::int64_t>(mxfp4_moe_workspace_bytes(
                                               layer_, rank, options, Device::cuda()))},
                                           Device::cuda());
          Tensor out_dev = Tensor::empty(DType::kF32, {tokens, h}, Device::cuda());
          MXQ_CUDA_CHECK(cudaMemset(out_dev.data(), 0xFF, out_dev.nbytes()));  // NaN poison
          mxfp4_moe(x_dev, prepared_view(dev), layer_, rank, {{}, {}, router_dev, bias_dev},
                    options, out_dev, workspace, stream_);
          MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
          const Tensor got = out_dev.to(Device::cpu());
          std::int64_t nan_mismatches = 0;
          const double error = normalized_error(got, out_cpu, &nan_mismatches);
          EXPECT_LE(error, 4e-3) << "T " << tokens << " rank " << t << "," << e;
          EXPECT_EQ(nan_mismatches, 0);
          for (std::size_t i = 0; i < sum_cpu.size(); ++i) {
            sum_cpu[i] += out_cpu.data_as<float>()[i];
            sum_gpu[i] += got.data_as<float>()[i];
          }
        }
      }
      const Tensor a(Tensor::empty(DType::kF32, {tokens, h}));
      const Tensor b(Tensor::empty(DType::kF32, {tokens, h}));
      std::memcpy(a.data(), sum_gpu.data(), a.nbytes());
      std::memcpy(b.data(), sum_cpu.data(), b.nbytes());
      std::int64_t nan_mismatches = 0;
      EXPECT_LE(normalized_error(a, b, &nan_mismatches), 4e-3)
          << "T " << tokens << " " << tp << "x" << ep;
    }
  }
}

TEST_F(Mxfp4MoeOpGpu, AGraphReplayEqualsEagerAndTheForwardAllocatesNothing) {
  const std::int64_t h = config_.hidden_size;
  const MoeRank rank{};
  const PreparedMoeShapes s = prepared_moe_shapes(layer_, rank);
  const Set dev = allocate(s, Device::cuda());
  const Set experts_dev = on(experts_, Device::cuda());
  prepare_mxfp4_moe(experts_view(experts_dev), layer_, rank, prepared_view(dev), stream_);
  Mxfp4MoeOptions options;
  options.top_k = config_.top_k;
  options.max_tokens = 512;
  Tensor workspace = Tensor::zeros(
      DType::kU8,
      {static_cast<std::int64_t>(mxfp4_moe_workspace_bytes(layer_, rank, options, Device::cuda()))},
      Device::cuda());
  const Tensor router_dev = router_.to(Device::cuda());
  for (const std::int64_t tokens : {1, 64, 512}) {
    const Tensor x_dev = bf16_of(synthetic_tokens(tokens, h, 9)).to(Device::cuda());
    Tensor eager = Tensor::empty(DType::kBF16, {tokens, h}, Device::cuda());
    Tensor replayed = Tensor::empty(DType::kBF16, {tokens, h}, Device::cuda());
    const MoeRouting routing{{}, {}, router_dev, {}};
    mxfp4_moe(x_dev, prepared_view(dev), layer_, rank, routing, options, eager, workspace, stream_);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    mxfp4_moe(x_dev, prepared_view(dev), layer_, rank, routing, options, replayed, workspace,
              stream_);
    MXQ_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MXQ_CUDA_CHECK(cudaMemsetAsync(replayed.data(), 0xFF, replayed.nbytes(), stream_));
    for (int i = 0; i < 3; ++i) MXQ_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const Tensor a = eager.to(Device::cpu());
    const Tensor b = replayed.to(Device::cpu());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "T " << tokens;
    MXQ_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MXQ_CUDA_CHECK(cudaGraphDestroy(graph));
  }
}

TEST_F(Mxfp4MoeOpGpu, TheRouterAloneOnTheDeviceRoutesAsTheCpu) {
  const std::int64_t h = config_.hidden_size;
  for (const std::int64_t tokens : {1, 33, 1000, 2000}) {  // 2000: 32-row routing blocks
    const Tensor x = synthetic_tokens(tokens, h, 4);
    Tensor ids = Tensor::empty(DType::kI32, {tokens, config_.top_k});
    Tensor weights = Tensor::empty(DType::kF32, {tokens, config_.top_k});
    moe_route(x, router_, router_bias_, config_.top_k, ids, weights, {});
    const Tensor x_dev = bf16_of(x).to(Device::cuda());
    Tensor ids_dev = Tensor::empty(DType::kI32, {tokens, config_.top_k}, Device::cuda());
    Tensor weights_dev = Tensor::empty(DType::kF32, {tokens, config_.top_k}, Device::cuda());
    Tensor workspace =
        Tensor::zeros(DType::kU8,
                      {static_cast<std::int64_t>(moe_route_workspace_bytes(
                          config_.num_experts, h, config_.top_k, tokens, Device::cuda()))},
                      Device::cuda());
    moe_route(x_dev, router_.to(Device::cuda()), router_bias_.to(Device::cuda()), config_.top_k,
              ids_dev, weights_dev, workspace, tokens, stream_);
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const Tensor got_ids = ids_dev.to(Device::cpu());
    const Tensor got_weights = weights_dev.to(Device::cpu());
    EXPECT_EQ(std::memcmp(got_ids.data(), ids.data(), ids.nbytes()), 0) << "T " << tokens;
    for (std::int64_t i = 0; i < weights.numel(); ++i) {
      ASSERT_NEAR(got_weights.data_as<float>()[i], weights.data_as<float>()[i], 1e-5) << i;
    }
  }
}

// A token's logits are summed in one fixed order whatever the routing kernel's block shape (8 or
// 32 router rows a block, one token group or many), so its choices and weights do not depend on
// the batch it arrives in: the first tokens of a 2000-token batch route bit for bit as a batch of
// 1000 and of 16.
TEST_F(Mxfp4MoeOpGpu, ATokensDeviceRoutingDoesNotDependOnItsBatch) {
  const std::int64_t h = config_.hidden_size;
  const std::int64_t k = config_.top_k;
  const Tensor x = bf16_of(synthetic_tokens(2000, h, 7)).to(Device::cuda());
  const Tensor router = router_.to(Device::cuda());
  const Tensor bias = router_bias_.to(Device::cuda());
  const auto route = [&](std::int64_t tokens) {
    const TensorView xv(x.data(), DType::kBF16, {tokens, h}, Device::cuda());
    Tensor ids = Tensor::empty(DType::kI32, {tokens, k}, Device::cuda());
    Tensor weights = Tensor::empty(DType::kF32, {tokens, k}, Device::cuda());
    Tensor workspace = Tensor::zeros(DType::kU8,
                                     {static_cast<std::int64_t>(moe_route_workspace_bytes(
                                         config_.num_experts, h, k, tokens, Device::cuda()))},
                                     Device::cuda());
    moe_route(xv, router, bias, k, ids, weights, workspace, tokens, stream_);
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return std::make_pair(ids.to(Device::cpu()), weights.to(Device::cpu()));
  };
  const auto all = route(2000);
  for (const std::int64_t tokens : {1000, 16}) {
    const auto part = route(tokens);
    const std::size_t bytes = static_cast<std::size_t>(tokens * k) * 4;
    EXPECT_EQ(std::memcmp(part.first.data(), all.first.data(), bytes), 0) << "ids, T " << tokens;
    EXPECT_EQ(std::memcmp(part.second.data(), all.second.data(), bytes), 0)
        << "weights, T " << tokens;
  }
}

TEST_F(Mxfp4MoeOpGpu, ATooSmallWorkspaceIsRefusedBeforeAnyLaunch) {
  const MoeRank rank{};
  const Set dev = allocate(prepared_moe_shapes(layer_, rank), Device::cuda());
  Mxfp4MoeOptions options;
  options.top_k = config_.top_k;
  options.max_tokens = 64;
  const std::size_t need = mxfp4_moe_workspace_bytes(layer_, rank, options, Device::cuda());
  Tensor small = Tensor::zeros(DType::kU8, {static_cast<std::int64_t>(need) - 256}, Device::cuda());
  const Tensor x_dev = Tensor::zeros(DType::kBF16, {4, config_.hidden_size}, Device::cuda());
  Tensor out = Tensor::empty(DType::kBF16, {4, config_.hidden_size}, Device::cuda());
  const Tensor router_dev = router_.to(Device::cuda());
  const std::string error = testing::error_of([&] {
    mxfp4_moe(x_dev, prepared_view(dev), layer_, rank, {{}, {}, router_dev, {}}, options, out,
              small, stream_);
  });
  EXPECT_NE(error.find("workspace: expected at least"), std::string::npos) << error;
  // A host x with device weights: refused by name.
  const Tensor x_host = Tensor::zeros(DType::kBF16, {4, config_.hidden_size});
  EXPECT_NE(testing::error_of([&] {
              mxfp4_moe(x_host, prepared_view(dev), layer_, rank, {{}, {}, router_dev, {}}, options,
                        out, small, stream_);
            }).find("prepared.w13"),
            std::string::npos);
}

}  // namespace
}  // namespace mxq::moe
