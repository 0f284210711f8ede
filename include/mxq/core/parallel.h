// parallel_for: splits [0, n) into contiguous chunks over num_threads() threads. Chunks smaller
// than `grain` are not split further, so small loops run inline on the caller's thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

#include "mxq/core/env.h"

namespace mxq {

template <typename Body>  // Body(std::int64_t begin, std::int64_t end)
void parallel_for(std::int64_t n, std::int64_t grain, Body&& body) {
  if (n <= 0) return;
  const std::int64_t max_chunks = std::max<std::int64_t>(1, n / std::max<std::int64_t>(grain, 1));
  const std::int64_t chunks = std::min<std::int64_t>(num_threads(), max_chunks);
  if (chunks <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(chunks));
  workers.reserve(static_cast<std::size_t>(chunks - 1));
  const auto run = [&](std::int64_t chunk) {
    try {
      body(n * chunk / chunks, n * (chunk + 1) / chunks);
    } catch (...) {
      errors[static_cast<std::size_t>(chunk)] = std::current_exception();
    }
  };
  // A thread that cannot be started (a thread or pid limit) is no error: the caller's thread runs
  // the chunks left over. (Rethrowing would destroy the started threads still joinable, which
  // terminates the process.)
  std::int64_t started = 1;
  try {
    for (; started < chunks; ++started) workers.emplace_back(run, started);
  } catch (const std::system_error&) {
  }
  run(0);
  for (std::int64_t chunk = started; chunk < chunks; ++chunk) run(chunk);
  for (auto& worker : workers) worker.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace mxq
