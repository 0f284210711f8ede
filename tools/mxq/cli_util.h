// Small helpers shared by the subcommands: JSON printing and terminal detection.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

namespace mxq::cli {

inline void print_json(const nlohmann::json& value) { std::cout << value.dump(2) << '\n'; }

// Thrown by a command to end with this exit status after printing its result (e.g. `cache diff`
// exits 1 when the files differ); main() returns it.
struct ExitStatus {
  int code = 0;
};

// True when stderr is a terminal (progress bars only then; plain lines otherwise).
bool stderr_is_terminal();

}  // namespace mxq::cli
