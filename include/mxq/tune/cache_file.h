// The persistent tactic cache: one JSON file per deployment, shared by every rank and every
// tuning pass of that deployment on one machine.
//
//   {"format": "mxq-autotune-cache", "schema_version": 1,
//    "fingerprint": {"backend": ..., "device": ..., ..., "registry_hash": ...},
//    "entries": [ {"op", "shape", "dtypes", "bucket", "tactic", "median_us", "default_us",
//                  "pass", "tuned_at", "ranks", "candidates"}, ... ]}
//
// Guarantees (docs/autotune.md says how each is tested):
// - Writers never lose each other's entries: save = exclusive flock on "<file>.lock", re-read,
//   merge (an update replaces only the entry with its own key), write "<file>.tmp.<pid>.<n>",
//   fsync, rename over the file, fsync the directory. Readers never see a partial file.
// - A file that cannot be parsed (corrupt, truncated, empty, larger than kMaxCacheFileBytes,
//   wrong format or schema) is moved aside to "<file>.corrupt-<time>-<pid>" with a warning, and
//   the process continues with an empty cache.
// - A file with another fingerprint is left byte-for-byte untouched and not served.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/tune/fingerprint.h"
#include "mxq/tune/problem.h"

namespace mxq::tune {

inline constexpr std::string_view kCacheFormat = "mxq-autotune-cache";
inline constexpr int kCacheSchemaVersion = 1;
inline constexpr std::uintmax_t kMaxCacheFileBytes = std::uintmax_t{64} << 20;

struct CandidateTiming {
  std::string tactic;
  double median_us = 0;
  friend bool operator==(const CandidateTiming&, const CandidateTiming&) = default;
};

// One decision: for `problem` at token bucket `bucket`, run `tactic`.
struct CacheEntry {
  Problem problem;
  std::int64_t bucket = 0;
  std::string tactic;                       // Tactic::id()
  double median_us = 0;                     // the winner's median
  double default_us = 0;                    // the default tactic's median (0 when not timed)
  std::string pass;                         // tuning pass that measured it ("target", "draft", ...)
  std::string tuned_at;                     // UTC, ISO 8601
  int ranks = 1;                            // ranks whose timings were pooled
  std::vector<CandidateTiming> candidates;  // every timed candidate's median

  // "<problem canonical>@<bucket>": entries with the same key replace each other.
  [[nodiscard]] std::string key() const;
  friend bool operator==(const CacheEntry&, const CacheEntry&) = default;
};

struct CacheFile {
  Fingerprint fingerprint;
  std::vector<CacheEntry> entries;  // sorted by key(), unique keys
  // Entries of the file that could not be read (kept out of `entries`), one line each.
  std::vector<std::string> skipped;
};

std::string serialize_cache(const CacheFile& file);
// Throws Error(kFormat) when the text is not a cache file of this schema.
CacheFile parse_cache(std::string_view text);
std::string utc_timestamp();  // "2026-12-02T10:00:00Z"

// Identity of one version of a file (rename gives every written version a new one).
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = -1;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

enum class ReadStatus { kOk, kMissing, kCorrupt };
struct ReadResult {
  ReadStatus status = ReadStatus::kMissing;
  CacheFile file;
  std::string problem;  // why kCorrupt (or the I/O error)
  FileIdentity identity;
};
// Reads and parses `path`; no side effects (never moves, writes or locks anything).
ReadResult read_cache_file(const std::string& path);

// Renames a broken cache file to "<path>.corrupt-<time>-<pid>" and returns the new name.
std::string move_aside(const std::string& path);

// Holds the exclusive lock on "<path>.lock" for its lifetime (flock; released by the kernel if
// the process dies).
class CacheLock {
 public:
  explicit CacheLock(const std::string& path);
  ~CacheLock();
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  int fd_ = -1;
};

// Writes `text` to `path` atomically (temp file in the same directory, fsync, rename, fsync of
// the directory). The caller holds the CacheLock. Removes temp files of dead writers first.
void write_file_atomically(const std::string& path, std::string_view text);

// One cache file as seen by one process: load, then save any number of times.
class CacheStore {
 public:
  struct Outcome {
    bool ok = true;                     // load: entries usable; save: written
    bool moved_aside = false;           // the file was unreadable and has been moved aside
    std::vector<std::string> warnings;  // also logged with log_warn
  };

  CacheStore(std::string path, Fingerprint fingerprint);

  // What load() does with a file it cannot read: a process that will write the cache moves it
  // aside (its bytes kept) so the next save starts a new file; a read-only one leaves it as it is.
  enum class Unreadable { kMoveAside, kLeave };
  // Reads the file (no lock needed: writers rename whole files). Missing: empty. Unreadable:
  // empty, ok = false, the file moved aside under the lock or left alone as asked. Another
  // fingerprint: empty, foreign() = true.
  Outcome load(std::vector<CacheEntry>& entries, Unreadable unreadable = Unreadable::kMoveAside);
  // Re-reads the file only if another process replaced it since this store last read or wrote
  // it (one stat otherwise); returns true and its entries when it did and they are usable.
  bool reload_if_changed(std::vector<CacheEntry>& entries);
  // Lock, re-read (skipped when the file is still the version this store last read or wrote),
  // merge `updates` over it, write atomically. A foreign file is not touched (ok = false).
  Outcome save(std::span<const CacheEntry> updates);
  // Same as save(), but first removes the entries for which `drop` is true (prune).
  Outcome rewrite(std::span<const CacheEntry> updates,
                  const std::function<bool(const CacheEntry&)>& drop);

  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] const Fingerprint& fingerprint() const { return fingerprint_; }
  [[nodiscard]] bool foreign() const { return foreign_; }

 private:
  std::string path_;
  Fingerprint fingerprint_;
  bool foreign_ = false;
  bool have_snapshot_ = false;
  FileIdentity snapshot_identity_;
  std::map<std::string, CacheEntry> snapshot_;  // the file's entries at snapshot_identity_
};

}  // namespace mxq::tune
