// Small helpers shared by the subcommands: JSON printing, terminal detection, output paths.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <string>

namespace mxq::cli {

inline void print_json(const nlohmann::json& value) { std::cout << value.dump(2) << '\n'; }

// Thrown by a command to end with this exit status after printing its result (e.g. `cache diff`
// exits 1 when the files differ); main() returns it.
struct ExitStatus {
  int code = 0;
};

// True when stderr is a terminal (progress bars only then; plain lines otherwise).
bool stderr_is_terminal();

// Fails (naming `flag`) unless `path` can be written as a file: its directory exists and is
// writable, and the path is not a directory. Called before the work, so a typo in an output path
// does not cost a whole load and forward.
void require_writable_output(const std::string& path, const char* flag);

}  // namespace mxq::cli
