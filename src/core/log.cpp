#include "mxq/core/log.h"

#include <cstdio>
#include <mutex>
#include <string>

#include "mxq/core/env.h"

namespace mxq {
namespace {

constexpr std::string_view kNames[] = {"trace", "debug", "info", "warn", "error", "off"};

LogLevel parse_level() {
  // A bad value must not make logging throw (it runs in destructors and error paths): it is
  // said once on stderr, and the default level applies.
  const std::string problem = env_validate("MXQ_LOG_LEVEL");
  if (!problem.empty()) {
    std::fprintf(stderr, "[mxq warn] %s; logging at warn\n", problem.c_str());
    return LogLevel::kWarn;
  }
  const std::string value = env_string("MXQ_LOG_LEVEL");
  for (int i = 0; i < 6; ++i) {
    if (kNames[i] == value) return static_cast<LogLevel>(i);
  }
  return LogLevel::kWarn;
}

}  // namespace

LogLevel log_level() {
  static const LogLevel level = parse_level();
  return level;
}

bool log_enabled(LogLevel level) { return level >= log_level() && level != LogLevel::kOff; }

void log_message(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[mxq %s] %.*s\n", std::string(kNames[static_cast<int>(level)]).c_str(),
               static_cast<int>(message.size()), message.data());
}

}  // namespace mxq
