#include "mxq/tune/autotuner.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "mxq/core/error.h"
#include "mxq/core/log.h"
#include "tune/hash.h"
#include "tune/lookup_table.h"

namespace mxq::tune {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double median(std::vector<double> values) {
  if (values.empty()) return kInf;
  for (double v : values) {
    if (!std::isfinite(v)) return kInf;  // a call that failed on any rank disqualifies
  }
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::vector<std::uint8_t> doubles_to_bytes(const std::vector<double>& values) {
  std::vector<std::uint8_t> bytes(values.size() * sizeof(double));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<double> bytes_to_doubles(const std::vector<std::uint8_t>& bytes) {
  std::vector<double> values(bytes.size() / sizeof(double));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(double));
  return values;
}

std::vector<std::uint8_t> text_bytes(const std::string& text) { return {text.begin(), text.end()}; }

// The cache path a tuner reads (and, except in fresh mode, writes).
std::string resolve_cache_path(const AutotunerConfig& config, const Fingerprint& fingerprint) {
  if (config.options.mode == AutotuneMode::kOff) return {};
  std::string path = config.options.cache_path;
  if (path.empty())
    path = default_cache_path(fingerprint, config.deployment.value_or(Deployment{}));
  if (config.options.mode == AutotuneMode::kFresh) path = fresh_run_path(path);
  return path;
}

}  // namespace

std::string_view to_string(SelectionSource source) {
  switch (source) {
    case SelectionSource::kTuned:
      return "tuned";
    case SelectionSource::kDefault:
      return "default";
    case SelectionSource::kSkipped:
      return "skipped";
    case SelectionSource::kOutOfRange:
      return "out_of_range";
    case SelectionSource::kUnknownOp:
      return "unknown_op";
  }
  return "?";
}

std::string_view to_string(TuneStatus status) {
  switch (status) {
    case TuneStatus::kTuned:
      return "tuned";
    case TuneStatus::kHit:
      return "hit";
    case TuneStatus::kSkipped:
      return "skipped";
    case TuneStatus::kNotTuned:
      return "not_tuned";
    case TuneStatus::kBudget:
      return "budget";
    case TuneStatus::kFailed:
      return "failed";
  }
  return "?";
}

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
        for (int r : differing) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
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

// ---- tuning ------------------------------------------------------------------------------

TuneRecord Autotuner::tune_key(const Problem& problem, std::int64_t bucket, const std::string& pass,
                               double deadline_seconds) {
  const double start = now_seconds();
  TuneRecord record;
  record.pass = pass;
  record.problem = problem.canonical();
  record.op = problem.op();
  record.bucket = bucket;
  const OpSpec* op = registry_->find_op(problem.op(), backend());
  if (op == nullptr) {
    record.status = TuneStatus::kFailed;
    record.reason =
        "op " + problem.op() + " has no tactics for " + std::string(to_string(backend()));
    return record;
  }
  if (!std::binary_search(op->buckets.begin(), op->buckets.end(), bucket)) {
    fail_argument(ErrorCode::kInvalidArgument, "bucket for " + problem.canonical(),
                  "one of the op's buckets (" + std::to_string(op->buckets.front()) + ".." +
                      std::to_string(op->buckets.back()) + ")",
                  bucket);
  }
  const Tactic& fallback = registry_->default_tactic(*op);
  record.tactic = fallback.id();
  if (skipped(op->name)) {
    record.status = TuneStatus::kSkipped;
    record.reason = "op in the skip list (MXQ_AUTOTUNE_SKIP_OPS): its default tactic serves";
    return record;
  }
  CacheEntry probe;
  probe.problem = problem;
  probe.bucket = bucket;
  const std::string key = probe.key();
  auto existing = entries_.find(key);
  bool hit = existing != entries_.end() && servable_locked(existing->second);
  if (!hit && mode() == AutotuneMode::kTune && store_ && !store_->foreign()) {
    // Another process (or another tuner of this one, e.g. the target model's) may have
    // measured it since we read the file: never measure a key twice.
    std::vector<CacheEntry> fresh;
    if (store_->reload_if_changed(fresh)) {
      for (CacheEntry& e : fresh) {
        std::string k = e.key();
        if (dirty_.count(k) == 0) entries_.insert_or_assign(std::move(k), std::move(e));
      }
      existing = entries_.find(key);
      hit = existing != entries_.end() && servable_locked(existing->second);
    }
  }
  if (hit) {
    record.tactic = existing->second.tactic;
    record.median_us = existing->second.median_us;
    record.default_us = existing->second.default_us;
  }
  if (mode() == AutotuneMode::kOff || mode() == AutotuneMode::kLoad) {
    record.status = hit ? TuneStatus::kHit : TuneStatus::kNotTuned;
    if (!hit) {
      record.reason = "mode " + std::string(to_string(mode())) + ": not tuned, the default serves";
    }
    return record;
  }
  // Every rank takes part in the same collectives whatever it has cached: one rank's miss makes
  // all ranks measure the key together.
  std::vector<double> flags = {hit ? 0.0 : 1.0, start > deadline_seconds ? 1.0 : 0.0};
  communicator_->all_reduce(flags, dist::ReduceOp::kMax);
  if (flags[0] == 0.0) {
    record.status = TuneStatus::kHit;
    return record;
  }
  if (flags[1] != 0.0) {
    record.status = TuneStatus::kBudget;
    record.reason =
        "tuning budget used up: " + std::string(hit ? "the cached tactic" : "the default") +
        " serves";
    return record;
  }
  // Candidates: supported and valid for every token count the bucket serves.
  const std::size_t index = bucket_index(op->buckets, bucket);
  const std::int64_t lo = index == 0 ? 1 : op->buckets[index - 1] + 1;
  std::vector<const Tactic*> candidates = {&fallback};
  for (const Tactic* t : registry_->tactics(*op)) {
    if (t == &fallback) continue;
    Support support;
    try {
      support = t->supports(problem);
    } catch (const std::exception& error) {
      support = Support::no(std::string("supports() threw: ") + error.what());
    }
    if (!support.ok) {
      record.candidates.push_back({t->id(), "unsupported: " + support.reason, 0});
    } else if (!t->tokens.covers(lo, bucket)) {
      record.candidates.push_back({t->id(),
                                   "token range " + t->tokens.str() +
                                       " does not cover the bucket's [" + std::to_string(lo) +
                                       ", " + std::to_string(bucket) + "]",
                                   0});
    } else {
      candidates.push_back(t);
    }
  }
  std::optional<CacheEntry> entry;
  measure(*op, problem, bucket, candidates, record, entry);
  if (entry) {
    entry->pass = pass;
    entry->tuned_at = utc_timestamp();
    entry->ranks = communicator_->size();
    record.tactic = entry->tactic;
    record.median_us = entry->median_us;
    record.default_us = entry->default_us;
    record.status = TuneStatus::kTuned;
    entries_.insert_or_assign(key, *entry);
    dirty_.insert(key);
    ++measured_;
    persist_locked();
  }
  record.seconds = now_seconds() - start;
  return record;
}

void Autotuner::measure(const OpSpec& op, const Problem& problem, std::int64_t bucket,
                        std::vector<const Tactic*>& candidates, TuneRecord& record,
                        std::optional<CacheEntry>& entry) {
  const MeasureSettings& settings = config_.options.measure;
  const std::size_t n = candidates.size();
  std::vector<std::string> notes(n);
  std::vector<double> failed(n, 0.0);
  std::unique_ptr<Workload> workload;
  try {
    workload = op.make_workload(problem, bucket);
  } catch (const std::exception& error) {
    std::fill(failed.begin(), failed.end(), 1.0);
    std::fill(notes.begin(), notes.end(), std::string("workload: ") + error.what());
  }
  // One correctness check of every candidate against the reference.
  for (std::size_t i = 0; workload && i < n; ++i) {
    try {
      const CheckResult check = workload->check(*candidates[i]);
      if (!check.ok) {
        failed[i] = 1.0;
        notes[i] = check.detail;
      }
    } catch (const std::exception& error) {
      failed[i] = 1.0;
      notes[i] = std::string("threw: ") + error.what();
    }
  }
  communicator_->all_reduce(failed, dist::ReduceOp::kMax);  // failing on any rank disqualifies
  std::vector<std::size_t> alive;
  for (std::size_t i = 0; i < n; ++i) {
    if (failed[i] == 0.0) {
      alive.push_back(i);
    } else {
      if (notes[i].empty()) notes[i] = "on another rank";
      record.candidates.push_back({candidates[i]->id(), "failed check: " + notes[i], 0});
    }
  }
  if (failed[0] != 0.0) {
    record.status = TuneStatus::kFailed;
    record.reason = "the default tactic " + candidates[0]->id() + " failed its check (" + notes[0] +
                    "): nothing tuned";
    warn_locked("autotune " + problem.canonical() + " bucket " + std::to_string(bucket) + ": " +
                record.reason);
    return;
  }
  CacheEntry result;
  result.problem = problem;
  result.bucket = bucket;
  if (alive.size() == 1) {  // nothing to compare: the default, untimed
    result.tactic = candidates[0]->id();
    record.candidates.push_back({result.tactic, "only candidate", 0});
    entry = std::move(result);
    return;
  }
  // Warm-up, then calls per sample so that one sample lasts min_sample_seconds.
  if (!timer_) timer_ = make_timer(backend());
  Timer& timer = *timer_;
  std::vector<double> local_failed(n, 0.0);
  std::vector<int> calls(n, 1);
  for (std::size_t i : alive) {
    try {
      for (int w = 0; w < settings.warmup_runs; ++w) workload->run(*candidates[i]);
      const double once = timer.seconds([&] { workload->run(*candidates[i]); });
      const double wanted = settings.min_sample_seconds / std::max(once, 1e-9);
      calls[i] = static_cast<int>(
          std::clamp(std::ceil(wanted), 1.0, static_cast<double>(settings.max_calls_per_sample)));
    } catch (const std::exception&) {
      local_failed[i] = 1.0;
    }
  }
  // Interleaved rounds (A B C, B C A, C A B, ...) so that drift hits every candidate alike.
  std::vector<std::vector<double>> samples(n);
  for (int round = 0; round < settings.rounds; ++round) {
    for (std::size_t j = 0; j < alive.size(); ++j) {
      const std::size_t i = alive[(j + static_cast<std::size_t>(round)) % alive.size()];
      double seconds = kInf;
      if (local_failed[i] == 0.0) {
        try {
          workload->rotate();
          seconds = timer.seconds([&] {
            for (int c = 0; c < calls[i]; ++c) workload->run(*candidates[i]);
          }) / calls[i];
        } catch (const std::exception&) {
          local_failed[i] = 1.0;
        }
      }
      samples[i].push_back(seconds);
    }
  }
  // Pool every rank's samples; every rank then computes the same medians and the same winner.
  std::vector<double> flat;
  for (std::size_t i : alive) flat.insert(flat.end(), samples[i].begin(), samples[i].end());
  const auto gathered = communicator_->all_gather(doubles_to_bytes(flat));
  std::vector<std::vector<double>> pooled(n);
  for (const auto& bytes : gathered) {
    const std::vector<double> values = bytes_to_doubles(bytes);
    if (values.size() != flat.size()) {
      fail(ErrorCode::kInternal, "autotune: ranks measured different numbers of samples for ",
           problem.canonical(), " (", values.size(), " vs ", flat.size(), ")");
    }
    std::size_t at = 0;
    for (std::size_t i : alive) {
      pooled[i].insert(pooled[i].end(), values.begin() + static_cast<std::ptrdiff_t>(at),
                       values.begin() + static_cast<std::ptrdiff_t>(at + settings.rounds));
      at += static_cast<std::size_t>(settings.rounds);
    }
  }
  std::vector<double> medians(n, kInf);
  std::size_t best = 0;
  for (std::size_t i : alive) {
    medians[i] = median(pooled[i]);
    if (medians[i] < medians[best]) best = i;  // strict: ties keep the earlier (default first)
    record.candidates.push_back({candidates[i]->id(),
                                 std::isfinite(medians[i]) ? "timed" : "failed during timing",
                                 std::isfinite(medians[i]) ? medians[i] * 1e6 : 0});
    if (std::isfinite(medians[i]))
      result.candidates.push_back({candidates[i]->id(), medians[i] * 1e6});
  }
  // Tie band: the default stays unless the best beats it by more than tie_band.
  std::size_t winner = 0;
  if (best != 0 && medians[best] < medians[0] * (1.0 - settings.tie_band)) winner = best;
  if (!std::isfinite(medians[winner])) winner = 0;
  result.tactic = candidates[winner]->id();
  result.median_us = std::isfinite(medians[winner]) ? medians[winner] * 1e6 : 0;
  result.default_us = std::isfinite(medians[0]) ? medians[0] * 1e6 : 0;
  entry = std::move(result);
}

// ---- TuningSession -----------------------------------------------------------------------

namespace {

// Exact (shortest round-trip) text of a setting: std::to_string's 6 decimals would show
// 2e-7 and 3e-7 alike.
std::string exact(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return {buffer, result.ptr};
}

// Everything ranks must share for a session: what it tunes (pass, mode, backend, registry,
// skip list) and how it measures. Ranks that measured differently would pool incomparable
// samples, or (other rounds) gather different amounts and diverge.
std::string session_settings(const Autotuner& tuner, const std::string& pass) {
  static_assert(sizeof(MeasureSettings) == 32,
                "MeasureSettings changed: compare the new field across ranks below");
  const AutotuneOptions& o = tuner.options();
  const MeasureSettings& m = o.measure;
  std::string text =
      "pass=" + pass + " mode=" + std::string(to_string(o.mode)) +
      " backend=" + std::string(to_string(tuner.backend())) +
      " registry=" + tuner.registry().hash() + " warmup_runs=" + std::to_string(m.warmup_runs) +
      " rounds=" + std::to_string(m.rounds) + " min_sample_seconds=" + exact(m.min_sample_seconds) +
      " max_calls_per_sample=" + std::to_string(m.max_calls_per_sample) +
      " tie_band=" + exact(m.tie_band) + " skip=";
  for (const std::string& s : o.skip_ops) text += s + ",";
  return text;
}

}  // namespace

TuningSession::TuningSession(Autotuner& tuner, std::string pass,
                             std::optional<double> budget_seconds)
    : tuner_(tuner), pass_(std::move(pass)) {
  if (pass_.empty())
    fail_argument(ErrorCode::kInvalidArgument, "tuning pass name", "non-empty", "''");
  start_ = tuner_.now_seconds();
  const double budget = budget_seconds.value_or(tuner_.options().budget_seconds);
  if (budget < 0)
    fail_argument(ErrorCode::kInvalidArgument, "tuning budget", ">= 0 seconds", budget);
  deadline_ = budget > 0 ? start_ + budget : kInf;
  dist::Communicator& comm = tuner_.communicator();
  if (comm.size() > 1) {
    // All ranks must run the same plan with the same settings, or the collectives would
    // diverge: check it once, up front, and fail on every rank alike.
    const auto all = comm.all_gather(text_bytes(session_settings(tuner_, pass_)));
    for (std::size_t r = 1; r < all.size(); ++r) {
      if (all[r] != all[0]) {
        fail(ErrorCode::kInvalidArgument, "tuning session '", pass_, "': rank ", r,
             " runs another configuration than rank 0 (", std::string(all[r].begin(), all[r].end()),
             " vs ", std::string(all[0].begin(), all[0].end()), ")");
      }
    }
  }
}

TuningSession::~TuningSession() {
  if (closed_) return;
  try {
    const std::lock_guard<std::mutex> lock(tuner_.mutex_);
    tuner_.persist_locked();
    tuner_.publish_locked();
  } catch (const std::exception& error) {
    log_warn("tuning session '", pass_, "' could not save on exit: ", error.what());
  }
}

void TuningSession::close() {
  const std::lock_guard<std::mutex> lock(tuner_.mutex_);
  tuner_.persist_locked();
  tuner_.publish_locked();
  closed_ = true;
}

double TuningSession::elapsed_seconds() const { return tuner_.now_seconds() - start_; }

TuneRecord TuningSession::tune(const Problem& problem, std::int64_t bucket) {
  if (closed_) fail(ErrorCode::kInvalidArgument, "tuning session '", pass_, "' is closed");
  TuneRecord record;
  {
    const std::lock_guard<std::mutex> lock(tuner_.mutex_);
    record = tuner_.tune_key(problem, bucket, pass_, deadline_);
  }
  records_.push_back(record);
  if (callback_) callback_(record);
  return record;
}

std::vector<TuneRecord> TuningSession::tune_tokens(const Problem& problem,
                                                   std::span<const std::int64_t> token_counts) {
  for (std::int64_t tokens : token_counts) {
    if (tokens < 1) fail_argument(ErrorCode::kInvalidArgument, "token count", ">= 1", tokens);
  }
  const OpSpec* op = tuner_.registry().find_op(problem.op(), tuner_.backend());
  if (op == nullptr) {  // reported once (kFailed), not once per token count
    return token_counts.empty() ? std::vector<TuneRecord>{}
                                : std::vector<TuneRecord>{tune(problem, token_counts[0])};
  }
  std::vector<std::int64_t> buckets;
  for (std::int64_t tokens : token_counts) {
    buckets.push_back(op->buckets[bucket_index(op->buckets, tokens)]);
  }
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  std::vector<TuneRecord> out;
  for (std::int64_t bucket : buckets) out.push_back(tune(problem, bucket));
  return out;
}

}  // namespace mxq::tune
