// Autotuner numbers (docs/PERF.md, "Autotuner (CPU)"):
// - lookup of a (problem, token count) in a tuner serving 10,000 decisions: time and heap
//   allocations per call (targets: <= 100 ns median, 0 allocations);
// - load + save of a 10,000-entry cache file (target: <= 100 ms), and its parts.
// Run: build/bench/mxq_bench_tune --benchmark_repetitions=10
// --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "mxq/linear/tune.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/cache_file.h"

// Counts heap allocations so that the lookup benchmark can show it allocates nothing.
namespace {
std::atomic<std::int64_t> g_allocations{0};
}  // namespace
void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// GCC cannot see that this operator new is malloc-based: its new/free pairing warning is wrong.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t /*size*/) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace mxq::tune {
namespace {

constexpr int kEntries = 10000;
const std::vector<std::int64_t> kBuckets = {1,   2,   4,   8,    16,   32,  64,
                                            128, 256, 512, 1024, 2048, 4096};

// The key of a (small) block-FP8 linear layer of the built-in op block_fp8_linear, whose buckets
// are kBuckets.
Problem linear_problem(std::int64_t n, std::int64_t k) {
  return linear::block_fp8_linear_problem(n, k, {128, 128});
}

// 10,000 servable block_fp8_linear decisions (its CPU tactics, which support every shape and
// token count): 770 problems x 13 buckets, cut at 10,000.
std::vector<CacheEntry> make_entries() {
  std::vector<CacheEntry> entries;
  const char* tactics[] = {"reference", "blocked_f32[tile_n=64]", "blocked_f32[tile_n=16]"};
  for (int p = 0; static_cast<int>(entries.size()) < kEntries; ++p) {
    const Problem problem = linear_problem(64 * (1 + p % 70), 64 * (1 + p / 70));
    for (std::int64_t bucket : kBuckets) {
      if (static_cast<int>(entries.size()) == kEntries) break;
      CacheEntry e;
      e.problem = problem;
      e.bucket = bucket;
      e.tactic = tactics[(p + bucket) % 3];
      e.median_us = 10.5 + p;
      e.default_us = 12.25 + p;
      e.pass = "target";
      e.tuned_at = "2026-12-02T10:00:00Z";
      e.candidates = {{"reference", 12.25 + p}, {e.tactic, 10.5 + p}};
      entries.push_back(e);
    }
  }
  // As CacheStore writes them: sorted by key.
  std::sort(entries.begin(), entries.end(),
            [](const CacheEntry& a, const CacheEntry& b) { return a.key() < b.key(); });
  return entries;
}

struct Fixture {
  std::filesystem::path dir;
  std::string path;
  std::vector<CacheEntry> entries;
  Fingerprint fingerprint = cpu_fingerprint(builtin_tactics());

  Fixture() {
    dir = std::filesystem::temp_directory_path() / ("mxq-bench-tune-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    path = (dir / "cache.json").string();
    entries = make_entries();
    write();
  }
  ~Fixture() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  void write() const {
    CacheStore store(path, fingerprint);
    if (!store.save(entries).ok) std::abort();
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_Lookup(benchmark::State& state, bool hit) {
  Fixture& f = fixture();
  AutotunerConfig config;
  config.options.mode = AutotuneMode::kLoad;
  config.options.cache_path = f.path;
  const Autotuner tuner(config);
  if (tuner.decisions().size() != static_cast<std::size_t>(kEntries)) {
    state.SkipWithError("the benchmark cache is not fully servable");
    return;
  }
  // Queries: problems of the table (hit) or absent ones (miss), token counts between buckets.
  std::vector<Problem> problems;
  std::vector<std::int64_t> tokens;
  std::mt19937 rng(7);
  for (int i = 0; i < 1024; ++i) {
    problems.push_back(hit ? f.entries[rng() % f.entries.size()].problem
                           : linear_problem(100000 + i, 64));
    tokens.push_back(1 + static_cast<std::int64_t>(rng() % 3000));
  }
  std::size_t i = 0;
  std::int64_t tuned = 0;
  const std::int64_t allocations_before = g_allocations.load();
  for (auto _ : state) {
    Selection s = tuner.lookup(problems[i], tokens[i]);
    benchmark::DoNotOptimize(s);
    tuned += s.source == SelectionSource::kTuned;
    i = (i + 1) & 1023;
  }
  const std::int64_t allocations = g_allocations.load() - allocations_before;
  state.counters["allocs_per_lookup"] =
      static_cast<double>(allocations) / static_cast<double>(state.iterations());
  state.counters["tuned_fraction"] =
      static_cast<double>(tuned) / static_cast<double>(state.iterations());
}
BENCHMARK_CAPTURE(BM_Lookup, hit, true);
BENCHMARK_CAPTURE(BM_Lookup, miss, false);

// What the "load + save" means for a tuner: read and parse the file, then persist one
// new winner (lock, the file is unchanged so no re-read, merge, serialize, write, fsync, rename).
void BM_LoadSave10k(benchmark::State& state) {
  Fixture& f = fixture();
  CacheEntry update = f.entries.front();
  int n = 0;
  for (auto _ : state) {
    CacheStore store(f.path, f.fingerprint);
    std::vector<CacheEntry> loaded;
    (void)store.load(loaded);
    update.median_us = 1.0 + (n++ % 7);
    (void)store.save({&update, 1});
    benchmark::DoNotOptimize(loaded.data());
  }
  state.counters["entries"] = kEntries;
  state.counters["file_bytes"] = static_cast<double>(std::filesystem::file_size(f.path));
}
BENCHMARK(BM_LoadSave10k)->Unit(benchmark::kMillisecond);

// A save after another process replaced the file: lock, re-read and parse, merge, write.
void BM_SaveAfterForeignWrite10k(benchmark::State& state) {
  Fixture& f = fixture();
  CacheEntry update = f.entries.back();
  for (auto _ : state) {
    CacheStore store(f.path, f.fingerprint);  // no snapshot: must re-read
    (void)store.save({&update, 1});
  }
}
BENCHMARK(BM_SaveAfterForeignWrite10k)->Unit(benchmark::kMillisecond);

void BM_Parse10k(benchmark::State& state) {
  const std::string text = [] {
    CacheFile file;
    file.fingerprint = fixture().fingerprint;
    file.entries = fixture().entries;
    return serialize_cache(file);
  }();
  for (auto _ : state) benchmark::DoNotOptimize(parse_cache(text));
}
BENCHMARK(BM_Parse10k)->Unit(benchmark::kMillisecond);

void BM_Serialize10k(benchmark::State& state) {
  CacheFile file;
  file.fingerprint = fixture().fingerprint;
  file.entries = fixture().entries;
  for (auto _ : state) benchmark::DoNotOptimize(serialize_cache(file));
}
BENCHMARK(BM_Serialize10k)->Unit(benchmark::kMillisecond);

// Startup of a serving process: load the file and publish the lookup table.
void BM_AutotunerStartup10k(benchmark::State& state) {
  AutotunerConfig config;
  config.options.mode = AutotuneMode::kLoad;
  config.options.cache_path = fixture().path;
  for (auto _ : state) {
    const Autotuner tuner(config);
    benchmark::DoNotOptimize(&tuner);
  }
}
BENCHMARK(BM_AutotunerStartup10k)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace mxq::tune

BENCHMARK_MAIN();
