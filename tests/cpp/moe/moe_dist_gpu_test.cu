// The distributed MoE layer on one GPU: a group of one rank (solo, and through NCCL) gives
// exactly MoeGpuLayer's result; bad groups are clear errors; `mxq moe` with one visible GPU
// simulates its TP ranks in-process, and joins a one-rank group when a launcher's variables say
// so (rendezvous + NCCL on one GPU), with the same output.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "moe/dist_test_util.h"
#include "mxq/dist/in_process.h"
#include "mxq/io/npy.h"
#include "mxq/moe/dist_layer.h"
#include "mxq/moe/gpu_layer.h"
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

TEST(MoeDistLayer, OneRankGroupEqualsMoeGpuLayer) {
  TempDir dir("ckpt");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  const MoeLayer layer = testing::load_dist_layer(dir.file("ckpt"), 1, 1);
  const Tensor x = input_with_nan_row(7, layer.config().hidden_size);
  const Tensor expected = MoeGpuLayer::upload(layer, 7).forward_host(x);
  dist::SoloCommunicator solo;
  const MoeDistLayer with_solo = MoeDistLayer::upload(layer, solo, 7, Device::cuda(0));
  EXPECT_EQ(with_solo.rank(), 0);
  EXPECT_EQ(with_solo.size(), 1);
  EXPECT_EQ(testing::value_differences(with_solo.forward_host(x), expected), 0);
#if MXQ_WITH_NCCL
  dist::NcclCommunicator nccl(0, 1, dist::nccl_unique_id(), 0);
  const MoeDistLayer with_nccl = MoeDistLayer::upload(layer, nccl, 7, Device::cuda(0));
  EXPECT_EQ(testing::value_differences(with_nccl.forward_host(x), expected), 0);
  // Precomputed routing (the CPU router's) through the same path.
  const MoeForwardResult cpu = layer.forward(x);
  EXPECT_EQ(testing::value_differences(with_nccl.forward_host(x, &cpu.routing),
                                       MoeGpuLayer::upload(layer, 7).forward_host(x, &cpu.routing)),
            0);
#endif
}

TEST(MoeDistLayer, TheGroupMustMatchTheLayersRanks) {
  TempDir dir("ckpt");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  const MoeLayer tp2 = testing::load_dist_layer(dir.file("ckpt"), 2, 1);
  dist::SoloCommunicator solo;
  try {
    (void)MoeDistLayer::upload(tp2, solo, 4, Device::cuda(0));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "MoeDistLayer::upload: the layer's TP x EP ranks (2 x 1 = 2) must equal the "
                 "communicator's size; found 1");
  }
  // A communicator without device collectives fails at the all-reduce, clearly.
  const MoeLayer tp1 = testing::load_dist_layer(dir.file("ckpt"), 1, 1);
  dist::InProcessGroup group(1);
  const MoeDistLayer layer = MoeDistLayer::upload(tp1, group.rank(0), 4, Device::cuda(0));
  try {
    (void)layer.forward_host(synthetic_tokens(2, 128, 1));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce_device: this communicator has no device"),
              std::string::npos)
        << e.what();
  }
}

TEST(MoeDistLayer, UploadRankHoldsOneRank) {
  TempDir dir("ckpt");
  write_synthetic_checkpoint(dir.file("ckpt"), testing::dist_spec());
  const MoeLayer layer = testing::load_dist_layer(dir.file("ckpt"), 2, 2);
  const MoeGpuLayer rank3 = MoeGpuLayer::upload_rank(layer, 3, 4, Device::cuda(0));
  EXPECT_EQ(rank3.num_ranks(), 1);
  EXPECT_EQ(rank3.layer_rank(0), 3);
  EXPECT_THROW((void)MoeGpuLayer::upload_rank(layer, 4, 4, Device::cuda(0)), Error);
  // forward_partial needs a layer of one rank.
  const MoeGpuLayer all = MoeGpuLayer::upload(layer, 4, Device::cuda(0));
  const Tensor x = Tensor::empty(DType::kBF16, {2, 128}, Device::cuda(0));
  const Tensor partial = Tensor::empty(DType::kF32, {2, 128}, Device::cuda(0));
  EXPECT_THROW(all.forward_partial(x, partial, nullptr), Error);
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
#endif
}

}  // namespace
}  // namespace mxq::moe
