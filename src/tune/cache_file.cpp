#include "mxq/tune/cache_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "mxq/core/error.h"
#include "mxq/core/log.h"

namespace mxq::tune {
namespace {

using nlohmann::json;

std::string errno_text() { return std::strerror(errno); }

// ---- serialization -----------------------------------------------------------------------

void append_string(std::string& out, std::string_view text) {
  out += json(std::string(text)).dump();
}

void append_number(std::string& out, double value) {
  char buffer[40];
  if (!std::isfinite(value)) value = 0;
  std::snprintf(buffer, sizeof buffer, "%.4f", value);
  out += buffer;
}

void append_entry(std::string& out, const CacheEntry& e) {
  out += "{\"op\":";
  append_string(out, e.problem.op());
  out += ",\"shape\":{";
  bool first = true;
  for (const ShapeDim& d : e.problem.dims()) {
    if (!first) out += ",";
    first = false;
    append_string(out, d.name);
    out += ':';
    out += std::to_string(d.value);
  }
  out += "},\"dtypes\":{";
  first = true;
  for (const DtypeField& d : e.problem.dtypes()) {
    if (!first) out += ",";
    first = false;
    append_string(out, d.name);
    out += ":";
    append_string(out, d.dtype);
  }
  out += "},\"bucket\":";
  out += std::to_string(e.bucket);
  out += ",\"tactic\":";
  append_string(out, e.tactic);
  out += ",\"median_us\":";
  append_number(out, e.median_us);
  out += ",\"default_us\":";
  append_number(out, e.default_us);
  out += ",\"pass\":";
  append_string(out, e.pass);
  out += ",\"tuned_at\":";
  append_string(out, e.tuned_at);
  out += ",\"ranks\":";
  out += std::to_string(e.ranks);
  out += ",\"candidates\":{";
  first = true;
  for (const CandidateTiming& c : e.candidates) {
    if (!first) out += ",";
    first = false;
    append_string(out, c.tactic);
    out += ":";
    append_number(out, c.median_us);
  }
  out += "}}";
}

// ---- parsing -----------------------------------------------------------------------------

[[noreturn]] void bad_format(const std::string& what) { fail(ErrorCode::kFormat, what); }

const json& member(const json& object, const char* name, const char* where) {
  const auto it = object.find(name);
  if (it == object.end()) bad_format(std::string(where) + ": missing \"" + name + "\"");
  return *it;
}

std::string string_member(const json& object, const char* name, const char* where) {
  const json& value = member(object, name, where);
  if (!value.is_string()) bad_format(std::string(where) + ": \"" + name + "\" is not a string");
  return value.get<std::string>();
}

std::int64_t int_member(const json& object, const char* name, const char* where) {
  const json& value = member(object, name, where);
  if (!value.is_number_integer()) {
    bad_format(std::string(where) + ": \"" + name + "\" is not an integer");
  }
  return value.get<std::int64_t>();
}

double number_member(const json& object, const char* name, const char* where) {
  const json& value = member(object, name, where);
  if (!value.is_number()) bad_format(std::string(where) + ": \"" + name + "\" is not a number");
  return value.get<double>();
}

Fingerprint parse_fingerprint(const json& value) {
  const char* where = "fingerprint";
  if (!value.is_object()) bad_format("\"fingerprint\" is not an object");
  Fingerprint fp;
  fp.backend = string_member(value, "backend", where);
  fp.device = string_member(value, "device", where);
  fp.cpu_threads = static_cast<int>(int_member(value, "cpu_threads", where));
  fp.sm_count = static_cast<int>(int_member(value, "sm_count", where));
  fp.compute_capability = string_member(value, "compute_capability", where);
  fp.driver_version = static_cast<int>(int_member(value, "driver_version", where));
  fp.runtime_version = static_cast<int>(int_member(value, "runtime_version", where));
  fp.mxq_version = string_member(value, "mxq_version", where);
  fp.registry_hash = string_member(value, "registry_hash", where);
  return fp;
}

json fingerprint_json(const Fingerprint& fp) {
  return json{{"backend", fp.backend},
              {"device", fp.device},
              {"cpu_threads", fp.cpu_threads},
              {"sm_count", fp.sm_count},
              {"compute_capability", fp.compute_capability},
              {"driver_version", fp.driver_version},
              {"runtime_version", fp.runtime_version},
              {"mxq_version", fp.mxq_version},
              {"registry_hash", fp.registry_hash}};
}

CacheEntry parse_entry(const json& value) {
  const char* where = "entry";
  if (!value.is_object()) bad_format("entry is not an object");
  const std::string op = string_member(value, "op", where);
  const json& shape = member(value, "shape", where);
  const json& dtypes = member(value, "dtypes", where);
  if (!shape.is_object() || !dtypes.is_object()) bad_format("entry shape/dtypes are not objects");
  std::vector<ShapeDim> dims;
  for (const auto& [name, dim] : shape.items()) {
    if (!dim.is_number_integer()) bad_format("entry shape field " + name + " is not an integer");
    dims.push_back({name, dim.get<std::int64_t>()});
  }
  std::vector<DtypeField> types;
  for (const auto& [name, dtype] : dtypes.items()) {
    if (!dtype.is_string()) bad_format("entry dtype field " + name + " is not a string");
    types.push_back({name, dtype.get<std::string>()});
  }
  CacheEntry e;
  try {
    e.problem = Problem(op, std::move(dims), std::move(types));
  } catch (const Error& error) {
    bad_format(std::string("entry problem: ") + error.what());
  }
  e.bucket = int_member(value, "bucket", where);
  if (e.bucket < 1) bad_format("entry bucket " + std::to_string(e.bucket) + " < 1");
  e.tactic = string_member(value, "tactic", where);
  e.median_us = number_member(value, "median_us", where);
  e.default_us = number_member(value, "default_us", where);
  e.pass = string_member(value, "pass", where);
  e.tuned_at = string_member(value, "tuned_at", where);
  e.ranks = static_cast<int>(int_member(value, "ranks", where));
  const json& candidates = member(value, "candidates", where);
  if (!candidates.is_object()) bad_format("entry candidates is not an object");
  for (const auto& [tactic, us] : candidates.items()) {
    if (!us.is_number()) bad_format("entry candidate " + tactic + " time is not a number");
    e.candidates.push_back({tactic, us.get<double>()});
  }
  return e;
}

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

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  [[nodiscard]] int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void fsync_dir(const std::string& dir) {
  const Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() >= 0) ::fsync(fd.get());
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

namespace {

template <typename Entries, typename Get>
std::string serialize_entries(const Fingerprint& fingerprint, const Entries& entries, Get get) {
  std::string out;
  out.reserve(256 + entries.size() * 300);
  out += "{\n  \"format\": ";
  append_string(out, kCacheFormat);
  out += ",\n  \"schema_version\": ";
  out += std::to_string(kCacheSchemaVersion);
  out += ",\n  \"fingerprint\": ";
  out += fingerprint_json(fingerprint).dump();
  out += ",\n";
  out += "  \"entries\": [";
  bool first = true;
  for (const auto& item : entries) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    append_entry(out, get(item));
  }
  out += entries.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace

std::string serialize_cache(const CacheFile& file) {
  return serialize_entries(file.fingerprint, file.entries,
                           [](const CacheEntry& e) -> const CacheEntry& { return e; });
}

CacheFile parse_cache(std::string_view text) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& error) {
    bad_format(std::string("not valid JSON: ") + error.what());
  }
  if (!root.is_object()) bad_format("top level is not an object");
  const auto format = root.find("format");
  if (format == root.end() || !format->is_string() || format->get<std::string>() != kCacheFormat) {
    bad_format("not an mxq autotune cache (\"format\" is not \"" + std::string(kCacheFormat) + "\")");
  }
  const auto version = root.find("schema_version");
  if (version == root.end() || !version->is_number_integer() ||
      version->get<std::int64_t>() != kCacheSchemaVersion) {
    bad_format("schema_version is " + (version == root.end() ? std::string("missing") : version->dump()) +
               ", this mxq reads " + std::to_string(kCacheSchemaVersion));
  }
  CacheFile file;
  file.fingerprint = parse_fingerprint(member(root, "fingerprint", "file"));
  const json& entries = member(root, "entries", "file");
  if (!entries.is_array()) bad_format("\"entries\" is not an array");
  std::map<std::string, CacheEntry> by_key;
  std::size_t index = 0;
  for (const json& value : entries) {
    try {
      CacheEntry e = parse_entry(value);
      std::string key = e.key();
      if (by_key.count(key) != 0) file.skipped.push_back("entry " + std::to_string(index) + " (" + key + "): duplicate key, the later one is kept");
      by_key.insert_or_assign(std::move(key), std::move(e));
    } catch (const Error& error) {
      file.skipped.push_back("entry " + std::to_string(index) + ": " + error.what());
    }
    ++index;
  }
  file.entries.reserve(by_key.size());
  for (auto& [key, e] : by_key) file.entries.push_back(std::move(e));
  return file;
}

ReadResult read_cache_file(const std::string& path) {
  ReadResult result;
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
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
    result.file = parse_cache(text);
    result.status = ReadStatus::kOk;
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
  fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(ErrorCode::kIo, "cannot open the cache lock ", lock_path, ": ", errno_text());
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const std::string why = errno_text();
    ::close(fd_);
    fd_ = -1;
    fail(ErrorCode::kIo, "cannot lock ", lock_path, ": ", why);
  }
}

CacheLock::~CacheLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

void write_file_atomically(const std::string& path, std::string_view text) {
  const std::string dir = parent_dir(path);
  const std::string base = std::filesystem::path(path).filename().string();
  // Temp files of writers that died mid-save: nobody else writes while we hold the lock.
  if (DIR* d = ::opendir(dir.c_str())) {
    const std::string prefix = base + ".tmp.";
    std::vector<std::string> stale;
    while (const dirent* entry = ::readdir(d)) {
      if (std::string_view(entry->d_name).starts_with(prefix)) stale.emplace_back(entry->d_name);
    }
    ::closedir(d);
    for (const std::string& name : stale) ::unlink((dir + "/" + name).c_str());
  }
  const std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." +
                           std::to_string(temp_counter.fetch_add(1));
  Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail(ErrorCode::kIo, "cannot create ", temp, ": ", errno_text());
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::unlink(temp.c_str());
      fail(ErrorCode::kIo, "cannot write ", temp, ": ", why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0 || ::close(fd.release()) != 0) {
    const std::string why = errno_text();
    ::unlink(temp.c_str());
    fail(ErrorCode::kIo, "cannot flush ", temp, ": ", why);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(temp.c_str());
    fail(ErrorCode::kIo, "cannot rename ", temp, " to ", path, ": ", why);
  }
  fsync_dir(dir);
}

// ---- CacheStore --------------------------------------------------------------------------

CacheStore::CacheStore(std::string path, Fingerprint fingerprint)
    : path_(std::move(path)), fingerprint_(std::move(fingerprint)) {}

namespace {

std::string foreign_warning(const std::string& path, const Fingerprint& mine,
                            const Fingerprint& theirs, const char* consequence) {
  std::string text = "autotune cache " + path + " was tuned with another fingerprint (";
  const auto diffs = mine.differences(theirs);
  for (std::size_t i = 0; i < diffs.size(); ++i) text += (i ? "; " : "") + diffs[i];
  return text + "): " + consequence;
}

void warn(CacheStore::Outcome& outcome, std::string text) {
  log_warn(text);
  outcome.warnings.push_back(std::move(text));
}

}  // namespace

CacheStore::Outcome CacheStore::load(std::vector<CacheEntry>& entries) {
  Outcome outcome;
  entries.clear();
  ReadResult read = read_cache_file(path_);
  if (read.status == ReadStatus::kCorrupt) {
    // Move aside under the lock, after checking that no writer replaced it meanwhile.
    try {
      std::filesystem::create_directories(parent_dir(path_));
      const CacheLock lock(path_);
      read = read_cache_file(path_);
      if (read.status == ReadStatus::kCorrupt) {
        const std::string moved = move_aside(path_);
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
    have_snapshot_ = false;
    snapshot_.clear();
    return outcome;
  }
  if (!(read.file.fingerprint == fingerprint_)) {
    foreign_ = true;
    warn(outcome, foreign_warning(path_, fingerprint_, read.file.fingerprint,
                                  "its entries are not served and the file is left untouched"));
    outcome.ok = false;
    return outcome;
  }
  for (const std::string& line : read.file.skipped) {
    warn(outcome, "autotune cache " + path_ + ": skipped " + line);
  }
  snapshot_.clear();
  for (const CacheEntry& e : read.file.entries) snapshot_.emplace(e.key(), e);
  snapshot_identity_ = read.identity;
  have_snapshot_ = true;
  foreign_ = false;
  entries = std::move(read.file.entries);
  return outcome;
}

bool CacheStore::reload_if_changed(std::vector<CacheEntry>& entries) {
  FileIdentity current;
  if (!stat_identity(path_, current)) return false;
  if (have_snapshot_ && current == snapshot_identity_) return false;
  ReadResult read = read_cache_file(path_);
  if (read.status != ReadStatus::kOk || !(read.file.fingerprint == fingerprint_)) return false;
  snapshot_.clear();
  for (const CacheEntry& e : read.file.entries) snapshot_.emplace(e.key(), e);
  snapshot_identity_ = read.identity;
  have_snapshot_ = true;
  entries = std::move(read.file.entries);
  return true;
}

CacheStore::Outcome CacheStore::save(std::span<const CacheEntry> updates) {
  return rewrite(updates, nullptr);
}

CacheStore::Outcome CacheStore::rewrite(std::span<const CacheEntry> updates,
                                        const std::function<bool(const CacheEntry&)>& drop) {
  Outcome outcome;
  std::filesystem::create_directories(parent_dir(path_));
  const CacheLock lock(path_);
  FileIdentity current;
  const bool exists = stat_identity(path_, current);
  if (!exists) {
    snapshot_.clear();
  } else if (!have_snapshot_ || !(current == snapshot_identity_)) {
    ReadResult read = read_cache_file(path_);
    if (read.status == ReadStatus::kCorrupt) {
      const std::string moved = move_aside(path_);
      warn(outcome, "autotune cache " + path_ + " is unreadable (" + read.problem +
                        "); moved aside to " + moved + " before saving");
      outcome.moved_aside = true;
      snapshot_.clear();
    } else if (read.status == ReadStatus::kMissing) {
      snapshot_.clear();
    } else if (!(read.file.fingerprint == fingerprint_)) {
      foreign_ = true;
      warn(outcome, foreign_warning(path_, fingerprint_, read.file.fingerprint,
                                    "not saving into it; tuned entries stay in memory only"));
      outcome.ok = false;
      return outcome;
    } else {
      snapshot_.clear();
      for (CacheEntry& e : read.file.entries) {
        std::string key = e.key();
        snapshot_.emplace(std::move(key), std::move(e));
      }
    }
  }
  foreign_ = false;
  if (drop) std::erase_if(snapshot_, [&](const auto& item) { return drop(item.second); });
  for (const CacheEntry& e : updates) snapshot_.insert_or_assign(e.key(), e);
  write_file_atomically(path_, serialize_entries(fingerprint_, snapshot_, [](const auto& item) -> const CacheEntry& { return item.second; }));
  have_snapshot_ = stat_identity(path_, snapshot_identity_);
  return outcome;
}

}  // namespace mxq::tune
