// The persistent thread pool behind parallel_for (include/mxq/core/parallel.h says what it
// promises). One job at a time: the caller and the workers claim its chunks by index, so chunks
// that no worker takes (none started, or all late) are run by the caller.
#include "mxq/core/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace mxq::detail {
namespace {

// One parallel_for's chunks.
struct Job {
  Job(void (*run_chunk)(void*, std::int64_t), void* chunk_context, std::int64_t chunk_count)
      : run(run_chunk),
        context(chunk_context),
        chunks(chunk_count),
        errors(static_cast<std::size_t>(chunk_count)) {}

  // Claims and runs chunks until none is left; returns how many this thread ran.
  std::int64_t work() {
    std::int64_t ran = 0;
    for (std::int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      try {
        run(context, c);
      } catch (...) {
        errors[static_cast<std::size_t>(c)] = std::current_exception();
      }
      ++ran;
    }
    return ran;
  }

  void (*run)(void*, std::int64_t);
  void* context;
  std::int64_t chunks;
  std::atomic<std::int64_t> next{0};
  std::vector<std::exception_ptr> errors;  // per chunk
  // Under the pool's mutex:
  std::int64_t finished = 0;  // chunks run
  int attached = 0;           // workers that may still touch the job
};

// Whether this thread is running chunks: a pool worker, or a caller inside run_chunks. A
// parallel_for it calls runs inline (nested parallelism would multiply the threads).
thread_local bool t_in_parallel_for = false;

class Pool {
 public:
  // Runs every chunk of `job` on the workers and the calling thread, starting the workers it
  // lacks (up to job.chunks - 1; one that cannot be started leaves its chunks to the others).
  // False, with nothing run, while another thread's job holds the pool.
  bool run(Job& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (job_ != nullptr) return false;
    grow_locked(job.chunks - 1);
    job_ = &job;
    ++generation_;
    const std::int64_t helpers = std::min<std::int64_t>(workers_, job.chunks - 1);
    lock.unlock();
    for (std::int64_t i = 0; i < helpers; ++i) wake_.notify_one();
    const std::int64_t mine = job.work();
    lock.lock();
    job.finished += mine;
    // Workers that attached late find no chunk left, but the job must outlive their look.
    done_.wait(lock, [&] { return job.finished == job.chunks && job.attached == 0; });
    job_ = nullptr;
    return true;
  }

 private:
  void grow_locked(std::int64_t wanted) {
    while (workers_ < wanted) {
      try {
        // Started with the generation before this job's: its first look finds this job.
        std::thread(&Pool::work_loop, this, generation_).detach();
      } catch (const std::system_error&) {
        return;  // a thread or pid limit: the threads there are do the work
      }
      ++workers_;
    }
  }

  void work_loop(std::uint64_t seen) {
    t_in_parallel_for = true;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      Job* job = job_;
      if (job == nullptr) continue;  // finished before this worker looked
      ++job->attached;
      lock.unlock();
      const std::int64_t ran = job->work();
      lock.lock();
      job->finished += ran;
      --job->attached;
      if (job->finished == job->chunks && job->attached == 0) done_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;  // workers: a new job
  std::condition_variable done_;  // the caller: its job's last chunk ran
  Job* job_ = nullptr;
  std::uint64_t generation_ = 0;  // jobs posted so far
  std::int64_t workers_ = 0;      // started (they never exit)
};

// The process's pool. Never destroyed: its workers sleep until the process ends, so exit() has
// no thread to join (nor one that could hang it). A child after fork() has none of the parent's
// workers, and the parent's mutex may have been copied locked: the child forgets that pool (its
// memory is left as it is) and makes its own on first use.
std::atomic<Pool*> g_pool{nullptr};

void forget_pool_in_child() { g_pool.store(nullptr, std::memory_order_relaxed); }

Pool& pool() {
  Pool* current = g_pool.load(std::memory_order_acquire);
  if (current != nullptr) return *current;
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(nullptr, nullptr, forget_pool_in_child); });
  auto* fresh = new Pool();
  if (g_pool.compare_exchange_strong(current, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;  // another thread made it first
  return *current;
}

}  // namespace

void run_chunks(std::int64_t chunks, void (*run)(void* context, std::int64_t chunk),
                void* context) {
  Job job(run, context, chunks);
  if (t_in_parallel_for) {
    job.work();  // nested: this thread is one of the pool's already
  } else {
    t_in_parallel_for = true;
    try {
      if (!pool().run(job)) job.work();  // another caller holds the pool: add no threads
    } catch (...) {
      t_in_parallel_for = false;
      throw;
    }
    t_in_parallel_for = false;
  }
  for (const std::exception_ptr& error : job.errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace mxq::detail
