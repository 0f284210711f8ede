// Shared helpers of the autotuner tests: temporary folders, files, child processes, and a
// synthetic op whose tactics "run" by advancing a per-thread virtual clock (so tuning is
// instant and its timings, noise included, are under the test's control).
//
// Helpers that build a tuner or fingerprint a file take the registry to use: the built-in one
// (builtin_tactics(), what the `mxq` CLI knows) unless a test passes its own, e.g. toy_registry()
// (tune/toy_gemm/toy_gemm.h: the built-in tactics plus the test op toy_gemm). A file the CLI must
// verify, list as "this machine" or serve holds built-in ops and the built-in fingerprint.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mxq/core/error.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/cache_file.h"
#include "mxq/tune/fingerprint.h"
#include "mxq/tune/registry.h"
#include "mxq/tune/timer.h"

extern char** environ;  // NOLINT(readability-redundant-declaration)

namespace mxq::tune::testing {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "mxq-tune-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) fail(ErrorCode::kIo, "mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const fs::path& path() const { return path_; }
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Files in `dir` whose name starts with `prefix`.
inline std::vector<std::string> files_starting_with(const fs::path& dir,
                                                    const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().starts_with(prefix)) out.push_back(entry.path().string());
  }
  return out;
}

struct ProcessResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs argv[0] (a path) with the current environment plus `env` ("NAME=value"), waiting for it.
inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env = {}) {
  TempDir capture;
  const std::string out_path = capture.file("stdout");
  const std::string err_path = capture.file("stderr");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const std::string& extra : env) env_strings.push_back(extra);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (std::string& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);
  pid_t pid = 0;
  ProcessResult result;
  if (posix_spawn(&pid, argp[0], &actions, nullptr, argp.data(), envp.data()) != 0) {
    posix_spawn_file_actions_destroy(&actions);
    result.err = "posix_spawn failed for " + argv[0];
    return result;
  }
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  return result;
}

inline ProcessResult run_cli(const std::vector<std::string>& args,
                             const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {MXQ_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, env);
}

// Quick measurement settings for tests that time real CPU ops (toy_gemm, and the small shapes of
// the built-in moe_expert_gemm and block_fp8_linear that the tests use).
inline MeasureSettings quick_measure() {
  MeasureSettings m;
  m.warmup_runs = 1;
  m.rounds = 3;
  m.min_sample_seconds = 2e-5;
  m.max_calls_per_sample = 20;
  return m;
}

// ---- synthetic op ------------------------------------------------------------------------

// The per-thread virtual clock and noise of the synthetic op (each rank thread owns one).
struct VirtualClock {
  double now = 0;
  std::mt19937_64 rng{1};
  double noise = 0;                    // each call costs cost * (1 + uniform(-noise, noise))
  std::map<std::string, double> bias;  // per tactic id: a fixed extra factor on this thread
};
inline VirtualClock& virtual_clock() {
  thread_local VirtualClock clock;
  return clock;
}

class VirtualTimer final : public Timer {
 public:
  [[nodiscard]] std::string_view name() const override { return "virtual"; }
  double seconds(const std::function<void()>& body) override {
    const double start = virtual_clock().now;
    body();
    return virtual_clock().now - start;
  }
};

struct SyntheticArgs {
  std::string tactic;
  double cost_us_per_token = 0;
  std::int64_t tokens = 0;
};

inline void advance_clock(const SyntheticArgs& args) {
  VirtualClock& clock = virtual_clock();
  std::uniform_real_distribution<double> u(-clock.noise, clock.noise);
  const auto bias = clock.bias.find(args.tactic);
  const double factor = (1.0 + u(clock.rng)) * (bias == clock.bias.end() ? 1.0 : bias->second);
  clock.now += args.cost_us_per_token * 1e-6 * static_cast<double>(args.tokens) * factor;
}

class SyntheticWorkload final : public Workload {
 public:
  explicit SyntheticWorkload(std::int64_t tokens) : tokens_(tokens) {}
  void run(const Tactic& tactic) override { tactic.run(SyntheticArgs{tactic.id(), 0, tokens_}); }
  CheckResult check(const Tactic& tactic) override {
    run(tactic);
    return {true, 0, ""};
  }

 private:
  std::int64_t tokens_;
};

struct SyntheticTactic {
  std::string variant;
  double cost_us_per_token;
  TokenRange tokens{};
};

// Registers op `name` (CPU) with the given tactics; the first one is the default.
inline void add_synthetic_op(TacticRegistry& registry, const std::string& name,
                             const std::vector<SyntheticTactic>& tactics,
                             std::vector<std::int64_t> buckets = power_of_two_buckets(128)) {
  OpSpec op;
  op.name = name;
  op.backend = Backend::kCpu;
  op.buckets = std::move(buckets);
  op.default_tactic = tactics.front().variant;
  op.make_workload = [](const Problem&, std::int64_t tokens) {
    return std::make_unique<SyntheticWorkload>(tokens);
  };
  registry.add_op(std::move(op));
  for (const SyntheticTactic& spec : tactics) {
    Tactic t;
    t.op = name;
    t.variant = spec.variant;
    t.tokens = spec.tokens;
    const double cost = spec.cost_us_per_token;
    t.run = TacticRunner::of<SyntheticArgs>([cost](const SyntheticArgs& args) {
      SyntheticArgs costed = args;
      costed.cost_us_per_token = cost;
      advance_clock(costed);
    });
    registry.add_tactic(std::move(t));
  }
}

inline Problem synthetic_problem(const std::string& op, std::int64_t n) {
  return Problem(op, {{"N", n}}, {{"x", "f32"}});
}

// A decision written by hand, for tests that must know what a cache serves (tuning would pick
// whichever tactic happens to be fastest).
inline CacheEntry hand_written_entry(const Problem& problem, std::int64_t bucket,
                                     std::string tactic) {
  CacheEntry e;
  e.problem = problem;
  e.bucket = bucket;
  e.tactic = std::move(tactic);
  e.median_us = 1.0;
  e.default_us = 2.0;
  e.pass = "hand-written";
  e.tuned_at = "2026-01-01T00:00:00Z";
  return e;
}

// A cache file at `path` holding `entries`, fingerprinted for this machine's CPU and `registry`.
inline void write_cpu_cache(const std::string& path, const TacticRegistry& registry,
                            const std::vector<CacheEntry>& entries) {
  CacheStore store(path, cpu_fingerprint(registry));
  if (!store.save(entries).ok) fail(ErrorCode::kIo, "test cache file ", path, " not written");
}

// The config of a tune-mode CPU tuner that tunes into the cache file at `path` with quick
// measurements (registry null: the built-in one).
inline AutotunerConfig tune_cpu_config(const std::string& path,
                                       const TacticRegistry* registry = nullptr) {
  AutotunerConfig config;
  config.options.mode = AutotuneMode::kTune;
  config.options.cache_path = path;
  config.options.measure = quick_measure();
  config.registry = registry;
  return config;
}

// A load-mode CPU tuner serving the cache file at `path` (registry null: the built-in one).
inline std::unique_ptr<Autotuner> load_cpu_tuner(const std::string& path,
                                                 const TacticRegistry* registry = nullptr) {
  AutotunerConfig config;
  config.options.mode = AutotuneMode::kLoad;
  config.options.cache_path = path;
  config.registry = registry;
  return std::make_unique<Autotuner>(config);
}

}  // namespace mxq::tune::testing
