// Small helpers shared by the subcommands: JSON printing, terminal detection, output paths.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "mxq/core/error.h"

namespace mxq::cli {

inline void print_json(const nlohmann::json& value) { std::cout << value.dump(2) << '\n'; }

// Exit statuses: 0 success, 1 a negative answer that is not an error (`cache diff`: the files
// differ; `cache verify`: problems found; `run`: FAIL), 2 an error (bad arguments, unreadable
// files, failures).
inline constexpr int kExitNo = 1;
inline constexpr int kExitError = 2;

// Thrown by a command to end with this exit status after printing its result; main() returns it.
struct ExitStatus {
  int code = 0;
};

// Ends a command with kExitNo after saying why on stderr ("mxq: <parts>").
template <typename... Parts>
[[noreturn]] void answer_no(const Parts&... parts) {
  std::fprintf(stderr, "mxq: %s\n", detail::concat(parts...).c_str());
  throw ExitStatus{kExitNo};
}

// True when stderr is a terminal (progress bars only then; plain lines otherwise).
bool stderr_is_terminal();

// Fails (naming `flag`) unless `path` can be written as a file: its directory exists and is
// writable, and the path is not a directory. Called before the work, so a typo in an output path
// does not cost a whole load and forward.
void require_writable_output(const std::string& path, const char* flag);

// Whether `error` is an allocation that failed: std::bad_alloc, or the mxq::Error the library's
// host allocation throws (src/core/tensor.cpp: "host allocation of N bytes failed").
bool is_allocation_failure(const std::exception& error);

// Runs `work`; an allocation that fails inside it is reported as an error naming `sizes` (the
// flags and values that decided how much is allocated, e.g. "--tp 8 --align 128"), with the
// allocation's own message. Other errors pass through unchanged.
template <typename Work>
decltype(auto) naming_allocation_failures(const std::string& sizes, Work&& work) {
  try {
    return work();
  } catch (const std::exception& error) {
    if (!is_allocation_failure(error)) throw;
    fail(ErrorCode::kOutOfRange, sizes,
         ": expected sizes whose memory this machine can give, found "
         "that an allocation failed (",
         error.what(), "); choose smaller values");
  }
}

}  // namespace mxq::cli
