// Helpers shared by the subcommands (cli_util.h).
#include "cli_util.h"

#include <unistd.h>

#include <filesystem>
#include <new>
#include <string_view>
#include <system_error>

#include "mxq/core/error.h"

namespace mxq::cli {

bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

void require_writable_output(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (path.empty()) fail_argument(ErrorCode::kInvalidArgument, flag, "a file path", "''");
  if (fs::is_directory(path, error)) {
    fail_argument(ErrorCode::kIo, flag, "a file path", "'" + path + "', a directory");
  }
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(dir, error)) {
    fail(ErrorCode::kIo, flag, ": the directory of '", path, "' (", dir, ") does not exist");
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    fail(ErrorCode::kIo, flag, ": the directory of '", path, "' (", dir, ") is not writable");
  }
}

bool is_allocation_failure(const std::exception& error) {
  if (dynamic_cast<const std::bad_alloc*>(&error) != nullptr) return true;
  const auto* mxq_error = dynamic_cast<const Error*>(&error);
  return mxq_error != nullptr && mxq_error->code() == ErrorCode::kOutOfRange &&
         std::string_view(mxq_error->what()).starts_with("host allocation of ");
}

}  // namespace mxq::cli
