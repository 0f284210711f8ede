// parallel_for: splits [0, n) into contiguous chunks over num_threads() threads. Chunks smaller
// than `grain` are not split further, so small loops run inline on the caller's thread.
//
// The threads are one persistent pool per process, created on first use with num_threads() - 1
// workers (MXQ_NUM_THREADS; grown if that variable later asks for more) plus the calling thread.
// It never multiplies threads: a parallel_for called from inside a chunk (nested), or while
// another thread's parallel_for holds the pool (e.g. several of torch's intra-op threads calling
// mxq at once), runs its chunks on its own thread. A worker that cannot be started (a thread or
// pid limit) is no error: the calling thread runs the chunks nobody took. An exception thrown by
// a chunk reaches the caller after every chunk has run (the first chunk's, when several throw).
// A child process after fork() starts with a new, empty pool (forking from inside a chunk is
// not supported: the child would wait for the parent's workers).
#pragma once

#include <algorithm>
#include <cstdint>

#include "mxq/core/env.h"

namespace mxq {

namespace detail {
// Runs run(context, c) once for every c in [0, chunks), on the pool and the calling thread.
void run_chunks(std::int64_t chunks, void (*run)(void* context, std::int64_t chunk), void* context);
}  // namespace detail

template <typename Body>  // Body(std::int64_t begin, std::int64_t end)
void parallel_for(std::int64_t n, std::int64_t grain, Body&& body) {
  if (n <= 0) return;
  const std::int64_t max_chunks = std::max<std::int64_t>(1, n / std::max<std::int64_t>(grain, 1));
  const std::int64_t chunks = std::min<std::int64_t>(num_threads(), max_chunks);
  if (chunks <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
  auto run = [&](std::int64_t chunk) { body(n * chunk / chunks, n * (chunk + 1) / chunks); };
  detail::run_chunks(
      chunks,
      [](void* context, std::int64_t chunk) { (*static_cast<decltype(run)*>(context))(chunk); },
      &run);
}

}  // namespace mxq
