// The collectives mxq needs from a process group: rank, size, all-reduce of doubles, broadcast
// and all-gather of bytes, and for the distributed layers an all-reduce of fp32 device memory
// enqueued on a CUDA stream. Every rank calls the same collectives in the same order (the
// autotuner's calls depend only on the tuning plan, never on what a rank has cached).
// Implementations: SoloCommunicator (one rank), InProcessGroup (ranks as threads of one
// process, for tests; in_process.h), NcclCommunicator (GPUs; nccl.h, built with NCCL). Setting
// up a group of processes: rendezvous.h. Every implementation passes the checks in
// tests/cpp/dist/communicator_contract.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mxq/core/error.h"

namespace mxq::dist {

enum class ReduceOp { kSum, kMin, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  // In place: values[i] becomes op over every rank's values[i]. Same length on every rank.
  virtual void all_reduce(std::span<double> values, ReduceOp op) = 0;
  // `bytes` of rank `root` replace `bytes` on every other rank (any length).
  virtual void broadcast(std::vector<std::uint8_t>& bytes, int root) = 0;
  // Every rank's bytes (any length per rank), indexed by rank.
  virtual std::vector<std::vector<std::uint8_t>> all_gather(
      std::span<const std::uint8_t> bytes) = 0;
  // The hot path of TP/EP layers: in place on `count` floats of device memory, enqueued on
  // `stream` (a cudaStream_t; void* keeps this header free of CUDA) without waiting for it.
  // `count` must be the same on every rank (not checked: checking would synchronize). Only
  // communicators of GPUs can do it; the default throws ErrorCode::kUnsupported.
  virtual void all_reduce_device(float* data, std::size_t count, ReduceOp op, void* stream);
};

inline void Communicator::all_reduce_device(float* /*data*/, std::size_t /*count*/, ReduceOp /*op*/,
                                            void* /*stream*/) {
  fail(ErrorCode::kUnsupported,
       "all_reduce_device: this communicator has no device collectives (use NcclCommunicator, "
       "or SoloCommunicator for one rank)");
}

// A group of one: every collective is the identity.
class SoloCommunicator final : public Communicator {
 public:
  [[nodiscard]] int rank() const override { return 0; }
  [[nodiscard]] int size() const override { return 1; }
  void all_reduce(std::span<double> /*values*/, ReduceOp /*op*/) override {}
  void broadcast(std::vector<std::uint8_t>& /*bytes*/, int root) override {
    if (root != 0) fail_argument(ErrorCode::kInvalidArgument, "broadcast root", "0..0", root);
  }
  std::vector<std::vector<std::uint8_t>> all_gather(std::span<const std::uint8_t> bytes) override {
    return {std::vector<std::uint8_t>(bytes.begin(), bytes.end())};
  }
  // One rank's data is already the result.
  void all_reduce_device(float* /*data*/, std::size_t /*count*/, ReduceOp /*op*/,
                         void* /*stream*/) override {}
};

}  // namespace mxq::dist
