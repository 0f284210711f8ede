// The in-process communicator (ranks as threads) and the solo one meet the communicator contract
// (communicator_contract.h, shared with the NCCL communicator's GPU test), and a group that
// cannot complete a collective fails on every rank instead of hanging.
#include "mxq/dist/in_process.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "dist/communicator_contract.h"

namespace mxq::dist {
namespace {

// Runs body(rank communicator) on one thread per rank and waits for all.
void on_every_rank(InProcessGroup& group, const std::function<void(Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) threads.emplace_back([&, r] { body(group.rank(r)); });
  for (auto& t : threads) t.join();
}

TEST(SoloCommunicator, MeetsTheContract) {
  SoloCommunicator solo;
  testing::check_communicator_contract(solo);
}

TEST(InProcessGroup, MeetsTheContractForSeveralGroupSizes) {
  for (const int size : {1, 2, 3, 5}) {
    SCOPED_TRACE("group of " + std::to_string(size));
    InProcessGroup group(size, std::chrono::seconds(60));
    on_every_rank(group, [](Communicator& comm) { testing::check_communicator_contract(comm); });
  }
}

TEST(InProcessGroup, DifferentAllReduceLengthsFailOnEveryRank) {
  InProcessGroup group(3, std::chrono::seconds(60));
  std::vector<std::string> errors(3);
  on_every_rank(group, [&](Communicator& comm) {
    errors[static_cast<std::size_t>(comm.rank())] = testing::mismatched_all_reduce_error(comm);
  });
  for (const std::string& error : errors)
    EXPECT_NE(error.find("different lengths"), std::string::npos) << error;
}

TEST(InProcessGroup, DifferentCollectivesFailOnEveryRank) {
  InProcessGroup group(2, std::chrono::seconds(60));
  std::vector<std::string> errors(2);
  on_every_rank(group, [&](Communicator& comm) {
    try {
      if (comm.rank() == 0) {
        std::vector<double> v = {1.0};
        comm.all_reduce(v, ReduceOp::kSum);
      } else {
        (void)comm.all_gather(testing::Bytes{1});
      }
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("rank 0 all_reduce; rank 1 all_gather"), std::string::npos) << error;
  }
}

TEST(InProcessGroup, AMissingRankIsATimeoutErrorNotAHang) {
  InProcessGroup group(3, std::chrono::milliseconds(200));
  std::string error;
  std::thread rank0([&] {
    try {
      std::vector<double> v = {1.0};
      group.rank(0).all_reduce(v, ReduceOp::kSum);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  rank0.join();
  EXPECT_NE(error.find("waited 200 ms in all_reduce"), std::string::npos) << error;
  EXPECT_NE(error.find("1 of 3 arrived"), std::string::npos) << error;
  EXPECT_THROW((void)group.rank(3), Error);
}

}  // namespace
}  // namespace mxq::dist
