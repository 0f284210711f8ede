// How much host memory this process can still take, so that a request (a TP split, a padding,
// a token count) is checked against the machine before anything is allocated: on Linux a large
// allocation succeeds on paper and the kernel's OOM killer ends the process later, silently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mxq {

struct HostMemory {
  // Bytes: MemAvailable + SwapFree of /proc/meminfo, lowered to what the process's cgroup limit
  // leaves (v2 memory.max - memory.current, v1 memory.limit_in_bytes - memory.usage_in_bytes).
  // Without /proc/meminfo: the free physical pages (sysconf). UINT64_MAX when nothing is known.
  std::uint64_t available = 0;
  std::string source;  // where the number comes from, for messages ("/proc/meminfo", "cgroup")
};

// Read anew at every call (the numbers change as other processes run).
HostMemory host_memory();

// Bytes in decimal units with three significant digits: "85.2 MB", "1.94 TB", "512 B".
std::string format_bytes(std::uint64_t bytes);

// Throws Error(kOutOfRange) naming `argument` when `bytes` exceed host_memory().available:
//   "<argument>: expected a value whose memory fits in the <available> of host memory available
//    (<source>), found <found>: <needs> <bytes formatted><note>"
// `found` is the value given, `needs` what it would hold ("its 100000 ranks would hold"), `note`
// any further reason ("; ...").
void require_host_memory(std::uint64_t bytes, std::string_view argument, std::string_view found,
                         std::string_view needs, std::string_view note = {});

// a * b and a + b saturated at UINT64_MAX (sizes that overflow are "more than any machine").
std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b);
std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b);

}  // namespace mxq
