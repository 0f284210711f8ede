// The contract every mxq::dist::Communicator meets (communicator.h), as checks that each rank of
// a group runs at the same time with its own communicator (a thread or a process per rank). The
// expected values are computed from every rank's contribution, which each rank can derive from
// the rank number, so a rank checks the whole group's result on its own. Failures are gtest
// EXPECTs (never an early return: every rank must keep calling the same collectives).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/dist/communicator.h"

namespace mxq::dist::testing {

using Bytes = std::vector<std::uint8_t>;

// Rank r's bytes for test case `salt`: `length` bytes of a pattern that differs per rank and case.
inline Bytes pattern(int r, int salt, std::size_t length) {
  Bytes out;
  out.reserve(length);  // push_back: GCC 12 misreads indexed stores here (-Wstringop-overflow)
  for (std::size_t j = 0; j < length; ++j) {
    out.push_back(
        static_cast<std::uint8_t>((static_cast<std::size_t>(r) * 31 + j * 7 + salt * 13) & 0xFF));
  }
  return out;
}

// Values whose sums are exact in double (small integers and quarters), so every summation order
// gives the same result; min and max get negatives, a large magnitude and an infinity.
inline double contribution(int r, std::size_t i) {
  if (i == 0) return r % 2 == 0 ? -1e300 : 1e300;
  if (i == 1) return r == 0 ? std::numeric_limits<double>::infinity() : -0.25 * r;
  return static_cast<double>((r * 7 + static_cast<int>(i) * 3) % 11) -
         1.5 * static_cast<double>(i) + 0.25 * r;
}

inline void check_all_reduce(Communicator& comm) {
  const int r = comm.rank();
  const int n = comm.size();
  constexpr std::size_t kCount = 13;
  for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<double> values(kCount);
    for (std::size_t i = 0; i < kCount; ++i) values[i] = contribution(r, i);
    comm.all_reduce(values, op);
    for (std::size_t i = 0; i < kCount; ++i) {
      double expected = contribution(0, i);
      for (int q = 1; q < n; ++q) {
        const double v = contribution(q, i);
        expected = op == ReduceOp::kSum   ? expected + v
                   : op == ReduceOp::kMin ? std::min(expected, v)
                                          : std::max(expected, v);
      }
      if (op == ReduceOp::kSum && i == 0) continue;  // +-1e300 sums depend on the order
      EXPECT_EQ(values[i], expected)
          << "op " << static_cast<int>(op) << ", index " << i << ", rank " << r << " of " << n;
    }
  }
  // Nothing to reduce: a no-op that every rank still joins.
  std::vector<double> none;
  comm.all_reduce(none, ReduceOp::kSum);
  EXPECT_TRUE(none.empty());
  // Longer than any small staging buffer.
  std::vector<double> large(100003);
  for (std::size_t i = 0; i < large.size(); ++i) large[i] = 0.5 * static_cast<double>(i) + r;
  comm.all_reduce(large, ReduceOp::kSum);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < large.size(); ++i) {
    const double expected = 0.5 * static_cast<double>(i) * n + n * (n - 1) / 2.0;
    wrong += large[i] != expected;
  }
  EXPECT_EQ(wrong, 0U) << "of " << large.size() << " summed values on rank " << r;
}

inline void check_broadcast(Communicator& comm) {
  const int r = comm.rank();
  const int n = comm.size();
  // Every root once, lengths 0, 1, 7, 4099, ... (root 0 broadcasts nothing), and once a long
  // message from the last rank. Non-roots start with other bytes of another length: they must
  // end with exactly the root's.
  for (int root = 0; root <= n; ++root) {
    const int from = root == n ? n - 1 : root;
    const std::size_t length = root == n   ? (1U << 20) + 5
                               : root == 0 ? 0
                                           : std::vector<std::size_t>{1, 7, 4099}[(root - 1) % 3];
    const Bytes sent = pattern(from, root, length);
    Bytes bytes = r == from ? sent : Bytes(static_cast<std::size_t>(r) + 5, 0xEE);
    comm.broadcast(bytes, from);
    EXPECT_EQ(bytes.size(), length)
        << "broadcast " << root << " from rank " << from << " on rank " << r;
    EXPECT_TRUE(bytes == sent) << "broadcast " << root << " from rank " << from << " on rank " << r;
  }
  // A root outside the group is the caller's error, found before any rank waits.
  Bytes bytes = {1, 2, 3};
  EXPECT_THROW(comm.broadcast(bytes, n), Error);
  EXPECT_THROW(comm.broadcast(bytes, -1), Error);
  EXPECT_EQ(bytes, (Bytes{1, 2, 3}));
}

inline void check_all_gather(Communicator& comm) {
  const int r = comm.rank();
  const int n = comm.size();
  // Case 0: lengths (37 r) mod 11, so rank 0 sends nothing; case 1: nobody sends anything;
  // case 2: the last rank sends 1 MiB + 1, the others 0 or 1 byte.
  auto length = [n](int q, int c) -> std::size_t {
    if (c == 0) return static_cast<std::size_t>((q * 37) % 11);
    if (c == 1) return 0;
    return q == n - 1 ? (1U << 20) + 1 : static_cast<std::size_t>(q % 2);
  };
  for (int c = 0; c < 3; ++c) {
    const std::vector<Bytes> all = comm.all_gather(pattern(r, c, length(r, c)));
    ASSERT_EQ(all.size(), static_cast<std::size_t>(n)) << "case " << c << " on rank " << r;
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(all[static_cast<std::size_t>(q)] == pattern(q, c, length(q, c)))
          << "case " << c << ": rank " << q << "'s bytes on rank " << r << " (length "
          << all[static_cast<std::size_t>(q)].size() << ", expected " << length(q, c) << ")";
    }
  }
}

// Collectives in a changing order: each result depends on the round, so a rank that lagged or
// ran ahead by one collective would see another round's values.
inline void check_interleaved(Communicator& comm) {
  const int r = comm.rank();
  const int n = comm.size();
  for (int round = 0; round < 12; ++round) {
    std::vector<double> v = {static_cast<double>(round * 100 + r)};
    comm.all_reduce(v, ReduceOp::kMax);
    EXPECT_EQ(v[0], round * 100 + n - 1) << "round " << round;
    const int root = round % n;
    Bytes b = r == root ? pattern(root, round, static_cast<std::size_t>(round)) : Bytes{};
    comm.broadcast(b, root);
    EXPECT_TRUE(b == pattern(root, round, static_cast<std::size_t>(round))) << "round " << round;
    const std::vector<Bytes> all =
        comm.all_gather(Bytes{static_cast<std::uint8_t>(round), static_cast<std::uint8_t>(r)});
    ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(all[static_cast<std::size_t>(q)],
                (Bytes{static_cast<std::uint8_t>(round), static_cast<std::uint8_t>(q)}))
          << "round " << round;
    }
  }
}

// Everything above. Each rank of the group calls it at once with its own communicator.
inline void check_communicator_contract(Communicator& comm) {
  ASSERT_GE(comm.size(), 1);
  ASSERT_GE(comm.rank(), 0);
  ASSERT_LT(comm.rank(), comm.size());
  // Ranks are numbered 0..size-1, each once, and all_gather orders by rank.
  const std::vector<Bytes> ranks = comm.all_gather(Bytes{static_cast<std::uint8_t>(comm.rank())});
  ASSERT_EQ(ranks.size(), static_cast<std::size_t>(comm.size()));
  for (int q = 0; q < comm.size(); ++q)
    EXPECT_EQ(ranks[static_cast<std::size_t>(q)], Bytes{static_cast<std::uint8_t>(q)});
  check_all_reduce(comm);
  check_broadcast(comm);
  check_all_gather(comm);
  check_interleaved(comm);
}

// Ranks passing different lengths to all_reduce: an mxq::Error on every rank (not a hang, not a
// silent partial reduction). Needs at least two ranks; returns the error text of this rank.
inline std::string mismatched_all_reduce_error(Communicator& comm) {
  std::vector<double> values(static_cast<std::size_t>(comm.rank()) + 1, 1.0);
  try {
    comm.all_reduce(values, ReduceOp::kSum);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mxq::dist::testing
