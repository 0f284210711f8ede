// The one registry of every MXQ_* environment variable. Values are parsed strictly: a value
// that does not parse is an mxq::Error naming the variable, never a silent default.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mxq {

enum class EnvType { kString, kPath, kInt, kBool, kChoice, kList };

struct EnvVarSpec {
  std::string_view name;
  EnvType type;
  std::string_view default_value;  // empty = unset / derived (described in `meaning`)
  std::string_view meaning;
  std::string_view choices;  // comma-separated, for kChoice
};

// Every variable mxq reads, in one table.
std::span<const EnvVarSpec> env_registry();
// Throws when `name` is not registered (catches typos in mxq's own code).
const EnvVarSpec& env_spec(std::string_view name);

// Raw value as set in the environment (nullopt when unset or empty).
std::optional<std::string> env_raw(std::string_view name);
// Effective values: the environment's when set, else the registered default. Throw on bad values.
std::string env_string(std::string_view name);
std::int64_t env_int(std::string_view name);
bool env_bool(std::string_view name);
std::vector<std::string> env_list(std::string_view name);
// Validates a variable's current value; returns the error message or empty.
std::string env_validate(std::string_view name);
// MXQ_* variables set in the environment that the registry does not know (likely typos).
std::vector<std::string> env_unknown_variables();

// Cache directory: MXQ_CACHE_DIR, else $XDG_CACHE_HOME/mxq, else ~/.cache/mxq.
std::string cache_dir();
// Worker threads for CPU loops: MXQ_NUM_THREADS, else the hardware concurrency.
int num_threads();

}  // namespace mxq
