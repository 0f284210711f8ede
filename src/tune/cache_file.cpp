#include "mxq/tune/cache_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

#include "core/unique_fd.h"
#include "io/file_util.h"
#include "mxq/core/error.h"
#include "mxq/core/log.h"
#include "tune/cache_json.h"

namespace mxq::tune {
namespace {

using mxq::detail::UniqueFd;

std::string errno_text() { return std::strerror(errno); }

// ---- files -------------------------------------------------------------------------------

FileIdentity identity_of(const struct stat& st) {
  FileIdentity id;
  id.device = st.st_dev;
  id.inode = st.st_ino;
  id.size = st.st_size;
  id.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  id.ctime_ns = static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return id;
}

bool stat_identity(const std::string& path, FileIdentity& id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  id = identity_of(st);
  return true;
}

std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::atomic<unsigned> temp_counter{0};

}  // namespace

std::string CacheEntry::key() const { return problem.canonical() + "@" + std::to_string(bucket); }

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

ReadResult read_cache_file(const std::string& path) {
  ReadResult result;
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return result;  // kMissing
    result.status = ReadStatus::kCorrupt;
    result.problem = "cannot open: " + errno_text();
    return result;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    result.status = ReadStatus::kCorrupt;
    result.problem = "not a regular file";
    return result;
  }
  result.identity = identity_of(st);
  if (static_cast<std::uintmax_t>(st.st_size) > kMaxCacheFileBytes) {
    result.status = ReadStatus::kCorrupt;
    result.problem = "file is " + std::to_string(st.st_size) + " bytes, more than the limit of " +
                     std::to_string(kMaxCacheFileBytes);
    return result;
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  if (text.empty()) {
    result.status = ReadStatus::kCorrupt;
    result.problem = "file is empty";
    return result;
  }
  try {
    detail::ParsedCache parsed = detail::parse_cache_text(text);
    result.status = parsed.problem.empty() ? ReadStatus::kOk : ReadStatus::kCorrupt;
    result.problem = std::move(parsed.problem);
    result.other_build = parsed.other_build;
    result.file = std::move(parsed.file);
  } catch (const Error& error) {
    result.status = ReadStatus::kCorrupt;
    result.problem = error.what();
  }
  return result;
}

std::string move_aside(const std::string& path) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  const std::string target = path + ".corrupt-" + stamp + "-" + std::to_string(::getpid()) + "-" +
                             std::to_string(temp_counter.fetch_add(1));
  if (::rename(path.c_str(), target.c_str()) != 0) {
    fail(ErrorCode::kIo, "cannot move the unreadable cache ", path, " aside to ", target, ": ",
         errno_text());
  }
  return target;
}

CacheLock::CacheLock(const std::string& path) {
  const std::string lock_path = path + ".lock";
  UniqueFd fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666));
  if (!fd.valid()) {
    fail(ErrorCode::kIo, "cannot open the cache lock ", lock_path, ": ", errno_text());
  }
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    fail(ErrorCode::kIo, "cannot lock ", lock_path, ": ", errno_text());
  }
  fd_ = fd.release();
}

CacheLock::~CacheLock() {
  const UniqueFd lock(fd_);  // closing releases the flock
}

// ---- CacheStore --------------------------------------------------------------------------

namespace {

constexpr int kMaxSymlinkHops = 40;  // as the kernel (MAXSYMLINKS)

// The file `path` stands for: symlinks in its last component followed, also to a target that
// does not exist yet (std::filesystem::weakly_canonical would stop at such a link). Saving
// renames a temp file onto this path: onto a link it would replace the link, and a lock named
// after the link would not exclude writers that name the target. Relative targets are joined to
// the link's own folder unnormalized, so ".." is resolved by the kernel as the link would be.
std::string resolve_symlinks(const std::string& path) {
  std::filesystem::path p = path;
  for (int hops = 0; hops <= kMaxSymlinkHops; ++hops) {
    std::error_code error;
    if (!std::filesystem::is_symlink(std::filesystem::symlink_status(p, error))) return p.string();
    const std::filesystem::path next = std::filesystem::read_symlink(p, error);
    if (error) return p.string();  // reading it will fail and say why
    p = next.is_absolute() ? next : p.parent_path() / next;
  }
  fail(ErrorCode::kInvalidArgument, "autotune cache ", path, ": more than ", kMaxSymlinkHops,
       " symlinks to follow (a loop?)");
}

void warn(CacheStore::Outcome& outcome, std::string text) {
  log_warn(text);
  outcome.warnings.push_back(std::move(text));
}

// An unreadable file that is no other build's: the one kind a tuner moves aside.
bool broken(const ReadResult& read) {
  return read.status == ReadStatus::kCorrupt && !read.other_build;
}

}  // namespace

CacheStore::CacheStore(std::string path, Fingerprint fingerprint)
    : path_(std::move(path)),
      target_(resolve_symlinks(path_)),
      fingerprint_(std::move(fingerprint)) {}

// Why the file read is not this store's to serve or write ("" when it is).
std::string CacheStore::foreign_description(const ReadResult& read) const {
  if (read.status == ReadStatus::kCorrupt && read.other_build) {
    return "was written by another mxq build (" + read.problem + ")";
  }
  if (read.status != ReadStatus::kOk || read.file.fingerprint == fingerprint_) return {};
  std::string text = "was tuned with another fingerprint (";
  const auto diffs = fingerprint_.differences(read.file.fingerprint);
  for (std::size_t i = 0; i < diffs.size(); ++i) text += (i ? "; " : "") + diffs[i];
  return text + ")";
}

void CacheStore::take_snapshot(ReadResult&& read) {
  snapshot_.clear();
  for (CacheEntry& e : read.file.entries) {
    std::string key = e.key();
    snapshot_.emplace(std::move(key), std::move(e));
  }
  snapshot_malformed_ = std::move(read.file.malformed);
  snapshot_identity_ = read.identity;
  have_snapshot_ = true;
}

void CacheStore::clear_snapshot() {
  snapshot_.clear();
  snapshot_malformed_.clear();
  have_snapshot_ = false;
}

CacheStore::Outcome CacheStore::load(std::vector<CacheEntry>& entries, Unreadable unreadable) {
  Outcome outcome;
  entries.clear();
  ReadResult read = read_cache_file(target_);
  if (broken(read) && unreadable == Unreadable::kLeave) {
    warn(outcome, "autotune cache " + path_ + " is unreadable (" + read.problem +
                      "); not used, and left as it is (a tuning run would move it aside)");
    outcome.ok = false;
    return outcome;
  }
  if (broken(read)) {
    // Move aside under the lock, after checking that no writer replaced it meanwhile.
    try {
      std::filesystem::create_directories(parent_dir(target_));
      const CacheLock lock(target_);
      read = read_cache_file(target_);
      if (broken(read)) {
        const std::string moved = move_aside(target_);
        warn(outcome, "autotune cache " + path_ + " is unreadable (" + read.problem +
                          "); moved aside to " + moved + ", starting with an empty cache");
        outcome.moved_aside = true;
        read = ReadResult{};
      }
    } catch (const std::exception& error) {
      warn(outcome, "autotune cache " + path_ + " is unreadable (" + read.problem +
                        ") and could not be moved aside (" + error.what() + "); not used");
      outcome.ok = false;
      return outcome;
    }
  }
  if (read.status == ReadStatus::kMissing) {
    clear_snapshot();
    return outcome;
  }
  if (const std::string foreign = foreign_description(read); !foreign.empty()) {
    foreign_ = true;
    warn(outcome, "autotune cache " + path_ + " " + foreign +
                      ": its entries are not served and the file is left untouched");
    outcome.ok = false;
    return outcome;
  }
  for (const std::string& line : read.file.skipped) {
    warn(outcome, "autotune cache " + path_ + ": skipped " + line);
  }
  foreign_ = false;
  entries = read.file.entries;
  take_snapshot(std::move(read));
  return outcome;
}

bool CacheStore::reload_if_changed(std::vector<CacheEntry>& entries) {
  FileIdentity current;
  if (!stat_identity(target_, current)) return false;
  if (have_snapshot_ && current == snapshot_identity_) return false;
  ReadResult read = read_cache_file(target_);
  if (read.status != ReadStatus::kOk || !(read.file.fingerprint == fingerprint_)) return false;
  entries = read.file.entries;
  take_snapshot(std::move(read));
  return true;
}

CacheStore::Outcome CacheStore::save(std::span<const CacheEntry> updates,
                                     std::span<const std::string> malformed) {
  return rewrite(updates, nullptr, malformed);
}

// Under the lock: brings the snapshot up to the file's current version, moving a broken file
// aside. False when the file is not ours to write (another fingerprint or build): it is left
// untouched, with a warning the first time a save finds this version of it, so that callers
// can retry every save without repeating the warning.
bool CacheStore::refresh_locked(Outcome& outcome) {
  FileIdentity current;
  if (!stat_identity(target_, current)) {
    clear_snapshot();
    return true;
  }
  if (have_snapshot_ && current == snapshot_identity_) return true;
  if (refused_ && current == *refused_) {
    outcome.ok = false;
    return false;
  }
  ReadResult read = read_cache_file(target_);
  if (broken(read)) {
    const std::string moved = move_aside(target_);
    warn(outcome, "autotune cache " + path_ + " is unreadable (" + read.problem +
                      "); moved aside to " + moved + " before saving");
    outcome.moved_aside = true;
    clear_snapshot();
  } else if (read.status == ReadStatus::kMissing) {
    clear_snapshot();
  } else if (const std::string foreign = foreign_description(read); !foreign.empty()) {
    foreign_ = true;
    refused_ = read.identity;
    warn(outcome, "autotune cache " + path_ + " " + foreign +
                      ": not saving into it; tuned entries stay in memory only");
    outcome.ok = false;
    return false;
  } else {
    take_snapshot(std::move(read));
  }
  return true;
}

CacheStore::Outcome CacheStore::rewrite(std::span<const CacheEntry> updates,
                                        const std::function<bool(const CacheEntry&)>& drop,
                                        std::span<const std::string> malformed) {
  Outcome outcome;
  std::filesystem::create_directories(parent_dir(target_));
  const CacheLock lock(target_);
  if (!refresh_locked(outcome)) return outcome;
  foreign_ = false;
  refused_.reset();
  // A missing file (or one just moved aside) is written even when empty.
  bool changed = !have_snapshot_;
  if (drop) {
    changed |= std::erase_if(snapshot_, [&](const auto& item) { return drop(item.second); }) > 0;
  }
  for (const CacheEntry& e : updates) {
    const auto [it, inserted] = snapshot_.try_emplace(e.key(), e);
    if (!inserted && !(it->second == e)) {
      it->second = e;
      changed = true;
    }
    changed |= inserted;
  }
  for (const std::string& text : malformed) {
    if (std::find(snapshot_malformed_.begin(), snapshot_malformed_.end(), text) ==
        snapshot_malformed_.end()) {
      snapshot_malformed_.push_back(text);
      changed = true;
    }
  }
  // Temp files of writers that died mid-save (no other writer runs while the lock is held).
  io::detail::remove_stale_temporaries(target_);
  if (!changed) return outcome;            // the file holds all of it already: it is left as it is
  std::vector<const CacheEntry*> entries;  // in key order
  entries.reserve(snapshot_.size());
  for (const auto& item : snapshot_) entries.push_back(&item.second);
  io::detail::write_file_atomically(
      target_, detail::serialize_cache_text(fingerprint_, entries, snapshot_malformed_),
      "autotune cache");
  have_snapshot_ = stat_identity(target_, snapshot_identity_);
  return outcome;
}

std::string CacheStore::save_blocker() const {
  const std::string dir = parent_dir(target_);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return "its folder " + dir + " cannot be created (" + error.message() + ")";
  try {
    const CacheLock lock(target_);
    // A temporary file as a save writes (write_file_atomically removes one left behind).
    const std::string probe = target_ + ".tmp." + std::to_string(::getpid()) + ".probe";
    const UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0) return "no file can be created in " + dir + " (" + errno_text() + ")";
    ::unlink(probe.c_str());
    if (const std::string foreign = foreign_description(read_cache_file(target_));
        !foreign.empty()) {
      return foreign + ", and such a file is never written into";
    }
  } catch (const std::exception& failure) {
    return failure.what();
  }
  return {};
}

}  // namespace mxq::tune
