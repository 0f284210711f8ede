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
//   merge (an update replaces only the entry with its own key), write ".<name>.tmp-<pid>-..."
//   next to it, fsync, rename over the file, fsync the directory (the library's one atomic
//   writer). Readers never see a partial file. A new file gets 0666 & ~umask; a rewritten one
//   keeps its permission bits.
//   <file> is the cache path with symlinks followed, so a symlinked cache is saved into its
//   target (the link stays) under the target's lock.
// - A file that cannot be parsed (corrupt, truncated, empty, larger than kMaxCacheFileBytes,
//   wrong format, missing or older schema) is moved aside to "<file>.corrupt-<time>-<pid>" with
//   a warning, and the process continues with an empty cache.
// - A file with another fingerprint, or written by another mxq build (newer schema, fingerprint
//   fields this build does not know or lacks), is left byte-for-byte untouched and not served.
// - Saves keep what this build cannot read: malformed entries (written back as read: the same
//   JSON value, members in their order, numbers as spelled; never served) and an entry's unknown
//   members (written back with it until its key gets a new winner).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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
  // The entry's members this build does not know (a later schema minor version's), as JSON
  // text ("\"name\":value,..."): written back with the entry so a save by an older build keeps
  // them.
  std::string unknown_members;

  // "<problem canonical>@<bucket>": entries with the same key replace each other.
  [[nodiscard]] std::string key() const;
  friend bool operator==(const CacheEntry&, const CacheEntry&) = default;
};

struct CacheFile {
  Fingerprint fingerprint;
  std::vector<CacheEntry> entries;  // sorted by key(), unique keys
  // Entries of the file that could not be read (kept out of `entries`), one line each.
  std::vector<std::string> skipped;
  // The malformed ones among them, as JSON text: never served, but written back as read
  // (after `entries`) so that a save never erases what a user or another build may still fix.
  std::vector<std::string> malformed;
};

std::string serialize_cache(const CacheFile& file);
// Throws Error(kFormat) when the text is not a cache file this build can read.
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
  // kCorrupt only: the file is an mxq cache of another build (a newer schema_version, or a
  // fingerprint with fields this build does not know, lacks or cannot read), not a broken
  // one: like a file of another fingerprint it is never moved aside or overwritten.
  bool other_build = false;
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

// One cache file as seen by one process: load, then save any number of times. The path is
// resolved once, at construction: symlinks are followed (also to a target that does not exist
// yet) and every file operation (read, lock, temp file, rename, move aside) uses the target,
// so writers through a link and through the target share one file and one lock. Warnings name
// the path as given.
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
  // fingerprint or another build's file: empty, foreign() = true, never moved.
  Outcome load(std::vector<CacheEntry>& entries, Unreadable unreadable = Unreadable::kMoveAside);
  // Re-reads the file only if another process replaced it since this store last read or wrote
  // it (one stat otherwise); returns true and its entries when it did and they are usable.
  bool reload_if_changed(std::vector<CacheEntry>& entries);
  // Lock, re-read (skipped when the file is still the version this store last read or wrote),
  // merge `updates` over it, write atomically. A foreign file is not touched (ok = false; the
  // warning is given once per version of that file, so a caller may retry at every save).
  // `malformed` (entries of other files, as JSON text: `cache merge`) are added as they are
  // unless the file holds the same text already. A save that changes nothing (every update and
  // malformed text is in the file already) leaves an existing file as it is.
  Outcome save(std::span<const CacheEntry> updates, std::span<const std::string> malformed = {});
  // Same as save(), but first removes the entries for which `drop` is true (prune); a prune that
  // removes nothing does not touch the file.
  Outcome rewrite(std::span<const CacheEntry> updates,
                  const std::function<bool(const CacheEntry&)>& drop,
                  std::span<const std::string> malformed = {});

  // Why a save would fail, before any work is spent on what it would save; empty when it would
  // not: the folder cannot be created, the lock file or a temporary file cannot be created in it
  // (a read-only file system or folder, a path through a file), or the file is another
  // fingerprint's or another build's (never written into). Creates the folder and the lock file,
  // as a save does, and nothing else.
  [[nodiscard]] std::string save_blocker() const;

  [[nodiscard]] const std::string& path() const { return path_; }      // as given
  [[nodiscard]] const std::string& target() const { return target_; }  // symlinks followed
  [[nodiscard]] const Fingerprint& fingerprint() const { return fingerprint_; }
  [[nodiscard]] bool foreign() const { return foreign_; }

 private:
  [[nodiscard]] std::string foreign_description(const ReadResult& read) const;
  bool refresh_locked(Outcome& outcome);
  void take_snapshot(ReadResult&& read);
  void clear_snapshot();

  std::string path_;
  std::string target_;
  Fingerprint fingerprint_;
  bool foreign_ = false;
  // The version of a foreign file a save last refused (and warned about).
  std::optional<FileIdentity> refused_;
  bool have_snapshot_ = false;
  FileIdentity snapshot_identity_;
  std::map<std::string, CacheEntry> snapshot_;   // the file's entries at snapshot_identity_
  std::vector<std::string> snapshot_malformed_;  // and its malformed entries, as read
};

}  // namespace mxq::tune
