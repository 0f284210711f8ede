#include "mxq/tune/cache_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>

#include "mxq/core/error.h"
#include "mxq/core/log.h"
#include "tune/json_reader.h"

namespace mxq::tune {
namespace {

std::string errno_text() { return std::strerror(errno); }

// ---- serialization -----------------------------------------------------------------------

void append_string(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      out += "\\u00";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xF]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

void append_int(std::string& out, std::int64_t value) {
  char buffer[24];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, result.ptr);
}

void append_number(std::string& out, double value) {
  char buffer[64];
  if (!std::isfinite(value)) value = 0;
  const auto result =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed, 4);
  out.append(buffer, result.ptr);
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
    append_int(out, d.value);
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
  append_int(out, e.bucket);
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
  append_int(out, e.ranks);
  out += ",\"candidates\":{";
  first = true;
  for (const CandidateTiming& c : e.candidates) {
    if (!first) out += ",";
    first = false;
    append_string(out, c.tactic);
    out += ":";
    append_number(out, c.median_us);
  }
  out += "}";
  if (!e.unknown_members.empty()) {
    out += ',';
    out += e.unknown_members;
  }
  out += "}";
}

void append_fingerprint(std::string& out, const Fingerprint& fp) {
  out += "{";
  bool first = true;
  for (const auto& [name, value] : fp.fields()) {
    if (!first) out += ", ";
    first = false;
    append_string(out, name);
    out += ": ";
    if (Fingerprint::numeric_field(name)) {
      out += value;
    } else {
      append_string(out, value);
    }
  }
  out += "}";
}

// ---- parsing -----------------------------------------------------------------------------

using detail::JsonReader;
using Kind = JsonReader::Kind;

[[noreturn]] void bad_format(const std::string& what) { fail(ErrorCode::kFormat, what); }

std::string_view trim_whitespace(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n";
  const std::size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

// The next value's JSON text as written (the reader is left after it).
std::string_view raw_value(JsonReader& r, std::string_view text) {
  const std::size_t start = r.offset();
  r.skip_value();
  return trim_whitespace(text.substr(start, r.offset() - start));
}

// Reads fingerprint field `key` into `fp` and returns "", or says why it cannot: a field this
// build does not know, or of another type. Either way the reader is left after the value.
std::string read_fingerprint_field(JsonReader& r, const std::string& key, Fingerprint& fp) {
  const std::pair<std::string_view, std::string*> strings[] = {
      {"backend", &fp.backend},
      {"device", &fp.device},
      {"compute_capability", &fp.compute_capability},
      {"mxq_version", &fp.mxq_version},
      {"registry_hash", &fp.registry_hash}};
  const std::pair<std::string_view, int*> ints[] = {{"cpu_threads", &fp.cpu_threads},
                                                    {"sm_count", &fp.sm_count},
                                                    {"driver_version", &fp.driver_version},
                                                    {"runtime_version", &fp.runtime_version}};
  for (const auto& [name, field] : strings) {
    if (name != key) continue;
    if (r.peek() != Kind::kString) {
      r.skip_value();
      return "field \"" + key + "\" is not a string";
    }
    *field = r.read_string();
    return {};
  }
  for (const auto& [name, field] : ints) {
    if (name != key) continue;
    std::int64_t value = 0;
    const bool number = r.peek() == Kind::kNumber;
    if (!number) r.skip_value();
    if (!number || !r.try_read_int(value) || value < std::numeric_limits<int>::min() ||
        value > std::numeric_limits<int>::max()) {
      return "field \"" + key + "\" is not an int";
    }
    *field = static_cast<int>(value);
    return {};
  }
  r.skip_value();
  return "unknown field \"" + key + "\"";
}

// Reads the fingerprint. One this build cannot read exactly (a field it does not know, lacks,
// has twice or reads as another type) comes from another mxq build: that goes to `problem`,
// rather than throwing, and the reader is left after the value all the same.
Fingerprint read_fingerprint(JsonReader& r, std::string& problem) {
  auto note = [&](const std::string& what) { problem += (problem.empty() ? "" : ", ") + what; };
  Fingerprint fp;
  if (r.peek() != Kind::kObject) {
    note("\"fingerprint\" is not an object");
    r.skip_value();
    return fp;
  }
  std::vector<std::string> seen;
  std::string key;
  r.begin_object();
  while (r.next_member(key)) {
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      note("field \"" + key + "\" given twice");
      r.skip_value();
      continue;
    }
    seen.push_back(key);
    if (std::string why = read_fingerprint_field(r, key, fp); !why.empty()) note(why);
  }
  for (const auto& [name, value] : fp.fields()) {
    if (std::find(seen.begin(), seen.end(), name) == seen.end()) {
      note("missing field \"" + name + "\"");
    }
  }
  return fp;
}

// One entry. A well-formed JSON value that is not a valid entry gives `problem` (the reader is
// left after the value, so the file's other entries still load); bad JSON throws.
std::optional<CacheEntry> read_entry(JsonReader& r, std::string_view text, std::string& problem) {
  if (r.peek() != Kind::kObject) {
    problem = "entry is not an object";
    r.skip_value();
    return std::nullopt;
  }
  auto bad = [&](const std::string& what) {
    if (problem.empty()) problem = what;
    r.skip_value();
  };
  auto string_field = [&](const std::string& key, std::string& out) {
    if (r.peek() == Kind::kString) {
      out = r.read_string();
    } else {
      bad("\"" + key + "\" is not a string");
    }
  };
  auto number_field = [&](const std::string& key, double& out) {
    if (r.peek() == Kind::kNumber) {
      out = r.read_number();
    } else {
      bad("\"" + key + "\" is not a number");
    }
  };
  CacheEntry e;
  std::string op;
  std::vector<ShapeDim> dims;
  std::vector<DtypeField> dtypes;
  bool have_op = false, have_shape = false, have_dtypes = false, have_bucket = false,
       have_tactic = false;
  std::string key;
  std::string name;
  r.begin_object();
  while (r.next_member(key)) {
    if (key == "op") {
      have_op = true;
      string_field(key, op);
    } else if (key == "shape" || key == "dtypes" || key == "candidates") {
      if (r.peek() != Kind::kObject) {
        bad("\"" + key + "\" is not an object");
        continue;
      }
      if (key == "shape") have_shape = true;
      if (key == "dtypes") have_dtypes = true;
      r.begin_object();
      while (r.next_member(name)) {
        if (key == "shape") {
          std::int64_t v = 0;
          if (r.peek() != Kind::kNumber) {
            bad("shape field " + name + " is not an integer");
          } else if (r.try_read_int(v)) {
            dims.push_back({name, v});
          } else if (problem.empty()) {
            problem = "shape field " + name + " is not an integer";
          }
        } else if (key == "dtypes") {
          std::string dtype;
          string_field("dtype " + name, dtype);
          dtypes.push_back({name, dtype});
        } else {
          double us = 0;
          number_field("candidate " + name, us);
          e.candidates.push_back({name, us});
        }
      }
    } else if (key == "bucket") {
      have_bucket = true;
      if (r.peek() != Kind::kNumber) {
        bad("\"bucket\" is not an integer");
      } else if (!r.try_read_int(e.bucket) && problem.empty()) {
        problem = "\"bucket\" is not an integer";
      }
    } else if (key == "tactic") {
      have_tactic = true;
      string_field(key, e.tactic);
    } else if (key == "median_us") {
      number_field(key, e.median_us);
    } else if (key == "default_us") {
      number_field(key, e.default_us);
    } else if (key == "pass") {
      string_field(key, e.pass);
    } else if (key == "tuned_at") {
      string_field(key, e.tuned_at);
    } else if (key == "ranks") {
      std::int64_t ranks = 1;
      if (r.peek() != Kind::kNumber) {
        bad("\"ranks\" is not an integer");
      } else if (r.try_read_int(ranks)) {
        e.ranks = static_cast<int>(ranks);
      } else if (problem.empty()) {
        problem = "\"ranks\" is not an integer";
      }
    } else {
      // A later schema minor version's member: kept as written, to go back with the entry.
      std::string& unknown = e.unknown_members;
      if (!unknown.empty()) unknown += ',';
      append_string(unknown, key);
      unknown += ':';
      unknown += raw_value(r, text);
    }
  }
  if (!problem.empty()) return std::nullopt;
  for (const auto& [present, field] : {std::pair{have_op, "op"},
                                       {have_shape, "shape"},
                                       {have_dtypes, "dtypes"},
                                       {have_bucket, "bucket"},
                                       {have_tactic, "tactic"}}) {
    if (!present) {
      problem = std::string("missing \"") + field + "\"";
      return std::nullopt;
    }
  }
  if (e.bucket < 1) {
    problem = "bucket " + std::to_string(e.bucket) + " < 1";
    return std::nullopt;
  }
  try {
    e.problem = Problem(op, std::move(dims), std::move(dtypes));
  } catch (const Error& error) {
    problem = std::string("problem: ") + error.what();
    return std::nullopt;
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

// Entries in key order, then the malformed ones as they were read (they have no usable key).
template <typename Entries, typename Get>
std::string serialize_entries(const Fingerprint& fingerprint, const Entries& entries, Get get,
                              std::span<const std::string> malformed) {
  std::string out;
  out.reserve(256 + (entries.size() + malformed.size()) * 300);
  out += "{\n  \"format\": ";
  append_string(out, kCacheFormat);
  out += ",\n  \"schema_version\": ";
  append_int(out, kCacheSchemaVersion);
  out += ",\n  \"fingerprint\": ";
  append_fingerprint(out, fingerprint);
  out += ",\n";
  out += "  \"entries\": [";
  bool first = true;
  for (const auto& item : entries) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    append_entry(out, get(item));
  }
  for (const std::string& text : malformed) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    out += text;
  }
  out += first ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace

std::string serialize_cache(const CacheFile& file) {
  return serialize_entries(
      file.fingerprint, file.entries, [](const CacheEntry& e) -> const CacheEntry& { return e; },
      file.malformed);
}

namespace {

// A parse that got through the JSON: `problem` is empty when the file is usable, else says why
// not, and `other_build` whether it is an mxq cache of another build rather than a broken file.
struct Parsed {
  CacheFile file;
  std::string problem;
  bool other_build = false;
};

// The members of "entries" that read, sorted by key, a duplicate key keeping the later entry;
// the others go to file.skipped and, as written, to file.malformed.
void read_entries(JsonReader& r, std::string_view text, CacheFile& file) {
  std::vector<std::pair<std::string, CacheEntry>> keyed;  // written files are sorted already
  r.begin_array();
  for (std::size_t index = 0; r.next_element(); ++index) {
    const std::size_t start = r.offset();
    std::string problem;
    std::optional<CacheEntry> e = read_entry(r, text, problem);
    if (!e) {
      file.skipped.push_back("entry " + std::to_string(index) + ": " + problem);
      file.malformed.emplace_back(trim_whitespace(text.substr(start, r.offset() - start)));
      continue;
    }
    keyed.emplace_back(e->key(), std::move(*e));
  }
  const auto by_key = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (!std::is_sorted(keyed.begin(), keyed.end(), by_key)) {
    std::stable_sort(keyed.begin(), keyed.end(), by_key);
  }
  file.entries.reserve(keyed.size());
  for (std::size_t i = 0; i < keyed.size(); ++i) {
    if (i + 1 < keyed.size() && keyed[i].first == keyed[i + 1].first) {
      file.skipped.push_back("entry " + keyed[i].first + ": duplicate key, the later one is kept");
      continue;
    }
    file.entries.push_back(std::move(keyed[i].second));
  }
}

// What the top level of a cache file held, besides the entries.
struct TopLevel {
  std::string format;
  std::optional<std::int64_t> version;
  bool have_fingerprint = false;
  std::string fingerprint_problem;
  std::string entries_problem = "missing \"entries\"";
};

// Why the file cannot be used ("" when it can), and whether it is another build's rather than
// broken: an mxq cache of a newer schema, or whose fingerprint this build cannot read, comes
// from another build (two builds may share a cache folder); anything else that does not read
// is broken, an older schema included (none was released before version 1).
void judge(const TopLevel& top, Parsed& parsed) {
  const auto verdict = [&](std::string problem, bool other_build) {
    parsed.problem = std::move(problem);
    parsed.other_build = other_build;
  };
  const bool newer = top.version && *top.version > kCacheSchemaVersion;
  if (top.format != kCacheFormat) {
    verdict("not an mxq autotune cache (\"format\" is not \"" + std::string(kCacheFormat) + "\")",
            false);
  } else if (!top.version || *top.version != kCacheSchemaVersion) {
    verdict("schema_version is " +
                (top.version ? std::to_string(*top.version) : std::string("missing")) +
                (newer ? ", newer than this mxq's " : ", this mxq reads ") +
                std::to_string(kCacheSchemaVersion),
            newer);
  } else if (!top.have_fingerprint) {
    verdict("missing \"fingerprint\"", false);
  } else if (!top.fingerprint_problem.empty()) {
    verdict("fingerprint: " + top.fingerprint_problem, true);
  } else if (!top.entries_problem.empty()) {
    verdict(top.entries_problem, false);
  }
}

// Throws Error(kFormat) only for text that is not JSON (or nests too deep).
Parsed parse_text(std::string_view text) {
  JsonReader r(text);
  Parsed parsed;
  if (r.peek() != Kind::kObject) {
    parsed.problem = "top level is not an object";
    return parsed;
  }
  TopLevel top;
  std::string key;
  r.begin_object();
  while (r.next_member(key)) {
    if (key == "format" && r.peek() == Kind::kString) {
      top.format = r.read_string();
    } else if (key == "schema_version") {
      std::int64_t v = -1;
      if (r.peek() != Kind::kNumber) {
        r.skip_value();
      } else if (!r.try_read_int(v)) {
        v = -1;
      }
      top.version = v;
    } else if (key == "fingerprint") {
      parsed.file.fingerprint = read_fingerprint(r, top.fingerprint_problem);
      top.have_fingerprint = true;
    } else if (key == "entries" && r.peek() == Kind::kArray) {
      top.entries_problem.clear();
      read_entries(r, text, parsed.file);
    } else {
      if (key == "entries") top.entries_problem = "\"entries\" is not an array";
      r.skip_value();
    }
  }
  r.expect_end();
  judge(top, parsed);
  return parsed;
}

}  // namespace

CacheFile parse_cache(std::string_view text) {
  Parsed parsed = parse_text(text);
  if (!parsed.problem.empty()) bad_format(parsed.problem);
  return std::move(parsed.file);
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
    Parsed parsed = parse_text(text);
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
  const std::string temp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_counter.fetch_add(1));
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
  if (drop) std::erase_if(snapshot_, [&](const auto& item) { return drop(item.second); });
  for (const CacheEntry& e : updates) snapshot_.insert_or_assign(e.key(), e);
  for (const std::string& text : malformed) {
    if (std::find(snapshot_malformed_.begin(), snapshot_malformed_.end(), text) ==
        snapshot_malformed_.end()) {
      snapshot_malformed_.push_back(text);
    }
  }
  write_file_atomically(
      target_,
      serialize_entries(
          fingerprint_, snapshot_,
          [](const auto& item) -> const CacheEntry& { return item.second; }, snapshot_malformed_));
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
    const Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
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
