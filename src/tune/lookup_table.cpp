#include "tune/lookup_table.h"

namespace mxq::tune {

LookupTable::LookupTable(std::vector<OpRow> ops, std::vector<ShapeRow> shapes)
    : ops_(std::move(ops)), shapes_(std::move(shapes)) {
  std::size_t capacity = 16;
  while (capacity < shapes_.size() * 2) capacity *= 2;  // load factor <= 1/2
  slots_.assign(capacity, -1);
  mask_ = capacity - 1;
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    std::uint64_t slot = shapes_[i].hash & mask_;
    while (slots_[slot] >= 0) slot = (slot + 1) & mask_;
    slots_[slot] = static_cast<std::int32_t>(i);
  }
}

Selection LookupTable::lookup(const Problem& problem, std::int64_t tokens) const noexcept {
  const OpRow* op = nullptr;
  for (const OpRow& row : ops_) {
    if (row.name_hash == problem.op_hash() && row.op->name == problem.op()) {
      op = &row;
      break;
    }
  }
  if (op == nullptr) return {nullptr, SelectionSource::kUnknownOp};
  if (op->skipped) return {op->default_tactic, SelectionSource::kSkipped};
  for (std::uint64_t slot = problem.hash() & mask_;; slot = (slot + 1) & mask_) {
    const std::int32_t index = slots_[slot];
    if (index < 0) return {op->default_tactic, SelectionSource::kDefault};
    const ShapeRow& row = shapes_[static_cast<std::size_t>(index)];
    if (row.hash != problem.hash() || row.canonical != problem.canonical()) continue;
    const Tactic* winner = row.winners[bucket_index(op->op->buckets, tokens)];
    if (winner == nullptr) return {op->default_tactic, SelectionSource::kDefault};
    if (!winner->tokens.contains(tokens)) return {op->default_tactic, SelectionSource::kOutOfRange};
    return {winner, SelectionSource::kTuned};
  }
}

}  // namespace mxq::tune
