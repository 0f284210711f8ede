#include "mxq/dist/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <thread>

#include "io/file_util.h"
#include "mxq/core/env.h"
#include "mxq/core/error.h"

namespace mxq::dist {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;

std::optional<std::string> variable(const std::string& name) {
  if (name.starts_with("MXQ_")) (void)env_spec(name);  // mxq's own must be registered
  return env_raw(name);
}

int parse_int(const std::string& name, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || end == value.c_str() || *end != '\0' || parsed < INT32_MIN ||
      parsed > INT32_MAX) {
    fail(ErrorCode::kInvalidArgument, "environment variable ", name,
         ": expected an integer, found '", value, "'");
  }
  return static_cast<int>(parsed);
}

struct LauncherVariables {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
};

// In precedence order: mxq's own variables override what a launcher set.
constexpr LauncherVariables kLaunchers[] = {
    {"mxq", "MXQ_RANK", "MXQ_WORLD_SIZE", "MXQ_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
};

// `prefix` + the names say where the values came from ("environment variable RANK", "rank").
void check_ranks(const RankInfo& info, const std::string& prefix, const std::string& rank_name,
                 const std::string& size_name, const std::string& local_name) {
  if (info.size < 1)
    fail_argument(ErrorCode::kInvalidArgument, prefix + size_name, ">= 1", info.size);
  const std::string range = "0.." + std::to_string(info.size - 1) + " (" + size_name + "=" +
                            std::to_string(info.size) + ")";
  if (info.rank < 0 || info.rank >= info.size)
    fail_argument(ErrorCode::kInvalidArgument, prefix + rank_name, range, info.rank);
  if (info.local_rank < 0 || info.local_rank >= info.size)
    fail_argument(ErrorCode::kInvalidArgument, prefix + local_name, range, info.local_rank);
}

bool valid_run_id(const std::string& id) {
  return !id.empty() && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

std::string sanitize_run_id(std::string id) {
  for (char& c : id) {
    if (!valid_run_id(std::string(1, c))) c = '_';
  }
  return id;
}

// The start time of process `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), so a
// recycled pid gives another id; empty when /proc cannot tell.
std::string process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t name_end = stat.rfind(')');  // the command name may hold spaces
  if (name_end == std::string::npos) return {};
  std::istringstream fields(stat.substr(name_end + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return field;
  }
  return {};
}

// ---- files -------------------------------------------------------------------------------

constexpr char kMagic[8] = {'m', 'x', 'q', '-', 'r', 'd', 'v', '1'};
constexpr std::size_t kHeader = sizeof kMagic + 4 * sizeof(std::uint64_t);

// The id file: magic, nonce, rank 0's group size, abandoned flag, blob length, blob (host byte
// order: every reader is on the same node).
struct Published {
  std::uint64_t nonce = 0;
  std::uint64_t size = 0;
  std::uint64_t abandoned = 0;  // rank 0 gave up waiting: whoever read this nonce fails too
  Bytes blob;
};

Bytes encode(const Published& p) {
  Bytes out(kHeader + p.blob.size());
  const std::uint64_t fields[4] = {p.nonce, p.size, p.abandoned, p.blob.size()};
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  std::memcpy(out.data() + sizeof kMagic, fields, sizeof fields);
  if (!p.blob.empty()) std::memcpy(out.data() + kHeader, p.blob.data(), p.blob.size());
  return out;
}

std::optional<Published> decode(const Bytes& bytes) {
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return std::nullopt;
  std::uint64_t fields[4] = {};
  std::memcpy(fields, bytes.data() + sizeof kMagic, sizeof fields);
  if (fields[3] != bytes.size() - kHeader) return std::nullopt;
  Published p{fields[0], fields[1], fields[2], Bytes(bytes.begin() + kHeader, bytes.end())};
  return p;
}

std::optional<Bytes> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Readers see the old file, no file, or the whole new one (the library's one atomic writer).
void write_atomically(const std::string& path, const Bytes& bytes) {
  const std::span<const std::byte> piece = std::as_bytes(std::span(bytes));
  io::detail::write_file_atomically(path, std::span(&piece, 1), "rendezvous file");
}

void remove_quietly(const std::string& path) {
  std::error_code ignored;
  fs::remove(path, ignored);
}

Bytes nonce_bytes(std::uint64_t nonce) {
  Bytes out(sizeof nonce);
  std::memcpy(out.data(), &nonce, sizeof nonce);
  return out;
}

std::uint64_t acknowledged_nonce(const std::string& path) {
  const std::optional<Bytes> bytes = read_file(path);
  std::uint64_t nonce = 0;
  if (bytes && bytes->size() == sizeof nonce) std::memcpy(&nonce, bytes->data(), sizeof nonce);
  return nonce;
}

std::uint64_t random_nonce() {
  std::random_device device;
  std::uint64_t nonce = 0;
  while (nonce == 0) {  // 0 means "no acknowledgement"
    nonce = (static_cast<std::uint64_t>(device()) << 32) ^ device() ^
            static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^
            (static_cast<std::uint64_t>(::getpid()) << 16);
  }
  return nonce;
}

// Polls with a growing pause: quick when the peer is already there, cheap when it is slow.
class Backoff {
 public:
  void wait() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(50000));
  }

 private:
  std::chrono::microseconds pause_{500};
};

std::string seconds_text(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return out.str();
}

}  // namespace

RankInfo rank_info_from_env() {
  for (const LauncherVariables& names : kLaunchers) {
    const std::optional<std::string> rank = variable(names.rank);
    const std::optional<std::string> size = variable(names.size);
    if (!rank && !size) continue;
    if (!rank || !size) {
      const char* missing = rank ? names.size : names.rank;
      const char* present = rank ? names.rank : names.size;
      fail(ErrorCode::kInvalidArgument, "environment variable ", missing, ": expected an integer (",
           present, " is set, ", names.launcher, " launch), found it unset");
    }
    RankInfo info;
    info.launcher = names.launcher;
    info.rank = parse_int(names.rank, *rank);
    info.size = parse_int(names.size, *size);
    const std::optional<std::string> local = variable(names.local_rank);
    info.local_rank = local ? parse_int(names.local_rank, *local) : info.rank;
    check_ranks(info, "environment variable ", names.rank, names.size, names.local_rank);
    return info;
  }
  return RankInfo{};
}

RendezvousOptions RendezvousOptions::from_env() {
  RendezvousOptions options;
  if (auto dir = env_raw("MXQ_RENDEZVOUS_DIR")) {
    options.dir = *dir;
  } else {
    options.dir =
        (fs::temp_directory_path() / ("mxq-rendezvous-" + std::to_string(::getuid()))).string();
  }
  options.run_id = env_raw("MXQ_RUN_ID").value_or(default_run_id());
  const std::int64_t seconds = env_int("MXQ_RENDEZVOUS_TIMEOUT");
  if (seconds <= 0) {
    fail_argument(ErrorCode::kInvalidArgument, "environment variable MXQ_RENDEZVOUS_TIMEOUT",
                  "seconds > 0", seconds);
  }
  options.timeout = std::chrono::seconds(seconds);
  return options;
}

std::string default_run_id() {
  if (auto id = env_raw("TORCHELASTIC_RUN_ID"); id && *id != "none") {
    return sanitize_run_id("torchrun-" + *id + "-r" +
                           env_raw("TORCHELASTIC_RESTART_COUNT").value_or("0"));
  }
  if (auto ns = env_raw("PMIX_NAMESPACE")) return sanitize_run_id("pmix-" + *ns);
  const pid_t parent = ::getppid();
  const std::string start = process_start_time(parent);
  return "parent-" + std::to_string(parent) + (start.empty() ? "" : "-" + start);
}

Rendezvous::Rendezvous(RendezvousOptions options, RankInfo ranks)
    : options_(std::move(options)), ranks_(std::move(ranks)) {
  check_ranks(ranks_, "", "rank", "size", "local_rank");
  if (options_.dir.empty())
    fail_argument(ErrorCode::kInvalidArgument, "rendezvous dir", "a folder", "''");
  if (!valid_run_id(options_.run_id)) {
    fail_argument(ErrorCode::kInvalidArgument, "rendezvous run id (MXQ_RUN_ID)",
                  "letters, digits, '_' or '-'", "'" + options_.run_id + "'");
  }
  if (options_.timeout.count() <= 0) {
    fail_argument(ErrorCode::kInvalidArgument, "rendezvous timeout", "> 0 ms",
                  options_.timeout.count());
  }
}

Rendezvous Rendezvous::from_env() {
  return Rendezvous(RendezvousOptions::from_env(), rank_info_from_env());
}

std::string Rendezvous::file_stem() const {
  std::string stem = (fs::path(options_.dir) / options_.run_id).string();
  if (shares_ > 0) stem += "." + std::to_string(shares_);
  return stem;
}

std::string Rendezvous::id_path() const { return file_stem() + ".id"; }

std::vector<std::uint8_t> Rendezvous::share_from_rank0(std::span<const std::uint8_t> blob) {
  Bytes result = ranks_.rank == 0 ? publish(blob) : fetch();
  ++shares_;
  return result;
}

Bytes Rendezvous::publish(std::span<const std::uint8_t> blob) {
  Published mine{random_nonce(), static_cast<std::uint64_t>(ranks_.size), 0,
                 Bytes(blob.begin(), blob.end())};
  if (ranks_.size == 1) return mine.blob;
  std::error_code error;
  fs::create_directories(options_.dir, error);
  if (error) {
    fail(ErrorCode::kIo, "rendezvous: cannot create the folder ", options_.dir, ": ",
         error.message());
  }
  const std::string path = id_path();
  auto ack_path = [&](int r) { return file_stem() + ".ack." + std::to_string(r); };
  auto remove_acks = [&] {
    for (int r = 1; r < ranks_.size; ++r) remove_quietly(ack_path(r));
  };
  write_atomically(path, encode(mine));
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  Backoff backoff;
  for (;;) {
    std::vector<int> missing;
    for (int r = 1; r < ranks_.size; ++r) {
      if (acknowledged_nonce(ack_path(r)) != mine.nonce) missing.push_back(r);
    }
    if (missing.empty()) break;
    if (Clock::now() > deadline) {
      // The ranks that did read this nonce must not go on alone: the marker makes them fail. A
      // later launch with the same run id replaces it.
      mine.abandoned = 1;
      write_atomically(path, encode(mine));
      remove_acks();
      std::string list;
      for (const int r : missing) list += (list.empty() ? "" : ",") + std::to_string(r);
      fail(ErrorCode::kIo, "rendezvous ", path, ": rank", missing.size() > 1 ? "s " : " ", list,
           " of ", ranks_.size, " did not read rank 0's id within ", seconds_text(options_.timeout),
           " (are they running, with the same rendezvous dir and ", "run id '", options_.run_id,
           "' and group size ", ranks_.size, "?)");
    }
    backoff.wait();
  }
  // Every rank holds the blob: removing the id file is the signal that lets them return.
  remove_quietly(path);
  remove_acks();
  return mine.blob;
}

Bytes Rendezvous::fetch() {
  const std::string path = id_path();
  const std::string ack = file_stem() + ".ack." + std::to_string(ranks_.rank);
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  std::optional<Published> acknowledged;
  std::string seen;  // what the file held that this rank could not take, for the timeout message
  Backoff backoff;
  for (;;) {
    const std::optional<Bytes> bytes = read_file(path);
    if (bytes) {
      std::optional<Published> found = decode(*bytes);
      if (!found) {
        seen = " (the file there is not a complete rendezvous file)";
      } else if (found->abandoned != 0) {
        if (acknowledged && found->nonce == acknowledged->nonce) {
          remove_quietly(ack);
          fail(ErrorCode::kIo, "rendezvous ", path, ": rank 0 gave up waiting for the other ",
               "ranks after rank ", ranks_.rank, " of ", ranks_.size,
               " read its id (rank 0's error names the missing ranks)");
        }
        seen = " (the file there was abandoned by a rank 0 that gave up waiting)";
      } else if (found->size != static_cast<std::uint64_t>(ranks_.size)) {
        // A stale file or a launch with mixed sizes: not ours to acknowledge; a rank 0 of this
        // group may still replace it.
        seen = " (the file there is for a group of " + std::to_string(found->size) +
               " ranks, this rank's group has " + std::to_string(ranks_.size) + ")";
      } else if (!acknowledged || found->nonce != acknowledged->nonce) {
        write_atomically(ack, nonce_bytes(found->nonce));
        acknowledged = std::move(found);
      }
    } else if (acknowledged) {
      return acknowledged->blob;  // rank 0 saw every acknowledgement of this nonce and cleaned up
    }
    if (Clock::now() > deadline) {
      remove_quietly(ack);
      if (acknowledged) {
        fail(ErrorCode::kIo, "rendezvous ", path, ": rank ", ranks_.rank, " of ", ranks_.size,
             " read an id but rank 0 did not confirm that every rank read it within ",
             seconds_text(options_.timeout),
             " (another rank is missing, or the file is left from an earlier launch with run id '",
             options_.run_id, "' and rank 0 is not running)");
      }
      fail(ErrorCode::kIo, "rendezvous ", path, ": rank ", ranks_.rank, " of ", ranks_.size,
           " waited ", seconds_text(options_.timeout), " for rank 0 to publish its id", seen,
           " (is rank 0 running, with the same rendezvous dir and run id '", options_.run_id,
           "'?)");
    }
    backoff.wait();
  }
}

}  // namespace mxq::dist
