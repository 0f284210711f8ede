// NcclCommunicator. The communicator is non-blocking (ncclConfig_t::blocking = 0) so that every
// wait, the join included, polls with a deadline: a rank that died or never came becomes an
// mxq::Error on the others instead of a hang.
#include "mxq/dist/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "mxq/core/cuda_check.h"
#include "mxq/core/device.h"
#include "mxq/core/error.h"
#include "mxq/core/log.h"

namespace mxq::dist {

static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<NcclUniqueId>,
              "NcclUniqueId must hold an ncclUniqueId");

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void nccl_fail(ncclResult_t result, const std::string& call, int rank) {
  fail(ErrorCode::kCuda, "NCCL call ", call, " failed on rank ", rank, ": ",
       ncclGetErrorString(result), " (", ncclGetLastError(nullptr), ")");
}

class Backoff {
 public:
  void wait() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(2000));
  }

 private:
  std::chrono::microseconds pause_{20};
};

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  fail(ErrorCode::kInvalidArgument, "all_reduce: unknown ReduceOp ", static_cast<int>(op));
}

}  // namespace

struct NcclCommunicator::State {
  int rank = 0;
  int size = 1;
  int device = 0;
  std::chrono::milliseconds timeout{};
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* buffer = nullptr;  // device staging, grown on demand
  std::size_t capacity = 0;
  std::string broken;  // why the communicator was aborted; empty while usable

  void check_usable() const {
    if (!broken.empty()) {
      fail(ErrorCode::kCuda, "NCCL communicator (rank ", rank, " of ", size,
           ") is unusable after an earlier failure: ", broken);
    }
  }

  // Aborts the communicator (every later call throws) and throws `message`.
  [[noreturn]] void abort(const std::string& message) {
    broken = message;
    if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    fail(ErrorCode::kCuda, message);
  }

  // Waits until the communicator has no operation in progress (a non-blocking communicator's
  // calls return ncclInProgress while they are being enqueued).
  void settle(const std::string& call) {
    const Clock::time_point deadline = Clock::now() + timeout;
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
      if (queried != ncclSuccess) nccl_fail(queried, "ncclCommGetAsyncError after " + call, rank);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        abort("NCCL call " + call + " failed on rank " + std::to_string(rank) + ": " +
              ncclGetErrorString(state) + " (" + ncclGetLastError(comm) + ")");
      }
      if (Clock::now() > deadline) {
        abort("NCCL call " + call + " on rank " + std::to_string(rank) + " of " +
              std::to_string(size) + " did not complete within " + std::to_string(timeout.count()) +
              " ms (a rank died or never joined?)");
      }
      backoff.wait();
    }
  }

  // Checks an NCCL call's result and waits until it is enqueued.
  void enqueued(ncclResult_t result, const std::string& call) {
    if (result != ncclSuccess && result != ncclInProgress) {
      broken = std::string("NCCL call ") + call + " failed: " + ncclGetErrorString(result);
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
      nccl_fail(result, call, rank);
    }
    settle(call);
  }

  // Waits for the stream, watching the communicator for errors and the deadline.
  void finish(const std::string& what) {
    const Clock::time_point deadline = Clock::now() + timeout;
    Backoff backoff;
    for (;;) {
      const cudaError_t status = cudaStreamQuery(stream);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) {
        ::mxq::detail::cuda_fail(status, ("cudaStreamQuery after " + what).c_str(), __FILE__,
                                 __LINE__);
      }
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        abort(what + " failed on rank " + std::to_string(rank) + ": " + ncclGetErrorString(state) +
              " (" + ncclGetLastError(comm) + ")");
      }
      if (Clock::now() > deadline) {
        abort(what + " on rank " + std::to_string(rank) + " of " + std::to_string(size) +
              " did not complete within " + std::to_string(timeout.count()) +
              " ms (a rank died, never joined, or called another collective?)");
      }
      backoff.wait();
    }
  }

  void reserve(std::size_t bytes) {
    if (bytes <= capacity) return;
    const std::size_t grown = std::max({bytes, 2 * capacity, std::size_t{4096}});
    if (buffer != nullptr) MXQ_CUDA_CHECK(cudaFree(buffer));  // the stream is idle here
    buffer = nullptr;
    capacity = 0;
    MXQ_CUDA_CHECK(cudaMalloc(&buffer, grown));
    capacity = grown;
  }

  [[nodiscard]] std::uint8_t* bytes_at(std::size_t offset) const {
    return static_cast<std::uint8_t*>(buffer) + offset;
  }

  // In-place all-reduce (max) of a few int64 agreements, e.g. {n, -n} gives the max and -min.
  std::vector<std::int64_t> agree_max(std::vector<std::int64_t> values, const char* what) {
    const std::size_t bytes = values.size() * sizeof(std::int64_t);
    reserve(bytes);
    MXQ_CUDA_CHECK(cudaMemcpyAsync(buffer, values.data(), bytes, cudaMemcpyHostToDevice, stream));
    enqueued(ncclAllReduce(buffer, buffer, values.size(), ncclInt64, ncclMax, comm, stream),
             std::string("ncclAllReduce (") + what + ")");
    MXQ_CUDA_CHECK(cudaMemcpyAsync(values.data(), buffer, bytes, cudaMemcpyDeviceToHost, stream));
    finish(what);
    return values;
  }
};

NcclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) nccl_fail(result, "ncclGetUniqueId", 0);
  NcclUniqueId out{};
  std::memcpy(out.data(), &id, out.size());
  return out;
}

int nccl_runtime_version() {
  int version = 0;
  const ncclResult_t result = ncclGetVersion(&version);
  if (result != ncclSuccess) nccl_fail(result, "ncclGetVersion", 0);
  return version;
}

NcclCommunicator::NcclCommunicator(int rank, int size, const NcclUniqueId& id, int device,
                                   std::chrono::milliseconds timeout)
    : state_(std::make_unique<State>()) {
  if (size < 1) fail_argument(ErrorCode::kInvalidArgument, "NCCL communicator size", ">= 1", size);
  if (rank < 0 || rank >= size) {
    fail_argument(ErrorCode::kInvalidArgument, "NCCL communicator rank",
                  "0.." + std::to_string(size - 1), rank);
  }
  if (timeout.count() <= 0)
    fail_argument(ErrorCode::kInvalidArgument, "NCCL timeout", "> 0 ms", timeout.count());
  int devices = 0;
  MXQ_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (device < 0 || device >= devices) {
    fail_argument(ErrorCode::kInvalidArgument, "CUDA device of NCCL rank " + std::to_string(rank),
                  "0.." + std::to_string(devices - 1) + " (GPUs visible to this process)", device);
  }
  State& s = *state_;
  s.rank = rank;
  s.size = size;
  s.device = device;
  s.timeout = timeout;
  const mxq::detail::DeviceScope scope(Device::cuda(device));
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  try {
    s.enqueued(ncclCommInitRankConfig(&s.comm, size, nccl_id, rank, &config),
               "ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " +
                   std::to_string(size) + ", device " + std::to_string(device) + ")");
  } catch (...) {
    cudaStreamDestroy(s.stream);
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  State& s = *state_;
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(s.device);
  if (s.comm != nullptr) {
    // Finalize flushes and waits for the peers to be quiescent; a peer that is gone must not
    // hang the destructor, so it gets the timeout and then an abort.
    bool clean = false;
    ncclResult_t result = ncclCommFinalize(s.comm);
    if (result == ncclSuccess || result == ncclInProgress) {
      const Clock::time_point deadline = Clock::now() + s.timeout;
      Backoff backoff;
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(s.comm, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < deadline) {
        backoff.wait();
      }
      clean = state == ncclSuccess;
    }
    if (clean) {
      result = ncclCommDestroy(s.comm);
      clean = result == ncclSuccess;
    }
    if (!clean) {
      log_warn("NCCL communicator of rank ", s.rank, " did not finalize cleanly; aborting it");
      ncclCommAbort(s.comm);
    }
  }
  if (s.buffer != nullptr) cudaFree(s.buffer);
  if (s.stream != nullptr) cudaStreamDestroy(s.stream);
  if (restore) cudaSetDevice(previous);
}

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return state_->size; }
int NcclCommunicator::device() const { return state_->device; }

void NcclCommunicator::all_reduce(std::span<double> values, ReduceOp op) {
  State& s = *state_;
  s.check_usable();
  const ncclRedOp_t nccl_op = to_nccl(op);
  const mxq::detail::DeviceScope scope(Device::cuda(s.device));
  const auto n = static_cast<std::int64_t>(values.size());
  const std::vector<std::int64_t> lengths = s.agree_max({n, -n}, "all_reduce lengths");
  if (lengths[0] != -lengths[1]) {
    fail(ErrorCode::kInvalidArgument, "all_reduce: ranks passed different lengths (from ",
         -lengths[1], " to ", lengths[0], " values; rank ", s.rank, " passed ", n, ")");
  }
  if (n == 0) return;
  const std::size_t bytes = values.size() * sizeof(double);
  s.reserve(bytes);
  MXQ_CUDA_CHECK(cudaMemcpyAsync(s.buffer, values.data(), bytes, cudaMemcpyHostToDevice, s.stream));
  s.enqueued(
      ncclAllReduce(s.buffer, s.buffer, values.size(), ncclDouble, nccl_op, s.comm, s.stream),
      "ncclAllReduce");
  MXQ_CUDA_CHECK(cudaMemcpyAsync(values.data(), s.buffer, bytes, cudaMemcpyDeviceToHost, s.stream));
  s.finish("all_reduce");
}

void NcclCommunicator::broadcast(std::vector<std::uint8_t>& bytes, int root) {
  State& s = *state_;
  s.check_usable();
  if (root < 0 || root >= s.size) {
    fail_argument(ErrorCode::kInvalidArgument, "broadcast root", "0.." + std::to_string(s.size - 1),
                  root);
  }
  const mxq::detail::DeviceScope scope(Device::cuda(s.device));
  // {root, -root} checks that all ranks name the same root; the root's length wins the max as
  // the others contribute 0.
  const auto length = static_cast<std::int64_t>(s.rank == root ? bytes.size() : 0);
  const std::vector<std::int64_t> agreed = s.agree_max({root, -root, length}, "broadcast length");
  if (agreed[0] != -agreed[1]) {
    fail(ErrorCode::kInvalidArgument, "broadcast: ranks passed different roots (from ", -agreed[1],
         " to ", agreed[0], "; rank ", s.rank, " passed ", root, ")");
  }
  const auto n = static_cast<std::size_t>(agreed[2]);
  if (s.rank != root) bytes.assign(n, 0);
  if (n == 0) return;
  s.reserve(n);
  if (s.rank == root) {
    MXQ_CUDA_CHECK(cudaMemcpyAsync(s.buffer, bytes.data(), n, cudaMemcpyHostToDevice, s.stream));
  }
  s.enqueued(ncclBroadcast(s.buffer, s.buffer, n, ncclUint8, root, s.comm, s.stream),
             "ncclBroadcast");
  if (s.rank != root) {
    MXQ_CUDA_CHECK(cudaMemcpyAsync(bytes.data(), s.buffer, n, cudaMemcpyDeviceToHost, s.stream));
  }
  s.finish("broadcast");
}

std::vector<std::vector<std::uint8_t>> NcclCommunicator::all_gather(
    std::span<const std::uint8_t> bytes) {
  State& s = *state_;
  s.check_usable();
  const mxq::detail::DeviceScope scope(Device::cuda(s.device));
  const auto ranks = static_cast<std::size_t>(s.size);
  const auto me = static_cast<std::size_t>(s.rank);
  // Every rank's length: an all-gather of one int64 each.
  std::vector<std::int64_t> lengths(ranks);
  const auto mine = static_cast<std::int64_t>(bytes.size());
  s.reserve(ranks * sizeof(std::int64_t));
  MXQ_CUDA_CHECK(cudaMemcpyAsync(s.bytes_at(me * sizeof(std::int64_t)), &mine, sizeof mine,
                                 cudaMemcpyHostToDevice, s.stream));
  s.enqueued(ncclAllGather(s.bytes_at(me * sizeof(std::int64_t)), s.buffer, 1, ncclInt64, s.comm,
                           s.stream),
             "ncclAllGather (lengths)");
  MXQ_CUDA_CHECK(cudaMemcpyAsync(lengths.data(), s.buffer, ranks * sizeof(std::int64_t),
                                 cudaMemcpyDeviceToHost, s.stream));
  s.finish("all_gather lengths");
  const auto longest = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<std::vector<std::uint8_t>> out(ranks);
  if (longest > 0) {
    // In place: rank r's padded bytes sit at r * longest; the padding is never read back.
    s.reserve(ranks * longest);
    if (!bytes.empty()) {
      MXQ_CUDA_CHECK(cudaMemcpyAsync(s.bytes_at(me * longest), bytes.data(), bytes.size(),
                                     cudaMemcpyHostToDevice, s.stream));
    }
    s.enqueued(
        ncclAllGather(s.bytes_at(me * longest), s.buffer, longest, ncclUint8, s.comm, s.stream),
        "ncclAllGather");
    std::vector<std::uint8_t> all(ranks * longest);
    MXQ_CUDA_CHECK(
        cudaMemcpyAsync(all.data(), s.buffer, all.size(), cudaMemcpyDeviceToHost, s.stream));
    s.finish("all_gather");
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto begin = all.begin() + static_cast<std::ptrdiff_t>(r * longest);
      out[r].assign(begin, begin + lengths[r]);
    }
  }
  return out;
}

void NcclCommunicator::all_reduce_device(float* data, std::size_t count, ReduceOp op,
                                         void* stream) {
  State& s = *state_;
  s.check_usable();
  if (count == 0) return;
  const ncclRedOp_t nccl_op = to_nccl(op);
  const mxq::detail::DeviceScope scope(Device::cuda(s.device));
  s.enqueued(ncclAllReduce(data, data, count, ncclFloat, nccl_op, s.comm,
                           static_cast<cudaStream_t>(stream)),
             "ncclAllReduce (device, " + std::to_string(count) + " floats)");
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(Rendezvous& rendezvous, int device,
                                                         std::chrono::milliseconds timeout) {
  const RankInfo& ranks = rendezvous.ranks();
  NcclUniqueId id{};
  if (ranks.rank == 0) id = nccl_unique_id();
  const std::vector<std::uint8_t> shared = rendezvous.share_from_rank0(id);
  if (shared.size() != id.size()) {
    fail_argument(ErrorCode::kFormat, "NCCL id from the rendezvous in " + rendezvous.options().dir,
                  std::to_string(id.size()) + " bytes", shared.size());
  }
  std::copy(shared.begin(), shared.end(), id.begin());
  return std::make_unique<NcclCommunicator>(ranks.rank, ranks.size, id,
                                            device < 0 ? ranks.local_rank : device, timeout);
}

}  // namespace mxq::dist
