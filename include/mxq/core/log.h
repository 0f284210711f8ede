// Logging to stderr, filtered by MXQ_LOG_LEVEL (default warn).
#pragma once

#include <string_view>

#include "mxq/core/error.h"

namespace mxq {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

LogLevel log_level();  // read from MXQ_LOG_LEVEL once, then cached
bool log_enabled(LogLevel level);
void log_message(LogLevel level, std::string_view message);

template <typename... Parts>
void log(LogLevel level, const Parts&... parts) {
  if (log_enabled(level)) log_message(level, detail::concat(parts...));
}
template <typename... Parts>
void log_warn(const Parts&... parts) {
  log(LogLevel::kWarn, parts...);
}
template <typename... Parts>
void log_info(const Parts&... parts) {
  log(LogLevel::kInfo, parts...);
}

}  // namespace mxq
