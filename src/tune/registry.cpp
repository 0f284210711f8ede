#include "mxq/tune/registry.h"

#include <algorithm>
#include <mutex>
#include <sstream>

#include "mxq/core/error.h"
#include "tune/hash.h"

namespace mxq::tune {
namespace {

std::string tactic_key(Backend backend, std::string_view op, std::string_view id) {
  return std::string(to_string(backend)) + "/" + std::string(op) + "/" + std::string(id);
}

}  // namespace

void TacticRegistry::check_mutable(std::string_view what) const {
  if (frozen_) fail(ErrorCode::kInternal, "tactic registry is frozen: cannot ", what);
}

TacticRegistry::OpEntry* TacticRegistry::find_entry(std::string_view name, Backend backend) {
  for (OpEntry& entry : ops_) {
    if (entry.spec.name == name && entry.spec.backend == backend) return &entry;
  }
  return nullptr;
}

const TacticRegistry::OpEntry* TacticRegistry::find_entry(std::string_view name,
                                                          Backend backend) const {
  for (const OpEntry& entry : ops_) {
    if (entry.spec.name == name && entry.spec.backend == backend) return &entry;
  }
  return nullptr;
}

void TacticRegistry::add_op(OpSpec spec) {
  check_mutable("add op " + spec.name);
  (void)Problem(spec.name, {});  // validates the op name
  if (find_entry(spec.name, spec.backend) != nullptr) {
    fail(ErrorCode::kInvalidArgument, "op ", spec.name, " (", to_string(spec.backend),
         ") registered twice");
  }
  if (spec.buckets.empty()) spec.buckets = power_of_two_buckets(16384);
  check_buckets(spec.buckets, "buckets of op " + spec.name);
  if (!spec.make_workload) {
    fail_argument(ErrorCode::kInvalidArgument, "op " + spec.name + " make_workload",
                  "a workload factory", "none");
  }
  ops_.push_back(OpEntry{std::move(spec), {}, nullptr});
}

const Tactic& TacticRegistry::add_tactic(Tactic tactic) {
  check_mutable("add tactic " + tactic.op + "/" + tactic.variant);
  OpEntry* op = find_entry(tactic.op, tactic.backend);
  if (op == nullptr) {
    fail(ErrorCode::kInvalidArgument, "tactic ", tactic.id(), " names op ", tactic.op, " (",
         to_string(tactic.backend), ") which is not registered: add the op first");
  }
  (void)Problem(tactic.variant, {});  // validates the variant name
  if (tactic.tokens.min < 1 || tactic.tokens.max < tactic.tokens.min) {
    fail_argument(ErrorCode::kInvalidArgument, "token range of tactic " + tactic.id(),
                  "1 <= min <= max", tactic.tokens.str());
  }
  if (!tactic.run) {
    fail_argument(ErrorCode::kInvalidArgument, "tactic " + tactic.id() + " run", "a function",
                  "none");
  }
  const std::string key = tactic_key(tactic.backend, tactic.op, tactic.id());
  if (by_key_.count(key) != 0)
    fail(ErrorCode::kInvalidArgument, "tactic ", key, " registered twice");
  tactics_.push_back(std::move(tactic));
  const Tactic* stored = &tactics_.back();
  by_key_.emplace(key, stored);
  op->tactics.push_back(stored);
  return *stored;
}

void TacticRegistry::freeze() {
  if (frozen_) return;
  std::ostringstream text;
  std::vector<const OpEntry*> sorted;
  for (OpEntry& op : ops_) {
    const std::string where =
        "op " + op.spec.name + " (" + std::string(to_string(op.spec.backend)) + ")";
    if (op.tactics.empty()) fail(ErrorCode::kInvalidArgument, where, " has no tactics");
    op.default_tactic = find_tactic(op.spec.name, op.spec.backend, op.spec.default_tactic);
    if (op.default_tactic == nullptr) {
      fail(ErrorCode::kInvalidArgument, where, ": default tactic '", op.spec.default_tactic,
           "' is not registered");
    }
    if (!op.default_tactic->tokens.full() || op.default_tactic->supports_fn) {
      fail(ErrorCode::kInvalidArgument, where, ": the default tactic ", op.spec.default_tactic,
           " must support every problem and token count (it is the fallback), found range ",
           op.default_tactic->tokens.str(),
           op.default_tactic->supports_fn ? " and a supports() predicate" : "");
    }
    sorted.push_back(&op);
  }
  std::sort(sorted.begin(), sorted.end(), [](const OpEntry* a, const OpEntry* b) {
    return std::tie(a->spec.name, a->spec.backend) < std::tie(b->spec.name, b->spec.backend);
  });
  for (const OpEntry* op : sorted) {
    text << "op " << op->spec.name << " " << to_string(op->spec.backend) << " default "
         << op->spec.default_tactic << " buckets";
    for (std::int64_t b : op->spec.buckets) text << " " << b;
    text << "\n";
    std::vector<std::string> lines;
    for (const Tactic* t : op->tactics) {
      lines.push_back("  tactic " + t->id() + " tokens " + t->tokens.str() + " v" +
                      std::to_string(t->version));
    }
    std::sort(lines.begin(), lines.end());
    for (const std::string& line : lines) text << line << "\n";
  }
  hash_ = detail::hex64(detail::fnv1a(text.str()));
  frozen_ = true;
}

const OpSpec* TacticRegistry::find_op(std::string_view name, Backend backend) const noexcept {
  const OpEntry* entry = find_entry(name, backend);
  return entry == nullptr ? nullptr : &entry->spec;
}

const Tactic* TacticRegistry::find_tactic(std::string_view op, Backend backend,
                                          std::string_view id) const noexcept {
  // A heterogeneous find would avoid this string, but find_tactic is not on the serving path.
  const auto it = by_key_.find(tactic_key(backend, op, id));
  return it == by_key_.end() ? nullptr : it->second;
}

const Tactic& TacticRegistry::default_tactic(const OpSpec& op) const {
  const OpEntry* entry = find_entry(op.name, op.backend);
  if (entry == nullptr || entry->default_tactic == nullptr) {
    fail(ErrorCode::kInternal, "op ", op.name, " has no default tactic (registry not frozen?)");
  }
  return *entry->default_tactic;
}

const std::vector<const Tactic*>& TacticRegistry::tactics(const OpSpec& op) const {
  const OpEntry* entry = find_entry(op.name, op.backend);
  if (entry == nullptr) fail(ErrorCode::kInternal, "op ", op.name, " is not in this registry");
  return entry->tactics;
}

std::vector<const OpSpec*> TacticRegistry::ops() const {
  std::vector<const OpSpec*> out;
  for (const OpEntry& entry : ops_) out.push_back(&entry.spec);
  return out;
}

std::vector<const OpSpec*> TacticRegistry::ops(Backend backend) const {
  std::vector<const OpSpec*> out;
  for (const OpEntry& entry : ops_) {
    if (entry.spec.backend == backend) out.push_back(&entry.spec);
  }
  return out;
}

const std::string& TacticRegistry::hash() const {
  if (!frozen_) fail(ErrorCode::kInternal, "tactic registry hash asked before freeze()");
  return hash_;
}

std::string TacticRegistry::describe() const {
  std::ostringstream out;
  for (const OpEntry& op : ops_) {
    out << op.spec.name << " (" << to_string(op.spec.backend) << "), default "
        << op.spec.default_tactic << ", " << op.spec.buckets.size() << " buckets "
        << op.spec.buckets.front() << ".." << op.spec.buckets.back() << "\n";
    for (const Tactic* t : op.tactics) {
      out << "  " << t->id() << "  tokens " << t->tokens.str() << "\n";
    }
  }
  return out.str();
}

const TacticRegistry& builtin_tactics() {
  static const TacticRegistry* registry = [] {
    auto* r = new TacticRegistry();  // never destroyed: tactics outlive every static user
    register_builtin_tactics(*r);
    r->freeze();
    return r;
  }();
  return *registry;
}

}  // namespace mxq::tune
