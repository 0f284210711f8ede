// The autotuner: serves a tactic for every (problem, token count) from an immutable table
// (lock-free, allocation-free, no device synchronization: safe during CUDA graph capture), and
// tunes what its cache lacks inside TuningSessions.
//
//   Autotuner tuner({.options = AutotuneOptions::from_env(), .deployment = deployment});
//   {
//     TuningSession target(tuner, "target");
//     target.tune_tokens(problem, {1, 8, 64});  // measures, persists each winner at once
//   }                                           // leaving the scope saves, exceptions included
//   { TuningSession draft(tuner, "draft"); ... }  // merges with the target's entries
//   tuner.seal();                                 // ranks agree on one table (collective)
//   const Tactic* t = tuner.lookup(problem, tokens).tactic;
//
// Multi-rank: give every rank's Autotuner its Communicator and run the same sessions with the
// same (problem, bucket) sequence on every rank. The collectives depend only on that sequence,
// never on what a rank has cached, so a warm rank cannot race ahead of a cold one; timings are
// pooled so all ranks pick the same winner; seal() compares a digest of the decisions and makes
// every rank adopt rank 0's on mismatch (warning with the differing entries).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "mxq/dist/communicator.h"
#include "mxq/tune/cache_file.h"
#include "mxq/tune/options.h"
#include "mxq/tune/registry.h"
#include "mxq/tune/timer.h"

namespace mxq::tune {

enum class SelectionSource : std::uint8_t {
  kTuned,       // the cache's decision for this problem and bucket
  kDefault,     // nothing tuned for this problem and bucket: the op's default tactic
  kSkipped,     // the op is in the skip list: its default tactic
  kOutOfRange,  // the decision is not valid for this token count: the default tactic
  kUnknownOp,   // no such op for this backend: tactic is null
};
std::string_view to_string(SelectionSource source);

struct Selection {
  const Tactic* tactic = nullptr;
  SelectionSource source = SelectionSource::kUnknownOp;
};

enum class TuneStatus {
  kTuned,     // measured now and saved
  kHit,       // already decided (cache or an earlier pass): nothing measured
  kSkipped,   // op in the skip list
  kNotTuned,  // mode off/load: nothing measured, the default serves when not cached
  kBudget,    // the tuning budget was used up: the default serves
  kFailed,    // could not tune (e.g. the default tactic failed its check): the default serves
};
std::string_view to_string(TuneStatus status);

struct CandidateResult {
  std::string tactic;
  std::string status;  // "timed", "unsupported: ...", "out of token range ...", "failed check: ..."
  double median_us = 0;
};

struct TuneRecord {
  std::string pass;
  std::string problem;  // canonical
  std::string op;
  std::int64_t bucket = 0;
  TuneStatus status = TuneStatus::kNotTuned;
  std::string tactic;  // what serves this key now
  std::string reason;  // why (for every status but kTuned/kHit)
  double median_us = 0;
  double default_us = 0;
  double seconds = 0;  // wall time spent on this key
  std::vector<CandidateResult> candidates;
};

// Why `entry` would not be served by a tuner of `registry` for `backend` (unknown op or
// tactic, a bucket the op does not have, supports() false, token range not containing the
// bucket); empty when it would be.
std::string entry_problem(const CacheEntry& entry, const TacticRegistry& registry, Backend backend);

struct AutotunerConfig {
  AutotuneOptions options;
  Backend backend = Backend::kCpu;
  int device = 0;
  const TacticRegistry* registry = nullptr;    // null: builtin_tactics()
  std::optional<Deployment> deployment;        // names the default cache file
  std::optional<Fingerprint> fingerprint;      // null: this machine's
  dist::Communicator* communicator = nullptr;  // null: a single rank
  std::shared_ptr<Timer> timer;                // null: make_timer(backend)
  // In tune and fresh mode: the constructor checks, before it reads anything, that the cache
  // file can be saved into (CacheStore::save_blocker) and throws Error(kIo) saying why not,
  // instead of tuning every key and keeping the decisions in memory only (`mxq tune`).
  bool require_saving = false;
};

class LookupTable;

class Autotuner {
 public:
  explicit Autotuner(AutotunerConfig config);
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // The tactic to run. Never allocates, locks or synchronizes a device. The result is valid for
  // the problem (supports()) and for `tokens` (token range), or the op's default.
  Selection lookup(const Problem& problem, std::int64_t tokens) const noexcept;

  // Makes lookups serve the current decisions (TuningSession does this when it ends).
  void publish();
  // Collective: ranks compare a digest of their decisions; on mismatch every rank adopts rank
  // 0's (warning naming the differing entries). Then publishes.
  void seal();

  // Decisions lookup would serve (valid for this registry and backend, op not skipped), by key.
  [[nodiscard]] std::vector<CacheEntry> decisions() const;
  [[nodiscard]] std::uint64_t decisions_digest() const;

  [[nodiscard]] AutotuneMode mode() const { return config_.options.mode; }
  [[nodiscard]] const AutotuneOptions& options() const { return config_.options; }
  [[nodiscard]] Backend backend() const { return config_.backend; }
  [[nodiscard]] const TacticRegistry& registry() const { return *registry_; }
  [[nodiscard]] const Fingerprint& fingerprint() const { return fingerprint_; }
  [[nodiscard]] dist::Communicator& communicator() const { return *communicator_; }
  // The file this tuner reads and writes (the runs/ file in fresh mode; empty when off).
  [[nodiscard]] const std::string& cache_path() const { return cache_path_; }
  [[nodiscard]] bool skipped(std::string_view op) const;
  // Warnings issued so far (also logged): unreadable or foreign files, adopted decisions, ...
  [[nodiscard]] std::vector<std::string> warnings() const;
  // Number of (problem, bucket) keys measured by this process.
  [[nodiscard]] int measured_count() const;
  // Decisions tuned by this process that are not in the cache file yet (a foreign file it may not
  // write into, or a save that failed); 0 once every winner is saved.
  [[nodiscard]] int unsaved_count() const;

 private:
  friend class TuningSession;
  TuneRecord tune_key(const Problem& problem, std::int64_t bucket, const std::string& pass,
                      double deadline_seconds);
  void measure(const OpSpec& op, const Problem& problem, std::int64_t bucket,
               std::vector<const Tactic*>& candidates, TuneRecord& record,
               std::optional<CacheEntry>& entry);
  void persist_locked();
  void publish_locked();
  [[nodiscard]] bool servable_locked(const CacheEntry& entry) const;
  [[nodiscard]] std::vector<CacheEntry> decisions_locked() const;
  void warn_locked(std::string text);
  double now_seconds() const;

  AutotunerConfig config_;
  const TacticRegistry* registry_;
  Fingerprint fingerprint_;
  std::unique_ptr<dist::Communicator> solo_;
  dist::Communicator* communicator_;
  std::shared_ptr<Timer> timer_;
  std::string cache_path_;

  mutable std::mutex mutex_;  // everything below but table_
  std::unique_ptr<CacheStore> store_;
  std::map<std::string, CacheEntry> entries_;  // key -> decision (loaded, measured, adopted)
  std::set<std::string> dirty_;                // keys not yet saved
  std::vector<std::string> warnings_;
  int measured_ = 0;
  std::atomic<const LookupTable*> table_{nullptr};
  std::vector<std::unique_ptr<const LookupTable>> tables_;  // every table ever published
};

// One tuning pass ("target", "draft", ...). Any number of sessions, in any order, merge into
// the tuner's decisions; none erases another's entries. Every winner is saved as soon as it is
// measured; leaving the scope saves again and publishes, also when it is left by an exception.
class TuningSession {
 public:
  // Collective when the tuner has several ranks (checks that all run the same configuration).
  // budget_seconds overrides the options' budget for this pass (0 = unlimited).
  TuningSession(Autotuner& tuner, std::string pass, std::optional<double> budget_seconds = {});
  ~TuningSession();
  TuningSession(const TuningSession&) = delete;
  TuningSession& operator=(const TuningSession&) = delete;

  // Tunes one key (bucket must be one of the op's buckets).
  TuneRecord tune(const Problem& problem, std::int64_t bucket);
  // Tunes the buckets serving these token counts (each bucket once).
  std::vector<TuneRecord> tune_tokens(const Problem& problem,
                                      std::span<const std::int64_t> token_counts);
  // The same with a braced list: session.tune_tokens(problem, {1, 8, 64}).
  std::vector<TuneRecord> tune_tokens(const Problem& problem,
                                      std::initializer_list<std::int64_t> token_counts) {
    return tune_tokens(problem,
                       std::span<const std::int64_t>(token_counts.begin(), token_counts.size()));
  }
  // Called after every key (progress reporting).
  void on_record(std::function<void(const TuneRecord&)> callback) {
    callback_ = std::move(callback);
  }

  [[nodiscard]] const std::vector<TuneRecord>& records() const { return records_; }
  [[nodiscard]] const std::string& pass() const { return pass_; }
  [[nodiscard]] double elapsed_seconds() const;
  // Saves and publishes now (throws on failure); the destructor then has nothing left to do.
  void close();

 private:
  Autotuner& tuner_;
  std::string pass_;
  double start_ = 0;
  double deadline_ = 0;  // tuner clock seconds; +inf when unlimited
  bool closed_ = false;
  std::vector<TuneRecord> records_;
  std::function<void(const TuneRecord&)> callback_;
};

}  // namespace mxq::tune
