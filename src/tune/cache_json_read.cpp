// Reading a cache file: nlohmann/json's SAX parser, and the schema on top of it (what
// include/mxq/tune/cache_file.h promises about files this build cannot read or use).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "mxq/core/error.h"
#include "tune/cache_json.h"
#include "tune/cache_json_values.h"

namespace mxq::tune {
namespace {

using detail::append_json_string;
using detail::append_scalar;
using detail::complete_entry;
using detail::describe;
using detail::EntryState;
using detail::fingerprint_int;
using detail::fingerprint_string;
using detail::known_entry_member;
using detail::Scalar;
using detail::TopLevel;
using Json = nlohmann::json;

constexpr std::size_t kMaxDepth = 64;  // a corrupt file must not make the writer recurse deep

// Reads a cache file from nlohmann/json's SAX events, without building a DOM (10,000 entries
// load in the time budget of docs/PERF.md). Each element of "entries" is also written down as
// JSON text while it is read, so that one that turns out malformed, or an unknown member of
// one, is kept as the value it was (whitespace and escapes normalized).
class CacheSax {
 public:
  explicit CacheSax(detail::ParsedCache& out) : out_(out) {}

  // ---- nlohmann/json's SAX interface ----
  bool null() { return scalar(Scalar{}); }
  bool boolean(bool value) { return scalar({.type = Scalar::Type::kBool, .boolean = value}); }
  bool number_integer(Json::number_integer_t value) {
    return scalar({.type = Scalar::Type::kInteger, .integer = value});
  }
  bool number_unsigned(Json::number_unsigned_t value) {
    return scalar({.type = Scalar::Type::kUnsigned, .unsigned_integer = value});
  }
  bool number_float(Json::number_float_t value, const Json::string_t& lexeme) {
    return scalar({.type = Scalar::Type::kFloat, .number = value, .lexeme = &lexeme});
  }
  bool string(Json::string_t& value) {
    return scalar({.type = Scalar::Type::kString, .string = &value});
  }
  bool binary(Json::binary_t& /*value*/) { return false; }  // not produced from JSON text
  bool start_object(std::size_t /*elements*/) { return start(false); }
  bool start_array(std::size_t /*elements*/) { return start(true); }
  bool end_object() { return end(); }
  bool end_array() { return end(); }
  bool key(Json::string_t& name);
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const Json::exception& error) {
    // "[json.exception.parse_error.101] parse error at line 3, column 7: syntax error ..."
    const std::string_view what = error.what();
    const std::size_t tag_end = what.find("] ");
    error_ = tag_end == std::string_view::npos ? what : what.substr(tag_end + 2);
    return false;
  }

  [[nodiscard]] const std::string& error() const { return error_; }
  // After a parse that succeeded: the entries in key order, and the verdict.
  void finish();

 private:
  enum class Role { kTop, kFingerprint, kEntries, kEntry, kShape, kDtypes, kCandidates, kIgnored };
  struct Frame {
    Role role = Role::kIgnored;
    bool array = false;
    bool first = true;  // no member or element yet
    std::string key;    // an object's member being read
    bool skip = false;  // kFingerprint: a repeated member; kEntry: an unknown one
  };

  bool scalar(const Scalar& s);
  bool start(bool array);
  bool end();
  void begin_value();
  void value_done();
  Role top_member(Frame& frame, const Scalar* s, bool array);
  void fingerprint_member(Frame& frame, const Scalar* s);
  void entry_member(Frame& frame, const Scalar* s);
  Role entry_container(Frame& frame, bool array);
  void map_member(Frame& frame, const Scalar* s);
  void finish_entry();
  void note_fingerprint(const std::string& what) {
    std::string& problem = top_.fingerprint_problem;
    problem += (problem.empty() ? "" : ", ") + what;
  }
  void bad_entry(const std::string& what) {
    if (entry_.problem.empty()) entry_.problem = what;
  }

  detail::ParsedCache& out_;
  std::vector<Frame> stack_;
  std::string error_;
  TopLevel top_;
  Fingerprint fingerprint_;
  std::vector<std::string> fingerprint_seen_;
  bool recording_ = false;        // inside an element of "entries"
  std::string text_;              // that element as JSON text, so far
  std::size_t member_start_ = 0;  // where the entry's current member begins in text_
  EntryState entry_;
  std::size_t entry_index_ = 0;
  std::vector<std::pair<std::string, CacheEntry>> keyed_;
};

// Called at the start of every value: starts the recording of an element of "entries", and
// writes the separator before an array element.
void CacheSax::begin_value() {
  if (stack_.empty()) return;
  Frame& parent = stack_.back();
  if (parent.role == Role::kEntries) {
    recording_ = true;
    text_.clear();
    entry_ = EntryState{};
    return;
  }
  if (recording_ && parent.array) {
    if (!parent.first) text_ += ',';
    parent.first = false;
  }
}

// Called after every complete value, with its parent on top of the stack.
void CacheSax::value_done() {
  if (stack_.empty()) return;
  Frame& parent = stack_.back();
  if (parent.role == Role::kEntries) {
    finish_entry();
  } else if (parent.role == Role::kEntry && parent.skip) {
    // A later schema minor version's member: kept as written, to go back with the entry.
    std::string& unknown = entry_.e.unknown_members;
    if (!unknown.empty()) unknown += ',';
    unknown.append(text_, member_start_);
  }
}

bool CacheSax::key(Json::string_t& name) {
  Frame& frame = stack_.back();
  if (recording_) {
    if (!frame.first) text_ += ',';
    frame.first = false;
    if (frame.role == Role::kEntry) member_start_ = text_.size();
    append_json_string(text_, name);
    text_ += ':';
  }
  frame.skip = false;
  if (frame.role == Role::kFingerprint) {
    if (std::find(fingerprint_seen_.begin(), fingerprint_seen_.end(), name) !=
        fingerprint_seen_.end()) {
      note_fingerprint("field \"" + name + "\" given twice");
      frame.skip = true;
    } else {
      fingerprint_seen_.push_back(name);
    }
  } else if (frame.role == Role::kEntry) {
    frame.skip = !known_entry_member(name);
  }
  frame.key = std::move(name);
  return true;
}

bool CacheSax::scalar(const Scalar& s) {
  begin_value();
  if (recording_) append_scalar(text_, s);
  if (stack_.empty()) {
    top_.is_object = false;
    return true;
  }
  Frame& parent = stack_.back();
  switch (parent.role) {
    case Role::kTop:
      (void)top_member(parent, &s, false);
      break;
    case Role::kFingerprint:
      fingerprint_member(parent, &s);
      break;
    case Role::kEntries:
      bad_entry("entry is not an object");
      break;
    case Role::kEntry:
      entry_member(parent, &s);
      break;
    case Role::kShape:
    case Role::kDtypes:
    case Role::kCandidates:
      map_member(parent, &s);
      break;
    case Role::kIgnored:
      break;
  }
  value_done();
  return true;
}

bool CacheSax::start(bool array) {
  if (stack_.size() >= kMaxDepth) {
    error_ = "nesting deeper than " + std::to_string(kMaxDepth) + " levels";
    return false;
  }
  begin_value();
  if (recording_) text_ += array ? '[' : '{';
  Role role = Role::kIgnored;
  if (stack_.empty()) {
    top_.is_object = !array;
    if (!array) role = Role::kTop;
  } else {
    Frame& parent = stack_.back();
    switch (parent.role) {
      case Role::kTop:
        role = top_member(parent, nullptr, array);
        break;
      case Role::kFingerprint:
        fingerprint_member(parent, nullptr);
        break;
      case Role::kEntries:
        if (array) {
          bad_entry("entry is not an object");
        } else {
          role = Role::kEntry;
        }
        break;
      case Role::kEntry:
        role = entry_container(parent, array);
        break;
      case Role::kShape:
      case Role::kDtypes:
      case Role::kCandidates:
        map_member(parent, nullptr);
        break;
      case Role::kIgnored:
        break;
    }
  }
  stack_.push_back(Frame{role, array, true, {}, false});
  return true;
}

bool CacheSax::end() {
  const Frame frame = std::move(stack_.back());
  stack_.pop_back();
  if (recording_) text_ += frame.array ? ']' : '}';
  if (frame.role == Role::kFingerprint) {
    for (const auto& [name, value] : fingerprint_.fields()) {
      if (std::find(fingerprint_seen_.begin(), fingerprint_seen_.end(), name) ==
          fingerprint_seen_.end()) {
        note_fingerprint("missing field \"" + name + "\"");
      }
    }
  }
  value_done();
  return true;
}

// A member of the top-level object (s: its value, or null for an object or array); returns the
// role of a container value.
CacheSax::Role CacheSax::top_member(Frame& frame, const Scalar* s, bool array) {
  const std::string& key = frame.key;
  if (key == "format") {
    if (s != nullptr && s->type == Scalar::Type::kString) top_.format = *s->string;
  } else if (key == "schema_version") {
    top_.have_version = true;
    top_.version.reset();
    if (s == nullptr) {
      top_.version_found = array ? "an array" : "an object";
    } else if (const auto version = s->as_int64()) {
      top_.version = *version;
    } else {
      top_.version_found = describe(*s);
    }
  } else if (key == "fingerprint") {
    top_.have_fingerprint = true;
    fingerprint_ = Fingerprint{};
    fingerprint_seen_.clear();
    if (s != nullptr || array) {
      note_fingerprint("\"fingerprint\" is not an object");
    } else {
      return Role::kFingerprint;
    }
  } else if (key == "entries") {
    if (s != nullptr || !array) {
      top_.entries_problem = "\"entries\" is not an array";
    } else {
      top_.entries_problem.clear();
      return Role::kEntries;
    }
  }
  return Role::kIgnored;
}

// A fingerprint field this build cannot read exactly (one it does not know, a repeat, one of
// another type) comes from another mxq build: noted, for the verdict.
void CacheSax::fingerprint_member(Frame& frame, const Scalar* s) {
  if (frame.skip) return;  // a repeat, noted
  const std::string& key = frame.key;
  if (std::string* field = fingerprint_string(fingerprint_, key)) {
    if (s != nullptr && s->type == Scalar::Type::kString) {
      *field = std::move(*s->string);
    } else {
      note_fingerprint("field \"" + key + "\" is not a string");
    }
  } else if (int* number = fingerprint_int(fingerprint_, key)) {
    const std::optional<std::int64_t> value = s != nullptr ? s->as_int64() : std::nullopt;
    if (value && *value >= INT_MIN && *value <= INT_MAX) {
      *number = static_cast<int>(*value);
    } else {
      note_fingerprint("field \"" + key + "\" is not an int");
    }
  } else {
    note_fingerprint("unknown field \"" + key + "\"");
  }
}

// A member of an entry with a scalar value (s), or with a container where a scalar belongs
// (s null).
void CacheSax::entry_member(Frame& frame, const Scalar* s) {
  if (frame.skip) return;  // unknown: recorded only
  const std::string& key = frame.key;
  const auto string_field = [&](std::string& out) {
    if (s != nullptr && s->type == Scalar::Type::kString) {
      out = std::move(*s->string);
    } else {
      bad_entry("\"" + key + "\" is not a string");
    }
  };
  const auto number_field = [&](double& out) {
    if (s != nullptr && s->is_number()) {
      out = s->as_double();
    } else {
      bad_entry("\"" + key + "\" is not a number");
    }
  };
  const auto integer_field = [&](std::int64_t& out) {
    const std::optional<std::int64_t> value = s != nullptr ? s->as_int64() : std::nullopt;
    if (value) {
      out = *value;
    } else {
      bad_entry("\"" + key + "\" is not an integer");
    }
    return value.has_value();
  };
  if (key == "op") {
    entry_.have_op = true;
    string_field(entry_.op);
  } else if (key == "tactic") {
    entry_.have_tactic = true;
    string_field(entry_.e.tactic);
  } else if (key == "pass") {
    string_field(entry_.e.pass);
  } else if (key == "tuned_at") {
    string_field(entry_.e.tuned_at);
  } else if (key == "median_us") {
    number_field(entry_.e.median_us);
  } else if (key == "default_us") {
    number_field(entry_.e.default_us);
  } else if (key == "bucket") {
    entry_.have_bucket = true;
    (void)integer_field(entry_.e.bucket);
  } else if (key == "ranks") {
    std::int64_t ranks = 1;
    if (integer_field(ranks)) entry_.e.ranks = static_cast<int>(ranks);
  } else {  // shape, dtypes, candidates
    bad_entry("\"" + key + "\" is not an object");
  }
}

CacheSax::Role CacheSax::entry_container(Frame& frame, bool array) {
  if (frame.skip) return Role::kIgnored;  // unknown: recorded only
  const std::string& key = frame.key;
  if (key != "shape" && key != "dtypes" && key != "candidates") {
    entry_member(frame, nullptr);  // a container where a scalar belongs
    return Role::kIgnored;
  }
  if (array) {
    bad_entry("\"" + key + "\" is not an object");
    return Role::kIgnored;
  }
  if (key == "shape") {
    entry_.have_shape = true;
    return Role::kShape;
  }
  if (key == "dtypes") {
    entry_.have_dtypes = true;
    return Role::kDtypes;
  }
  return Role::kCandidates;
}

// A member of an entry's "shape", "dtypes" or "candidates" (s null: a container).
void CacheSax::map_member(Frame& frame, const Scalar* s) {
  const std::string& name = frame.key;
  if (frame.role == Role::kShape) {
    const std::optional<std::int64_t> value = s != nullptr ? s->as_int64() : std::nullopt;
    if (value) {
      entry_.dims.push_back({name, *value});
    } else {
      bad_entry("shape field " + name + " is not an integer");
    }
  } else if (frame.role == Role::kDtypes) {
    if (s != nullptr && s->type == Scalar::Type::kString) {
      entry_.dtypes.push_back({name, std::move(*s->string)});
    } else {
      bad_entry("\"dtype " + name + "\" is not a string");
    }
  } else if (s != nullptr && s->is_number()) {
    entry_.e.candidates.push_back({name, s->as_double()});
  } else {
    bad_entry("\"candidate " + name + "\" is not a number");
  }
}

// An element of "entries" ended: into the entries, or skipped and kept as text.
void CacheSax::finish_entry() {
  recording_ = false;
  const std::size_t index = entry_index_++;
  std::string problem = std::move(entry_.problem);
  if (problem.empty()) problem = complete_entry(entry_);
  if (problem.empty()) {
    std::string key = entry_.e.key();
    keyed_.emplace_back(std::move(key), std::move(entry_.e));
  } else {
    out_.file.skipped.push_back("entry " + std::to_string(index) + ": " + problem);
    out_.file.malformed.push_back(text_);
  }
}

// The entries sorted by key, a duplicate key keeping the later entry; then why the file cannot
// be used ("" when it can), and whether it is another build's rather than broken: an mxq cache
// of a newer schema, or whose fingerprint this build cannot read, comes from another build (two
// builds may share a cache folder); anything else that does not read is broken, an older schema
// included (none was released before version 1).
void CacheSax::finish() {
  const auto by_key = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (!std::is_sorted(keyed_.begin(), keyed_.end(), by_key)) {  // written files are sorted
    std::stable_sort(keyed_.begin(), keyed_.end(), by_key);
  }
  std::vector<CacheEntry>& entries = out_.file.entries;
  entries.reserve(keyed_.size());
  for (std::size_t i = 0; i < keyed_.size(); ++i) {
    if (i + 1 < keyed_.size() && keyed_[i].first == keyed_[i + 1].first) {
      out_.file.skipped.push_back("entry " + keyed_[i].first +
                                  ": duplicate key, the later one is kept");
      continue;
    }
    entries.push_back(std::move(keyed_[i].second));
  }
  out_.file.fingerprint = std::move(fingerprint_);

  const auto verdict = [&](std::string problem, bool other_build) {
    out_.problem = std::move(problem);
    out_.other_build = other_build;
  };
  const bool newer = top_.version && *top_.version > kCacheSchemaVersion;
  if (!top_.is_object) {
    verdict("top level is not an object", false);
  } else if (top_.format != kCacheFormat) {
    verdict("not an mxq autotune cache (\"format\" is not \"" + std::string(kCacheFormat) + "\")",
            false);
  } else if (!top_.version || *top_.version != kCacheSchemaVersion) {
    const std::string found = top_.version        ? std::to_string(*top_.version)
                              : top_.have_version ? top_.version_found
                                                  : std::string("missing");
    verdict("schema_version is " + found +
                (newer ? ", newer than this mxq's " : ", this mxq reads ") +
                std::to_string(kCacheSchemaVersion),
            newer);
  } else if (!top_.have_fingerprint) {
    verdict("missing \"fingerprint\"", false);
  } else if (!top_.fingerprint_problem.empty()) {
    verdict("fingerprint: " + top_.fingerprint_problem, true);
  } else if (!top_.entries_problem.empty()) {
    verdict(top_.entries_problem, false);
  }
}

}  // namespace

namespace detail {

ParsedCache parse_cache_text(std::string_view text) {
  // nlohmann/json ends the input at a NUL byte, which would hide what follows; a raw NUL is never
  // valid JSON (control characters in strings are escaped).
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    fail(ErrorCode::kFormat, "not valid JSON: a NUL byte at byte ", nul);
  }
  ParsedCache parsed;
  CacheSax sax(parsed);
  if (!Json::sax_parse(text.begin(), text.end(), &sax)) {
    fail(ErrorCode::kFormat, "not valid JSON: ", sax.error());
  }
  sax.finish();
  return parsed;
}

}  // namespace detail

CacheFile parse_cache(std::string_view text) {
  detail::ParsedCache parsed = detail::parse_cache_text(text);
  if (!parsed.problem.empty()) fail(ErrorCode::kFormat, parsed.problem);
  return std::move(parsed.file);
}

}  // namespace mxq::tune
