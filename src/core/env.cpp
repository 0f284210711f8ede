#include "mxq/core/env.h"

#include <array>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "mxq/core/error.h"

extern char** environ;  // NOLINT(readability-redundant-declaration)

namespace mxq {
namespace {

constexpr std::array<EnvVarSpec, 13> kRegistry = {{
    {"MXQ_LOG_LEVEL", EnvType::kChoice, "warn", "messages at this level and above go to stderr",
     "trace,debug,info,warn,error,off"},
    {"MXQ_CACHE_DIR", EnvType::kPath, "",
     "cache directory (default: $XDG_CACHE_HOME/mxq, else ~/.cache/mxq)", ""},
    {"MXQ_NUM_THREADS", EnvType::kInt, "0",
     "threads for CPU loops (the caller and a pool of N-1 workers, made once); 0 means one per "
     "hardware thread",
     ""},
    {"MXQ_AUTOTUNE", EnvType::kChoice, "load",
     "autotuner mode: off (default tactics), load (serve the cache), tune (tune what the cache "
     "lacks, save into it), fresh (read nothing, tune everything into a new runs/ file)",
     "off,load,tune,fresh"},
    {"MXQ_AUTOTUNE_CACHE", EnvType::kPath, "",
     "autotune cache file (default: <cache dir>/autotune/<version>/<device>/<deployment>.json)",
     ""},
    {"MXQ_AUTOTUNE_SKIP_OPS", EnvType::kList, "",
     "comma-separated ops that always run their default tactic (never tuned or served from cache)",
     ""},
    {"MXQ_AUTOTUNE_BUDGET", EnvType::kInt, "0",
     "seconds one tuning pass may spend; what is left untuned runs the default tactic; 0 = no "
     "limit",
     ""},
    {"MXQ_RANK", EnvType::kInt, "",
     "this process's rank in a multi-process group (with MXQ_WORLD_SIZE; overrides torchrun's "
     "RANK and Open MPI's OMPI_COMM_WORLD_RANK)",
     ""},
    {"MXQ_WORLD_SIZE", EnvType::kInt, "", "number of ranks in the group (with MXQ_RANK)", ""},
    {"MXQ_LOCAL_RANK", EnvType::kInt, "",
     "rank among this node's ranks, the GPU it uses (default: MXQ_RANK)", ""},
    {"MXQ_RENDEZVOUS_DIR", EnvType::kPath, "",
     "folder where rank 0 publishes the NCCL id for the other ranks of the node (default: <temp "
     "dir>/mxq-rendezvous-<uid>)",
     ""},
    {"MXQ_RUN_ID", EnvType::kString, "",
     "names one launch's rendezvous files; same on every rank, new for every launch (default: "
     "torchrun's run id, mpirun's PMIx namespace, else the parent process)",
     ""},
    {"MXQ_RENDEZVOUS_TIMEOUT", EnvType::kInt, "300",
     "seconds ranks wait for each other in the rendezvous", ""},
}};

std::vector<std::string> split_commas(std::string_view text) {
  std::vector<std::string> parts;
  std::string current;
  for (const char c : text) {
    if (c == ',') {
      if (!current.empty()) parts.push_back(current);
      current.clear();
    } else if (c != ' ') {
      current.push_back(c);
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

std::string effective(const EnvVarSpec& spec) {
  auto raw = env_raw(spec.name);
  return raw ? *raw : std::string(spec.default_value);
}

[[noreturn]] void bad_value(const EnvVarSpec& spec, const std::string& value,
                            std::string_view expected) {
  fail(ErrorCode::kInvalidArgument, "environment variable ", spec.name, ": expected ", expected,
       ", found '", value, "'");
}

}  // namespace

std::span<const EnvVarSpec> env_registry() { return kRegistry; }

const EnvVarSpec& env_spec(std::string_view name) {
  for (const auto& spec : kRegistry) {
    if (spec.name == name) return spec;
  }
  fail(ErrorCode::kInternal, "environment variable ", name, " is not in mxq's registry");
}

std::optional<std::string> env_raw(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::string env_string(std::string_view name) {
  const EnvVarSpec& spec = env_spec(name);
  std::string value = effective(spec);
  if (spec.type == EnvType::kChoice) {
    for (const auto& choice : split_commas(spec.choices)) {
      if (choice == value) return value;
    }
    bad_value(spec, value, std::string("one of ") + std::string(spec.choices));
  }
  return value;
}

std::int64_t env_int(std::string_view name) {
  const EnvVarSpec& spec = env_spec(name);
  const std::string value = effective(spec);
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || end == nullptr || *end != '\0')
    bad_value(spec, value, "an integer");
  return parsed;
}

bool env_bool(std::string_view name) {
  const EnvVarSpec& spec = env_spec(name);
  const std::string value = effective(spec);
  if (value == "1" || value == "true" || value == "on" || value == "yes") return true;
  if (value == "0" || value == "false" || value == "off" || value == "no") return false;
  bad_value(spec, value, "one of 1,0,true,false,on,off,yes,no");
}

std::vector<std::string> env_list(std::string_view name) {
  return split_commas(effective(env_spec(name)));
}

std::string env_validate(std::string_view name) {
  const EnvVarSpec& spec = env_spec(name);
  // Unset without a default means "not given" (e.g. MXQ_RANK outside a multi-process launch).
  if (!env_raw(name) && spec.default_value.empty()) return {};
  try {
    switch (spec.type) {
      case EnvType::kInt:
        (void)env_int(name);
        break;
      case EnvType::kBool:
        (void)env_bool(name);
        break;
      case EnvType::kChoice:
        (void)env_string(name);
        break;
      default:
        break;
    }
  } catch (const Error& error) {
    return error.what();
  }
  return {};
}

std::vector<std::string> env_unknown_variables() {
  std::vector<std::string> unknown;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    if (!text.starts_with("MXQ_")) continue;
    const std::string_view name = text.substr(0, text.find('='));
    bool known = false;
    for (const auto& spec : kRegistry) known = known || spec.name == name;
    if (!known) unknown.emplace_back(name);
  }
  return unknown;
}

std::string cache_dir() {
  if (auto dir = env_raw("MXQ_CACHE_DIR")) return *dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/mxq";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.cache/mxq";
  return "/tmp/mxq-cache";
}

int num_threads() {
  const std::int64_t requested = env_int("MXQ_NUM_THREADS");
  if (requested < 0) {
    fail(ErrorCode::kInvalidArgument, "environment variable MXQ_NUM_THREADS: expected >= 0, found ",
         requested);
  }
  if (requested > 0) return static_cast<int>(requested);
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : static_cast<int>(hardware);
}

}  // namespace mxq
