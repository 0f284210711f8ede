#include "mxq/dist/in_process.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "mxq/core/error.h"

namespace mxq::dist {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes to_bytes(std::span<const double> values) {
  Bytes out(values.size() * sizeof(double));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

Bytes reduce(const std::vector<Bytes>& slots, int op, int /*size*/) {
  const std::size_t bytes = slots[0].size();
  for (const Bytes& slot : slots) {
    if (slot.size() != bytes) {
      fail(ErrorCode::kInvalidArgument, "all_reduce: ranks passed different lengths (",
           bytes / sizeof(double), " vs ", slot.size() / sizeof(double), " values)");
    }
  }
  const std::size_t n = bytes / sizeof(double);
  std::vector<double> acc(n);
  std::vector<double> value(n);
  for (std::size_t r = 0; r < slots.size(); ++r) {
    if (n > 0) std::memcpy(value.data(), slots[r].data(), bytes);
    for (std::size_t i = 0; i < n; ++i) {
      if (r == 0) {
        acc[i] = value[i];
      } else if (op == static_cast<int>(ReduceOp::kSum)) {
        acc[i] += value[i];
      } else if (op == static_cast<int>(ReduceOp::kMin)) {
        acc[i] = std::min(acc[i], value[i]);
      } else {
        acc[i] = std::max(acc[i], value[i]);
      }
    }
  }
  return to_bytes(acc);
}

Bytes pick_root(const std::vector<Bytes>& slots, int root, int /*size*/) {
  return slots[static_cast<std::size_t>(root)];
}

// Length-prefixed concatenation of every rank's bytes.
Bytes concatenate(const std::vector<Bytes>& slots, int /*arg*/, int /*size*/) {
  Bytes out;
  for (const Bytes& slot : slots) {
    const std::uint64_t n = slot.size();
    const auto* p = reinterpret_cast<const std::uint8_t*>(&n);
    out.insert(out.end(), p, p + sizeof n);
    out.insert(out.end(), slot.begin(), slot.end());
  }
  return out;
}

}  // namespace

class InProcessGroup::Member final : public Communicator {
 public:
  Member(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}
  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return group_.size_; }

  void all_reduce(std::span<double> values, ReduceOp op) override {
    const Bytes result =
        group_.exchange(rank_, "all_reduce", to_bytes(values), reduce, static_cast<int>(op));
    if (!values.empty()) std::memcpy(values.data(), result.data(), result.size());
  }

  void broadcast(std::vector<std::uint8_t>& bytes, int root) override {
    if (root < 0 || root >= group_.size_) {
      fail_argument(ErrorCode::kInvalidArgument, "broadcast root",
                    "0.." + std::to_string(group_.size_ - 1), root);
    }
    bytes = group_.exchange(rank_, "broadcast from " + std::to_string(root),
                            rank_ == root ? bytes : Bytes{}, pick_root, root);
  }

  std::vector<Bytes> all_gather(std::span<const std::uint8_t> bytes) override {
    const Bytes result =
        group_.exchange(rank_, "all_gather", Bytes(bytes.begin(), bytes.end()), concatenate, 0);
    std::vector<Bytes> out;
    std::size_t at = 0;
    for (int r = 0; r < group_.size_; ++r) {
      std::uint64_t n = 0;
      std::memcpy(&n, result.data() + at, sizeof n);
      at += sizeof n;
      out.emplace_back(result.begin() + static_cast<std::ptrdiff_t>(at),
                       result.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
    }
    return out;
  }

 private:
  InProcessGroup& group_;
  int rank_;
};

InProcessGroup::InProcessGroup(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout) {
  if (size < 1) fail_argument(ErrorCode::kInvalidArgument, "InProcessGroup size", ">= 1", size);
  slots_.resize(static_cast<std::size_t>(size));
  kinds_.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) members_.push_back(std::make_unique<Member>(*this, r));
}

InProcessGroup::~InProcessGroup() = default;

Communicator& InProcessGroup::rank(int rank) {
  if (rank < 0 || rank >= size_) {
    fail_argument(ErrorCode::kInvalidArgument, "rank", "0.." + std::to_string(size_ - 1), rank);
  }
  return *members_[static_cast<std::size_t>(rank)];
}

std::vector<std::uint8_t> InProcessGroup::exchange(
    int rank, const std::string& kind, std::vector<std::uint8_t> contribution,
    std::vector<std::uint8_t> (*combine)(const std::vector<std::vector<std::uint8_t>>&, int, int),
    int arg) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!error_.empty()) fail(ErrorCode::kInternal, "in-process group is broken: ", error_);
  slots_[static_cast<std::size_t>(rank)] = std::move(contribution);
  kinds_[static_cast<std::size_t>(rank)] = kind;
  const std::uint64_t generation = generation_;
  if (++waiting_ == size_) {
    waiting_ = 0;
    ++generation_;
    const bool same = std::all_of(kinds_.begin(), kinds_.end(),
                                  [&](const std::string& k) { return k == kinds_[0]; });
    if (!same) {
      error_ = "ranks called different collectives:";
      for (int r = 0; r < size_; ++r)
        error_ += " rank " + std::to_string(r) + " " + kinds_[static_cast<std::size_t>(r)] + ";";
    } else {
      try {
        result_ = combine(slots_, arg, size_);
      } catch (const std::exception& e) {
        error_ = e.what();
      }
    }
    arrived_.notify_all();
  } else if (!arrived_.wait_for(lock, timeout_,
                                [&] { return generation_ != generation || !error_.empty(); })) {
    error_ = "rank " + std::to_string(rank) + " waited " + std::to_string(timeout_.count()) +
             " ms in " + kind + " for the other ranks (" + std::to_string(waiting_) + " of " +
             std::to_string(size_) + " arrived)";
    arrived_.notify_all();
    fail(ErrorCode::kInternal, "in-process collective timed out: ", error_);
  }
  if (!error_.empty()) fail(ErrorCode::kInternal, "in-process collective failed: ", error_);
  return result_;
}

}  // namespace mxq::dist
