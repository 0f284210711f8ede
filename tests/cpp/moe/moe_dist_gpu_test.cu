// The distributed MoE layer on one GPU: a group of one rank (solo, and through NCCL) gives
// exactly MoeGpuLayer's result; bad groups and sizes are clear errors; every rank of a TP x EP
// split holds the prepared bytes of its own shard and its partial (the op's) adds up with the
// others' to the simulated ranks' output; `mxq moe` with one visible GPU simulates its TP ranks
// in-process, and joins a one-rank group when a launcher's variables say so (rendezvous + NCCL on
// one GPU), with the same output, and refuses a forced per-rank width there.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "moe/dist_test_util.h"
#include "mxq/dist/in_process.h"
#include "mxq/formats/bf16.h"
#include "mxq/io/npy.h"
#include "mxq/moe/checkpoint_experts.h"
#include "mxq/moe/dist_layer.h"
#include "mxq/moe/gpu_layer.h"
#include "mxq/moe/mxfp4_moe.h"
#if MXQ_WITH_NCCL
#include "mxq/dist/nccl.h"
#endif

namespace mxq::moe {
namespace {

using testing::TempDir;

int device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

Tensor input_with_nan_row(std::int64_t tokens, std::int64_t hidden) {
  Tensor x = synthetic_tokens(tokens, hidden, 5);
  x.data_as<float>()[hidden + 3] = std::nanf("");  // token 1: NaN output row on every path
  return x;
}

// Rank comm.rank() of layer 0 split tp x ep, padded to 128, on GPU 0.
MoeDistLayer rank_of(const MoeCheckpoint& checkpoint, dist::Communicator& comm, int tp, int ep,
                     int max_tokens) {
  return MoeDistLayer::from_checkpoint(checkpoint, 0, {}, comm, tp, ep, kDefaultAlignment,
                                       max_tokens, Device::cuda(0));
}

std::vector<std::uint8_t> host_bytes(const TensorView& device_view) {
  std::vector<std::uint8_t> out(device_view.nbytes());
  EXPECT_EQ(cudaMemcpy(out.data(), device_view.data(), out.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

TEST(MoeDistLayer, OneRankGroupEqualsMoeGpuLayer) {
  TempDir dir("ckpt");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(dir.file("ckpt"));
  const MoeLayer layer = testing::load_dist_layer(dir.file("ckpt"), 1, 1);
  const Tensor x = input_with_nan_row(7, layer.config().hidden_size);
  const Tensor expected = MoeGpuLayer::upload(layer, 7).forward_host(x);
  dist::SoloCommunicator solo;
  const MoeDistLayer with_solo = rank_of(checkpoint, solo, 1, 1, 7);
  EXPECT_EQ(with_solo.rank(), 0);
  EXPECT_EQ(with_solo.size(), 1);
  EXPECT_EQ(with_solo.max_tokens(), 7);
  EXPECT_EQ(with_solo.shapes().intermediate_size_per_partition_after_pad, 256);  // I = 192
  EXPECT_EQ(with_solo.tactic_name(7), MoeGpuLayer::upload(layer, 7).tactic_name(7));
  EXPECT_NE(with_solo.tune_problem(), nullptr);
  EXPECT_EQ(testing::value_differences(with_solo.forward_host(x), expected), 0);
  // No tokens: nothing runs, nothing is reduced.
  EXPECT_EQ(with_solo.forward_host(Tensor::empty(DType::kF32, {0, 128})).numel(), 0);
#if MXQ_WITH_NCCL
  dist::NcclCommunicator nccl(0, 1, dist::nccl_unique_id(), 0);
  const MoeDistLayer with_nccl = rank_of(checkpoint, nccl, 1, 1, 7);
  EXPECT_EQ(testing::value_differences(with_nccl.forward_host(x), expected), 0);
  // Precomputed routing (the CPU router's) through the same path.
  const MoeForwardResult cpu = layer.forward(x);
  EXPECT_EQ(testing::value_differences(with_nccl.forward_host(x, &cpu.routing),
                                       MoeGpuLayer::upload(layer, 7).forward_host(x, &cpu.routing)),
            0);
#endif
}

TEST(MoeDistLayer, TheGroupMustMatchTheSplit) {
  TempDir dir("ckpt");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(dir.file("ckpt"));
  dist::SoloCommunicator solo;
  try {
    (void)rank_of(checkpoint, solo, 2, 1, 4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "MoeDistLayer::from_checkpoint: tp_size x ep_size (2 x 1 = 2) must equal the "
                 "communicator's size; found 1");
  }
  EXPECT_NE(testing::error_of([&] {
              (void)MoeDistLayer::from_checkpoint(checkpoint, 0, {}, solo, 1, 1, kDefaultAlignment,
                                                  4, Device::cpu());
            }).find("device: expected a CUDA device"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              (void)rank_of(checkpoint, solo, 1, 1, 0);
            }).find("max_tokens: expected >= 1"),
            std::string::npos);
  // A communicator without device collectives fails at the all-reduce, clearly.
  dist::InProcessGroup group(1);
  const MoeDistLayer layer = rank_of(checkpoint, group.rank(0), 1, 1, 4);
  try {
    (void)layer.forward_host(synthetic_tokens(2, 128, 1));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce_device: this communicator has no device"),
              std::string::npos)
        << e.what();
  }
  // More tokens than max_tokens are refused before anything runs.
  EXPECT_NE(testing::error_of([&] {
              (void)layer.forward_host(synthetic_tokens(5, 128, 1));
            }).find("at most 4 tokens"),
            std::string::npos);
}

TEST(MoeDistLayer, EachRankHoldsItsShardAndThePartialsSumToTheSimulatedRanks) {
  TempDir dir("ckpt");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  const MoeCheckpoint checkpoint = MoeCheckpoint::open(dir.file("ckpt"));
  const CheckpointExperts whole = read_checkpoint_experts(checkpoint, 0);
  const std::int64_t tokens = 6;
  const std::int64_t hidden = whole.config.hidden_size;
  const Tensor x = input_with_nan_row(tokens, hidden);
  const Tensor x_bf16 = Tensor::empty(DType::kBF16, x.shape());
  auto* xb = static_cast<std::uint16_t*>(x_bf16.data());
  for (std::int64_t i = 0; i < x.numel(); ++i) xb[i] = float_to_bf16(x.data_as<float>()[i]);
  const Tensor x_dev = x_bf16.to(Device::cuda(0));
  const Tensor router_w = whole.router_weight.to(Device::cuda(0));
  const Tensor router_b = whole.router_bias.to(Device::cuda(0));
  for (const auto& [tp, ep] : {std::pair{2, 1}, {1, 2}, {2, 2}}) {
    const MoeLayer split = testing::load_dist_layer(dir.file("ckpt"), tp, ep);
    const Tensor simulated = MoeGpuLayer::upload(split, static_cast<int>(tokens)).forward_host(x);
    dist::InProcessGroup group(tp * ep);  // no collective runs: each rank's op is called alone
    std::vector<float> sum(static_cast<std::size_t>(tokens * hidden), 0.0F);
    for (int r = 0; r < tp * ep; ++r) {
      const std::string what =
          "tp " + std::to_string(tp) + " ep " + std::to_string(ep) + " rank " + std::to_string(r);
      const MoeDistLayer layer =
          rank_of(checkpoint, group.rank(r), tp, ep, static_cast<int>(tokens));
      const MoeRank& rank = layer.moe_rank();
      EXPECT_EQ(rank.tp_rank, r % tp) << what;
      EXPECT_EQ(rank.ep_rank, r / tp) << what;
      EXPECT_EQ(layer.shapes().tp, split.rank(r).shape().tp) << what;
      EXPECT_EQ(layer.shapes().ep, split.rank(r).shape().ep) << what;
      // Prepared on the device from its own part of the checkpoint: the bytes the host
      // preparation of the whole layer gives for this rank (one layout on every device).
      const PreparedMoeShapes& s = layer.shapes();
      const Tensor w13 = Tensor::empty(DType::kU8, s.w13);
      const Tensor w13_scale = Tensor::empty(DType::kU8, s.w13_scale);
      const Tensor w13_bias = Tensor::empty(DType::kBF16, s.w13_bias);
      const Tensor w2 = Tensor::empty(DType::kU8, s.w2);
      const Tensor w2_scale = Tensor::empty(DType::kU8, s.w2_scale);
      const Tensor w2_bias = Tensor::empty(DType::kBF16, s.w2_bias);
      prepare_mxfp4_moe(whole.expert_tensors(), whole.layer_shape(), rank,
                        {w13, w13_scale, w13_bias, w2, w2_scale, w2_bias});
      const PreparedMoe prepared = layer.prepared();
      EXPECT_EQ(host_bytes(prepared.w13), testing::bytes_of(w13)) << what;
      EXPECT_EQ(host_bytes(prepared.w13_scale), testing::bytes_of(w13_scale)) << what;
      EXPECT_EQ(host_bytes(prepared.w13_bias), testing::bytes_of(w13_bias)) << what;
      EXPECT_EQ(host_bytes(prepared.w2), testing::bytes_of(w2)) << what;
      EXPECT_EQ(host_bytes(prepared.w2_scale), testing::bytes_of(w2_scale)) << what;
      EXPECT_EQ(host_bytes(prepared.w2_bias), testing::bytes_of(w2_bias)) << what;
      // Its partial through the op, added in rank order as the simulation adds the ranks.
      Mxfp4MoeOptions options;
      options.top_k = whole.config.top_k;
      options.activation = whole.config.activation;
      options.swiglu_alpha = whole.config.swiglu_alpha;
      options.swiglu_limit = whole.config.swiglu_limit;
      options.max_tokens = tokens;
      const Tensor workspace =
          Tensor::zeros(DType::kU8,
                        {static_cast<std::int64_t>(mxfp4_moe_workspace_bytes(
                            layer.layer_shape(), rank, options, Device::cuda(0)))},
                        Device::cuda(0));
      const Tensor partial = Tensor::empty(DType::kF32, {tokens, hidden}, Device::cuda(0));
      mxfp4_moe(x_dev, prepared, layer.layer_shape(), rank, MoeRouting{{}, {}, router_w, router_b},
                options, partial, workspace);
      const Tensor host = partial.to(Device::cpu());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += host.data_as<float>()[i];
    }
    Tensor summed = Tensor::empty(DType::kF32, {tokens, hidden});
    for (std::size_t i = 0; i < sum.size(); ++i) summed.data_as<float>()[i] = round_to_bf16(sum[i]);
    EXPECT_EQ(testing::value_differences(summed, simulated), 0) << "tp " << tp << " ep " << ep;
  }
}

TEST(MxqMoeCli, OneGpuSimulatesRanksOrJoinsAOneRankGroup) {
  if (device_count() != 1) GTEST_SKIP() << "checks the one-GPU fallback; " << device_count();
  TempDir dir("cli");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  io::write_npy(dir.file("x.npy"), synthetic_tokens(5, 128, 3));
  const std::string common =
      "moe --checkpoint " + dir.file("ckpt") + " --input " + dir.file("x.npy") + " --device cuda ";
  const testing::CliResult tp2 =
      testing::run_cli("", common + "--tp 2 --json --output " + dir.file("tp2.npy"), dir, "tp2");
  ASSERT_EQ(tp2.exit_code, 0) << tp2.err;
  EXPECT_NE(tp2.out.find("\"mode\": \"in-process\""), std::string::npos) << tp2.out;
  EXPECT_NE(tp2.out.find("simulated in this process on its one GPU"), std::string::npos);
#if MXQ_WITH_NCCL
  const testing::CliResult solo =
      testing::run_cli("", common + "--json --output " + dir.file("solo.npy"), dir, "solo");
  ASSERT_EQ(solo.exit_code, 0) << solo.err;
  const testing::CliResult joined = testing::run_cli(
      "MXQ_RANK=0 MXQ_WORLD_SIZE=1 MXQ_RUN_ID=onegpu MXQ_RENDEZVOUS_DIR=" + dir.file("rdv"),
      common + "--json --output " + dir.file("joined.npy"), dir, "joined");
  ASSERT_EQ(joined.exit_code, 0) << joined.err;
  EXPECT_NE(joined.out.find("\"mode\": \"join\""), std::string::npos) << joined.out;
  EXPECT_EQ(testing::value_differences(io::read_npy(dir.file("joined.npy")),
                                       io::read_npy(dir.file("solo.npy"))),
            0);
  // A launcher's group of another size than --tp x --ep is refused before any work.
  const testing::CliResult wrong = testing::run_cli(
      "MXQ_RANK=0 MXQ_WORLD_SIZE=1", common + "--tp 2 --output " + dir.file("w.npy"), dir, "wrong");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("--tp x --ep = 2 but the mxq launcher started a group of 1"),
            std::string::npos)
      << wrong.err;
  // Under a launcher a rank reads only its own shard through the op, which splits I by the
  // automatic rule: a forced per-rank width is refused by name before any work.
  const testing::CliResult forced = testing::run_cli(
      "MXQ_RANK=0 MXQ_WORLD_SIZE=1",
      common + "--intermediate-per-rank 256 --output " + dir.file("f.npy"), dir, "forced");
  EXPECT_NE(forced.exit_code, 0);
  EXPECT_NE(forced.err.find("--intermediate-per-rank: expected 0 or the automatic width 192"),
            std::string::npos)
      << forced.err;
#endif
}

}  // namespace
}  // namespace mxq::moe
