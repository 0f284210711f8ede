// The immutable table lookups read: built by Autotuner::publish(), reached through one atomic
// pointer, never modified or freed while the tuner lives. Lookup = a short scan of the ops, an
// open-addressing probe on the problem hash (confirmed by comparing the canonical text), a
// binary search of the op's buckets and a token-range check. No allocation, no lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mxq/tune/autotuner.h"

namespace mxq::tune {

class LookupTable {
 public:
  struct OpRow {
    std::uint64_t name_hash = 0;
    const OpSpec* op = nullptr;
    const Tactic* default_tactic = nullptr;
    bool skipped = false;
  };
  struct ShapeRow {
    std::uint64_t hash = 0;
    std::string canonical;
    std::size_t op_row = 0;
    std::vector<const Tactic*> winners;  // per bucket of the op; null = not tuned
  };

  LookupTable(std::vector<OpRow> ops, std::vector<ShapeRow> shapes);
  Selection lookup(const Problem& problem, std::int64_t tokens) const noexcept;

 private:
  std::vector<OpRow> ops_;
  std::vector<ShapeRow> shapes_;
  std::vector<std::int32_t> slots_;  // index into shapes_, -1 = empty; size is a power of two
  std::uint64_t mask_ = 0;
};

}  // namespace mxq::tune
