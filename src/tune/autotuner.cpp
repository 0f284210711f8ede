#include "mxq/tune/autotuner.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "mxq/core/enum_names.h"
#include "mxq/core/error.h"
#include "mxq/core/log.h"
#include "mxq/core/statistics.h"
#include "tune/hash.h"
#include "tune/lookup_table.h"
#include "tune/rank_bytes.h"

namespace mxq::tune {
namespace {

using detail::text_bytes;

std::string resolve_cache_path(const AutotunerConfig& config, const Fingerprint& fingerprint) {
  if (config.options.mode == AutotuneMode::kOff) return {};
  std::string path = config.options.cache_path;
  if (path.empty())
    path = default_cache_path(fingerprint, config.deployment.value_or(Deployment{}));
  if (config.options.mode == AutotuneMode::kFresh) path = fresh_run_path(path);
  return path;
}

}  // namespace

namespace {
constexpr EnumNames<SelectionSource, 5> kSelectionSourceNames{
    {{{SelectionSource::kTuned, "tuned"},
      {SelectionSource::kDefault, "default"},
      {SelectionSource::kSkipped, "skipped"},
      {SelectionSource::kOutOfRange, "out_of_range"},
      {SelectionSource::kUnknownOp, "unknown_op"}}}};
}  // namespace

std::string_view to_string(SelectionSource source) { return kSelectionSourceNames.name(source); }

namespace {
constexpr EnumNames<TuneStatus, 6> kTuneStatusNames{{{{TuneStatus::kTuned, "tuned"},
                                                      {TuneStatus::kHit, "hit"},
                                                      {TuneStatus::kSkipped, "skipped"},
                                                      {TuneStatus::kNotTuned, "not_tuned"},
                                                      {TuneStatus::kBudget, "budget"},
                                                      {TuneStatus::kFailed, "failed"}}}};
}  // namespace

std::string_view to_string(TuneStatus status) { return kTuneStatusNames.name(status); }

std::string entry_problem(const CacheEntry& entry, const TacticRegistry& registry,
                          Backend backend) {
  const OpSpec* op = registry.find_op(entry.problem.op(), backend);
  if (op == nullptr) {
    return "op " + entry.problem.op() + " is not registered for " + std::string(to_string(backend));
  }
  if (!std::binary_search(op->buckets.begin(), op->buckets.end(), entry.bucket)) {
    return "bucket " + std::to_string(entry.bucket) + " is not a bucket of op " + op->name;
  }
  const Tactic* tactic = registry.find_tactic(op->name, backend, entry.tactic);
  if (tactic == nullptr)
    return "tactic " + entry.tactic + " of op " + op->name + " is not registered";
  Support support;
  try {
    support = tactic->supports(entry.problem);
  } catch (const std::exception& error) {
    support = Support::no(std::string("supports() threw: ") + error.what());
  }
  if (!support.ok)
    return "tactic " + entry.tactic + " does not support the problem: " + support.reason;
  if (!tactic->tokens.contains(entry.bucket)) {
    return "tactic " + entry.tactic + " is valid for tokens " + tactic->tokens.str() +
           ", not for bucket " + std::to_string(entry.bucket);
  }
  return {};
}

namespace {

// Entries that load but are never served (an unknown tactic or op, a bucket the op or tactic
// does not have, a shape the tactic does not support) run the default without a warning:
// serving stays quiet, and `mxq cache verify` names each. One line per file at info level says
// how many there are, for whoever asks why a tuned key runs its default (ops in the skip list
// are not served by request and are not counted).
void note_unserved(const std::string& path, const std::vector<CacheEntry>& loaded,
                   const TacticRegistry& registry, Backend backend,
                   const std::vector<std::string>& skip_ops) {
  if (!log_enabled(LogLevel::kInfo)) return;  // judging 10,000 entries costs start-up time
  std::size_t unserved = 0;
  std::string first;
  for (const CacheEntry& e : loaded) {
    if (std::find(skip_ops.begin(), skip_ops.end(), e.problem.op()) != skip_ops.end()) continue;
    const std::string why = entry_problem(e, registry, backend);
    if (why.empty()) continue;
    if (unserved++ == 0) first = e.key() + ": " + why;
  }
  if (unserved == 0) return;
  log_info("autotune cache ", path, ": ", unserved, " of ", loaded.size(),
           " entries are not served, their keys run the default tactic (", first,
           unserved > 1 ? "; ..." : "", "); `mxq cache verify ", path, "` names each");
}

}  // namespace

// ---- Autotuner ---------------------------------------------------------------------------

Autotuner::Autotuner(AutotunerConfig config)
    : config_(std::move(config)),
      registry_(config_.registry != nullptr ? config_.registry : &builtin_tactics()) {
  if (!registry_->frozen()) fail(ErrorCode::kInvalidArgument, "autotuner registry: not frozen");
  fingerprint_ = config_.fingerprint
                     ? *config_.fingerprint
                     : current_fingerprint(config_.backend, *registry_, config_.device);
  if (fingerprint_.backend != to_string(config_.backend)) {
    fail_argument(ErrorCode::kInvalidArgument, "autotuner fingerprint backend",
                  to_string(config_.backend), fingerprint_.backend);
  }
  if (config_.communicator == nullptr) solo_ = std::make_unique<dist::SoloCommunicator>();
  communicator_ = config_.communicator != nullptr ? config_.communicator : solo_.get();
  timer_ = config_.timer;
  for (const std::string& op : config_.options.skip_ops) {
    if (registry_->find_op(op, config_.backend) == nullptr) {
      warn_locked("autotune skip list names op '" + op + "', which is not registered for " +
                  std::string(to_string(config_.backend)));
    }
  }
  cache_path_ = resolve_cache_path(config_, fingerprint_);
  // A directory is no cache file: reading it would fail, and a tuning run would move it aside.
  if (std::error_code error;
      !cache_path_.empty() && std::filesystem::is_directory(cache_path_, error)) {
    fail_argument(ErrorCode::kInvalidArgument, "autotune cache", "a file path",
                  "'" + cache_path_ + "', a directory");
  }
  if (!cache_path_.empty()) store_ = std::make_unique<CacheStore>(cache_path_, fingerprint_);
  if (config_.require_saving && store_ &&
      (mode() == AutotuneMode::kTune || mode() == AutotuneMode::kFresh)) {
    if (const std::string why = store_->save_blocker(); !why.empty()) {
      fail(ErrorCode::kIo, "autotune cache ", cache_path_, " cannot be tuned into: ", why,
           "; nothing was tuned (tune into another file: MXQ_AUTOTUNE_CACHE or `mxq tune --cache "
           "FILE`, or into a new one: MXQ_AUTOTUNE=fresh or `mxq tune --fresh`)");
    }
  }
  if (mode() == AutotuneMode::kLoad || mode() == AutotuneMode::kTune) {
    std::vector<CacheEntry> loaded;
    // Only a tuner that may write moves an unreadable file aside: `load` never changes files.
    const CacheStore::Outcome outcome =
        store_->load(loaded, mode() == AutotuneMode::kTune ? CacheStore::Unreadable::kMoveAside
                                                           : CacheStore::Unreadable::kLeave);
    for (const std::string& w : outcome.warnings) warnings_.push_back(w);
    note_unserved(store_->path(), loaded, *registry_, backend(), config_.options.skip_ops);
    for (CacheEntry& e : loaded) {
      std::string key = e.key();
      if (dirty_.count(key) == 0) entries_.insert_or_assign(std::move(key), std::move(e));
    }
  }
  publish();
}

Autotuner::~Autotuner() = default;

double Autotuner::now_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Selection Autotuner::lookup(const Problem& problem, std::int64_t tokens) const noexcept {
  const LookupTable* table = table_.load(std::memory_order_acquire);
  return table->lookup(problem, tokens);
}

bool Autotuner::skipped(std::string_view op) const {
  const auto& skip = config_.options.skip_ops;
  return std::find(skip.begin(), skip.end(), op) != skip.end();
}

std::vector<std::string> Autotuner::warnings() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return warnings_;
}

int Autotuner::measured_count() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return measured_;
}

int Autotuner::unsaved_count() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(dirty_.size());
}

void Autotuner::warn_locked(std::string text) {
  log_warn(text);
  warnings_.push_back(std::move(text));
}

bool Autotuner::servable_locked(const CacheEntry& entry) const {
  return !skipped(entry.problem.op()) && entry_problem(entry, *registry_, backend()).empty();
}

std::vector<CacheEntry> Autotuner::decisions_locked() const {
  std::vector<CacheEntry> out;
  for (const auto& [key, e] : entries_) {
    if (servable_locked(e)) out.push_back(e);
  }
  return out;
}

std::vector<CacheEntry> Autotuner::decisions() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return decisions_locked();
}

namespace {
std::uint64_t digest_of(const std::vector<CacheEntry>& decisions) {
  std::uint64_t hash = detail::kFnvOffset;
  for (const CacheEntry& e : decisions) {
    hash = detail::fnv1a(e.key(), hash);
    hash = detail::fnv1a("=", hash);
    hash = detail::fnv1a(e.tactic, hash);
    hash = detail::fnv1a("\n", hash);
  }
  return hash;
}
}  // namespace

std::uint64_t Autotuner::decisions_digest() const { return digest_of(decisions()); }

void Autotuner::publish() {
  const std::lock_guard<std::mutex> lock(mutex_);
  publish_locked();
}

void Autotuner::publish_locked() {
  std::vector<LookupTable::OpRow> ops;
  for (const OpSpec* op : registry_->ops(backend())) {
    ops.push_back({stable_hash(op->name), op, &registry_->default_tactic(*op), skipped(op->name)});
  }
  std::vector<LookupTable::ShapeRow> shapes;
  std::map<std::string, std::size_t> row_of;
  for (const CacheEntry& e : decisions_locked()) {
    const auto op_it = std::find_if(ops.begin(), ops.end(), [&](const LookupTable::OpRow& row) {
      return row.op->name == e.problem.op();
    });
    const OpSpec& op = *op_it->op;
    auto [it, inserted] = row_of.emplace(e.problem.canonical(), shapes.size());
    if (inserted) {
      shapes.push_back({e.problem.hash(), e.problem.canonical(),
                        static_cast<std::size_t>(op_it - ops.begin()),
                        std::vector<const Tactic*>(op.buckets.size(), nullptr)});
    }
    const std::size_t bucket = bucket_index(op.buckets, e.bucket);
    shapes[it->second].winners[bucket] = registry_->find_tactic(op.name, backend(), e.tactic);
  }
  auto table = std::make_unique<const LookupTable>(std::move(ops), std::move(shapes));
  table_.store(table.get(), std::memory_order_release);
  tables_.push_back(std::move(table));  // readers may still hold older ones
}

void Autotuner::persist_locked() {
  if (dirty_.empty() || !store_ || mode() == AutotuneMode::kOff || mode() == AutotuneMode::kLoad) {
    return;
  }
  // Also tried after a save found a foreign file: it may have been removed or replaced by a
  // compatible one since, and the store re-reads it under the lock anyway (it warns once per
  // version of a foreign file, not once per save). dirty_ keeps what is not saved yet.
  std::vector<CacheEntry> updates;
  for (const std::string& key : dirty_) updates.push_back(entries_.at(key));
  try {
    CacheStore::Outcome outcome = store_->save(updates);
    for (const std::string& w : outcome.warnings) warnings_.push_back(w);
    if (outcome.ok && outcome.moved_aside) {
      // The file broke since we read it: write back everything this process knows of it.
      std::vector<CacheEntry> everything;
      for (const auto& [key, e] : entries_) everything.push_back(e);
      outcome = store_->save(everything);
    }
    if (outcome.ok) dirty_.clear();
  } catch (const std::exception& error) {
    warn_locked("autotune cache " + store_->path() + " could not be saved (" + error.what() +
                "); the tuned entries stay in memory and saving is retried");
  }
}

void Autotuner::seal() {
  const std::lock_guard<std::mutex> lock(mutex_);
  dist::Communicator& comm = *communicator_;
  if (comm.size() > 1) {
    const std::vector<CacheEntry> mine = decisions_locked();
    const std::uint64_t my_digest = digest_of(mine);
    std::vector<std::uint8_t> digest_bytes(sizeof my_digest);
    std::memcpy(digest_bytes.data(), &my_digest, sizeof my_digest);
    const auto digests = comm.all_gather(digest_bytes);
    std::vector<int> differing;
    for (int r = 1; r < comm.size(); ++r) {
      if (digests[static_cast<std::size_t>(r)] != digests[0]) differing.push_back(r);
    }
    if (!differing.empty()) {
      CacheFile rank0;
      std::vector<std::uint8_t> payload;
      if (comm.rank() == 0) {
        rank0.fingerprint = fingerprint_;
        rank0.entries = mine;
        const std::string text = serialize_cache(rank0);
        payload = text_bytes(text);
      }
      comm.broadcast(payload, 0);
      if (comm.rank() == 0) {
        std::string ranks;
        for (int r : differing) {
          if (!ranks.empty()) ranks += ',';  // (a "," + to_string(r) trips GCC 12's -Wrestrict)
          ranks += std::to_string(r);
        }
        warn_locked("autotune: ranks " + ranks +
                    " disagreed with rank 0 on tactic decisions; "
                    "they adopt rank 0's");
      } else if (digests[static_cast<std::size_t>(comm.rank())] != digests[0]) {
        const CacheFile theirs = parse_cache(
            std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
        std::map<std::string, const CacheEntry*> their_by_key;
        for (const CacheEntry& e : theirs.entries) their_by_key.emplace(e.key(), &e);
        std::vector<std::string> diffs;
        for (const CacheEntry& e : mine) {
          const auto it = their_by_key.find(e.key());
          if (it == their_by_key.end()) {
            diffs.push_back(e.key() + ": " + e.tactic + " here, nothing on rank 0");
            entries_.erase(e.key());
            dirty_.erase(e.key());
          } else if (it->second->tactic != e.tactic) {
            diffs.push_back(e.key() + ": " + e.tactic + " here, " + it->second->tactic +
                            " on rank 0");
          }
        }
        for (const CacheEntry& e : theirs.entries) {
          const auto existing = entries_.find(e.key());
          const bool same = existing != entries_.end() && existing->second.tactic == e.tactic &&
                            servable_locked(existing->second);
          if (same) continue;
          if (existing == entries_.end() || !servable_locked(existing->second)) {
            diffs.push_back(e.key() + ": nothing here, " + e.tactic + " on rank 0");
          }
          entries_.insert_or_assign(e.key(), e);
          dirty_.insert(e.key());
        }
        std::string text = "autotune rank " + std::to_string(comm.rank()) + ": " +
                           std::to_string(diffs.size()) +
                           " decision(s) differ from rank 0's, adopting rank 0's:";
        for (std::size_t i = 0; i < diffs.size() && i < 16; ++i) text += "\n  " + diffs[i];
        if (diffs.size() > 16) text += "\n  ... and " + std::to_string(diffs.size() - 16) + " more";
        warn_locked(text);
        persist_locked();
      }
    }
  }
  publish_locked();
}

}  // namespace mxq::tune
