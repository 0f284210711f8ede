#include "mxq/core/memory.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "mxq/core/error.h"

namespace mxq {
namespace {

constexpr std::uint64_t kUnknown = std::numeric_limits<std::uint64_t>::max();

std::optional<std::uint64_t> parse_u64(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return {};
  return value;
}

std::optional<std::uint64_t> read_u64_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::string line;
  std::getline(in, line);
  return parse_u64(line);
}

// "MemAvailable:   22255000 kB" -> bytes, for the keys asked.
std::optional<std::uint64_t> meminfo_bytes(std::initializer_list<std::string_view> keys) {
  std::ifstream in("/proc/meminfo");
  if (!in) return {};
  std::uint64_t total = 0;
  std::size_t found = 0;
  std::string line;
  while (std::getline(in, line)) {
    for (std::string_view key : keys) {
      if (!line.starts_with(key) || line.size() <= key.size() || line[key.size()] != ':') continue;
      std::istringstream fields(line.substr(key.size() + 1));
      std::uint64_t kib = 0;
      if (fields >> kib) {
        total = saturating_add(total, saturating_mul(kib, 1024));
        ++found;
      }
    }
  }
  if (found == 0) return {};
  return total;
}

// The memory a cgroup still lets the process take (limit - usage), when it has a limit.
std::optional<std::uint64_t> cgroup_room() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::optional<std::uint64_t> room;
  const auto consider = [&](const std::string& limit_file, const std::string& usage_file) {
    const std::optional<std::uint64_t> limit = read_u64_file(limit_file);  // "max" -> none
    if (!limit || *limit >= (std::uint64_t{1} << 60)) return false;        // v1: no limit
    const std::uint64_t usage = read_u64_file(usage_file).value_or(0);
    const std::uint64_t left = *limit > usage ? *limit - usage : 0;
    room = room ? std::min(*room, left) : left;
    return true;
  };
  while (std::getline(in, line)) {
    const std::size_t first = line.find(':');
    const std::size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (controllers.empty()) {  // v2: "0::/path"; inside a cgroup namespace the mount is the root
      if (!consider("/sys/fs/cgroup" + path + "/memory.max",
                    "/sys/fs/cgroup" + path + "/memory.current")) {
        consider("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current");
      }
    } else if (controllers == "memory" || controllers.find("memory") != std::string::npos) {
      const std::string root = "/sys/fs/cgroup/memory";
      if (!consider(root + path + "/memory.limit_in_bytes",
                    root + path + "/memory.usage_in_bytes")) {
        consider(root + "/memory.limit_in_bytes", root + "/memory.usage_in_bytes");
      }
    }
  }
  return room;
}

}  // namespace

std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t out = 0;
  return __builtin_mul_overflow(a, b, &out) ? kUnknown : out;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t out = 0;
  return __builtin_add_overflow(a, b, &out) ? kUnknown : out;
}

HostMemory host_memory() {
  HostMemory memory{kUnknown, "unknown"};
  if (const auto meminfo = meminfo_bytes({"MemAvailable", "SwapFree"})) {
    memory = {*meminfo, "/proc/meminfo: MemAvailable + SwapFree"};
  } else {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES);
    const long page_size = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0) {
      memory = {
          saturating_mul(static_cast<std::uint64_t>(pages), static_cast<std::uint64_t>(page_size)),
          "free physical pages"};
    }
  }
  if (const auto room = cgroup_room(); room && *room < memory.available) {
    memory = {*room, "the limit of this process's cgroup"};
  }
  return memory;
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  auto value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1000.0 && unit + 1 < std::size(kUnits)) {
    value /= 1000.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof text,
                  value < 10    ? "%.2f %s"
                  : value < 100 ? "%.1f %s"
                                : "%.0f %s",
                  value, kUnits[unit]);
  }
  return text;
}

void require_host_memory(std::uint64_t bytes, std::string_view argument, std::string_view found,
                         std::string_view needs, std::string_view note) {
  const HostMemory memory = host_memory();
  if (bytes <= memory.available) return;
  fail_argument(
      ErrorCode::kOutOfRange, argument,
      detail::concat("a value whose memory fits in the ", format_bytes(memory.available),
                     " of host memory available (", memory.source, ")"),
      detail::concat(found, ": ", needs, " ",
                     bytes == kUnknown ? std::string("more than 18 EB") : format_bytes(bytes),
                     note));
}

}  // namespace mxq
