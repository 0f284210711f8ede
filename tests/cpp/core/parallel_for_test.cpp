// parallel_for's thread pool: under a thread limit (a worker that cannot be started leaves its
// chunks to the threads there are: every index is still covered once), and without one: the
// workers are made once and reused, a nested call or several callers at once add no thread, an
// exception in a chunk reaches the caller, and a child after fork() gets a working pool.
// pthread_create is interposed in this test binary to count thread creations and to fail them.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "mxq/core/parallel.h"

namespace {

// Thread creations left before pthread_create fails with EAGAIN; negative: never fails.
std::atomic<int> creations_before_failure{-1};
// Threads created so far in this process.
std::atomic<int> threads_created{0};

}  // namespace

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*),
                              void* arg) {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const auto real = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
  if (creations_before_failure.load() >= 0 && creations_before_failure.fetch_sub(1) <= 0) {
    return EAGAIN;
  }
  const int result = real(thread, attr, start, arg);
  if (result == 0) threads_created.fetch_add(1);
  return result;
}

namespace mxq {
namespace {

constexpr int kThreads = 4;  // MXQ_NUM_THREADS: the pool has at most 3 workers

void expect_every_index_once(int threads_startable) {
  creations_before_failure = threads_startable;
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(1000, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)]++;
  });
  creations_before_failure = -1;
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

// The threads that ran a loop of `chunks` chunks that each take a while (long enough for every
// worker to take one).
std::set<std::thread::id> threads_running(int chunks) {
  std::mutex mutex;
  std::set<std::thread::id> ids;
  parallel_for(chunks, 1, [&](std::int64_t, std::int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::lock_guard<std::mutex> lock(mutex);
    ids.insert(std::this_thread::get_id());
  });
  return ids;
}

class ParallelFor : public ::testing::Test {
 protected:
  void SetUp() override { setenv("MXQ_NUM_THREADS", std::to_string(kThreads).c_str(), 1); }
};

TEST_F(ParallelFor, CoversEveryIndexOnceWhenWorkerThreadsCannotBeStarted) {
  for (const int startable : {0, 1, 2}) {
    SCOPED_TRACE(startable);
    expect_every_index_once(startable);
  }
  expect_every_index_once(-1);  // and with every thread started
}

TEST_F(ParallelFor, MakesItsThreadsOnceAndReusesThem) {
  const int before = threads_created.load();
  for (int call = 0; call < 50; ++call) expect_every_index_once(-1);
  EXPECT_GT(threads_running(kThreads).size(), 1U) << "the loop ran on the caller's thread only";
  EXPECT_LE(threads_created.load() - before, kThreads - 1);
}

TEST_F(ParallelFor, ANestedCallRunsOnTheThreadThatMakesIt) {
  const int before = threads_created.load();
  std::vector<std::atomic<int>> hits(kThreads * 1000);
  parallel_for(kThreads, 1, [&](std::int64_t outer_begin, std::int64_t outer_end) {
    for (std::int64_t outer = outer_begin; outer < outer_end; ++outer) {
      const std::thread::id outer_thread = std::this_thread::get_id();
      parallel_for(1000, 1, [&](std::int64_t begin, std::int64_t end) {
        EXPECT_EQ(std::this_thread::get_id(), outer_thread);
        for (std::int64_t i = begin; i < end; ++i)
          hits[static_cast<std::size_t>(outer * 1000 + i)]++;
      });
    }
  });
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_LE(threads_created.load() - before, kThreads - 1);
}

// Several threads calling at once (torch's intra-op threads, each in an mxq op) share the pool:
// the threads that find it busy run their loop themselves.
TEST_F(ParallelFor, CallersAtOnceShareThePoolAndAddNoThreads) {
  constexpr int kCallers = 4;
  constexpr int kCalls = 20;
  const int before = threads_created.load();
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      for (int call = 0; call < kCalls; ++call) {
        std::vector<std::atomic<int>> hits(400);
        parallel_for(400, 1, [&](std::int64_t begin, std::int64_t end) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)]++;
        });
        for (const auto& h : hits) wrong += h.load() != 1;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(threads_created.load() - before, kCallers + kThreads - 1);
}

TEST_F(ParallelFor, AnExceptionInAChunkReachesTheCallerAfterEveryChunkRan) {
  const int before = threads_created.load();
  for (int round = 0; round < 3; ++round) {
    std::vector<std::atomic<int>> hits(1000);
    EXPECT_THROW(parallel_for(1000, 1,
                              [&](std::int64_t begin, std::int64_t end) {
                                for (std::int64_t i = begin; i < end; ++i) {
                                  hits[static_cast<std::size_t>(i)]++;
                                  if (i == 999) throw std::runtime_error("chunk failed");
                                }
                              }),
                 std::runtime_error);
    for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
    expect_every_index_once(-1);  // the pool still works
  }
  EXPECT_LE(threads_created.load() - before, kThreads - 1);
}

// The parent's workers do not exist in a child: the child gets a pool of its own (more than one
// thread runs its loop), and exits cleanly with that pool alive.
TEST_F(ParallelFor, AChildAfterForkGetsAWorkingPoolAndExitsCleanly) {
  ASSERT_GT(threads_running(kThreads).size(), 1U);  // the parent's pool exists
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(60);  // a hang fails the test (SIGALRM) rather than blocking it
    const bool pooled = threads_running(kThreads).size() > 1;
    std::vector<std::atomic<int>> hits(1000);
    parallel_for(1000, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)]++;
    });
    bool covered = true;
    for (const auto& h : hits) covered = covered && h.load() == 1;
    std::exit(pooled && covered ? 0 : 1);  // runs the static destructors, the pool's workers up
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's loop did not run on a pool of its own";
}

}  // namespace
}  // namespace mxq
