// Ranks as threads of one process: InProcessGroup(n) hands out n communicators that meet in
// shared memory. For tests of multi-rank logic without GPUs. A collective that not every rank
// joins within the timeout throws mxq::Error on the ranks that are waiting (a hang becomes a
// test failure), and a rank calling a different collective than the others is an error on all.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mxq/dist/communicator.h"

namespace mxq::dist {

class InProcessGroup {
 public:
  explicit InProcessGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  [[nodiscard]] int size() const { return size_; }
  // The communicator of rank `rank`; use each from one thread only.
  Communicator& rank(int rank);

 private:
  class Member;
  friend class Member;

  // Deposits this rank's contribution, waits for all, returns the combined result.
  std::vector<std::uint8_t> exchange(
      int rank, const std::string& kind, std::vector<std::uint8_t> contribution,
      std::vector<std::uint8_t> (*combine)(const std::vector<std::vector<std::uint8_t>>&, int, int),
      int arg);

  int size_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::uint64_t generation_ = 0;
  int waiting_ = 0;
  std::vector<std::vector<std::uint8_t>> slots_;
  std::vector<std::string> kinds_;
  std::vector<std::uint8_t> result_;
  std::string error_;  // set when the ranks disagreed on the collective
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace mxq::dist
