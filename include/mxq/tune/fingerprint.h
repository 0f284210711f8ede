// What a cache file was tuned on. A file whose fingerprint differs from the running process's
// in any field is not served and never overwritten: tactic rankings change with the device,
// the driver and runtime, mxq itself and the set of registered tactics.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mxq/tune/registry.h"

namespace mxq::tune {

struct Fingerprint {
  std::string backend;             // "cpu" or "cuda"
  std::string device;              // CPU model name or GPU name
  int cpu_threads = 0;             // hardware threads (cpu backend; 0 for cuda)
  int sm_count = 0;                // (cuda)
  std::string compute_capability;  // "9.0" (cuda)
  int driver_version = 0;          // cudaDriverGetVersion, e.g. 13000 (cuda)
  int runtime_version = 0;         // cudaRuntimeGetVersion (cuda)
  std::string mxq_version;
  std::string registry_hash;  // TacticRegistry::hash()

  // (name, value) in a fixed order: what the file stores and what is compared.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> fields() const;
  // Whether field `name` is a number (the file and JSON reports write it unquoted).
  [[nodiscard]] static bool numeric_field(std::string_view name);
  // One line per differing field: "device: 'A' here, 'B' there".
  [[nodiscard]] std::vector<std::string> differences(const Fingerprint& other) const;
  [[nodiscard]] std::string hash() const;  // 16 hex digits over fields()
  // Directory name for the default cache path: "<device words>-<first 12 hex of hash()>".
  [[nodiscard]] std::string slug() const;
  friend bool operator==(const Fingerprint&, const Fingerprint&) = default;
};

// This machine's CPU ("cpu", /proc/cpuinfo model name, hardware threads).
Fingerprint cpu_fingerprint(const TacticRegistry& registry);
// GPU `device` (throws kUnsupported without CUDA or without that GPU).
Fingerprint cuda_fingerprint(int device, const TacticRegistry& registry);
Fingerprint current_fingerprint(Backend backend, const TacticRegistry& registry, int device = 0);

}  // namespace mxq::tune
