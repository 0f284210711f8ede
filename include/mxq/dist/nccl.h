// NcclCommunicator: the Communicator of a group of GPUs, on NCCL; one rank per process (or per
// thread), one GPU per rank (NCCL does not allow two ranks of one communicator on one GPU).
// The collectives copy host bytes through device buffers on the communicator's own stream and
// wait for them: they serve setup and tuning (few, small), not the hot path. A collective that
// does not complete within the timeout (a rank died or never joined) aborts the communicator and
// throws; every later call throws too.
//
// Built only with NCCL (MXQ_WITH_NCCL, `mxq info` says; cmake/MxqNccl.cmake finds it). nccl.h
// itself stays private to mxq.
#pragma once

#if !MXQ_WITH_NCCL
#error "mxq/dist/nccl.h: this mxq was built without NCCL (MXQ_WITH_NCCL is 0)"
#endif

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "mxq/dist/communicator.h"
#include "mxq/dist/rendezvous.h"

namespace mxq::dist {

// The bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
using NcclUniqueId = std::array<std::uint8_t, 128>;

// ncclGetUniqueId: rank 0 makes one per group and hands it to the other ranks (Rendezvous).
NcclUniqueId nccl_unique_id();

// The NCCL version mxq runs with (ncclGetVersion, e.g. 22809 for 2.28.9).
int nccl_runtime_version();

class NcclCommunicator final : public Communicator {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(10);

  // Collective: joins as rank `rank` of `size` on CUDA device `device` (ncclCommInitRankConfig)
  // and returns once every rank has joined, or throws after `timeout`. Each call makes `device`
  // current on the calling thread while it runs and restores the previous device after. Use one
  // communicator from one thread at a time.
  NcclCommunicator(int rank, int size, const NcclUniqueId& id, int device,
                   std::chrono::milliseconds timeout = kDefaultTimeout);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  [[nodiscard]] int rank() const override;
  [[nodiscard]] int size() const override;
  [[nodiscard]] int device() const;

  // The lengths are checked across ranks first (a mismatch throws on every rank alike).
  void all_reduce(std::span<double> values, ReduceOp op) override;
  // The root and the length are agreed first (ranks passing different roots throw alike).
  void broadcast(std::vector<std::uint8_t>& bytes, int root) override;
  // Lengths first, then every rank's bytes padded to the longest, then trimmed.
  std::vector<std::vector<std::uint8_t>> all_gather(std::span<const std::uint8_t> bytes) override;
  // ncclAllReduce (ncclFloat) in place on `stream`; returns once it is enqueued. The device of
  // `data` must be this communicator's. A failure shows up as an error of a later call.
  void all_reduce_device(float* data, std::size_t count, ReduceOp op, void* stream) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Rank 0 makes the id, the rendezvous hands it to the other ranks, and every rank joins on
// `device` (-1: its local rank). Collective over the rendezvous' ranks.
std::unique_ptr<NcclCommunicator> make_nccl_communicator(
    Rendezvous& rendezvous, int device = -1,
    std::chrono::milliseconds timeout = NcclCommunicator::kDefaultTimeout);

}  // namespace mxq::dist
