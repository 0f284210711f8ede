// parallel_for under a thread limit: when a worker thread cannot be started, the loop still covers
// every index once on the threads it has (it used to destroy the started threads while joinable,
// which terminates the process). pthread_create is interposed in this test binary to fail.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <vector>

#include "mxq/core/parallel.h"

namespace {

// Thread creations left before pthread_create fails with EAGAIN; negative: never fails.
std::atomic<int> creations_before_failure{-1};

}  // namespace

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*),
                              void* arg) {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const auto real = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
  if (creations_before_failure.load() >= 0 && creations_before_failure.fetch_sub(1) <= 0) {
    return EAGAIN;
  }
  return real(thread, attr, start, arg);
}

namespace mxq {
namespace {

void expect_every_index_once(int threads_startable) {
  creations_before_failure = threads_startable;
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(1000, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)]++;
  });
  creations_before_failure = -1;
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ParallelFor, CoversEveryIndexOnceWhenWorkerThreadsCannotBeStarted) {
  setenv("MXQ_NUM_THREADS", "4", 1);
  for (const int startable : {0, 1, 2}) {
    SCOPED_TRACE(startable);
    expect_every_index_once(startable);
  }
  expect_every_index_once(-1);  // and with every thread started
}

}  // namespace
}  // namespace mxq
