// How the autotuner runs: mode, cache file, skip list, budget and measurement settings; from
// the environment (MXQ_AUTOTUNE*) or set through the API. And where cache files live.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/tune/fingerprint.h"

namespace mxq::tune {

enum class AutotuneMode {
  kOff,    // serve default tactics; read and write nothing
  kLoad,   // serve what the cache file holds; never tune, never write
  kTune,   // serve the cache file; tuning sessions measure what it lacks and save into it
  kFresh,  // read nothing; tune everything into a new file <dir>/runs/<name>-<UTC time>-<pid>.json
};
std::string_view to_string(AutotuneMode mode);
AutotuneMode autotune_mode_from_string(std::string_view text);  // throws naming the choices

struct MeasureSettings {
  int warmup_runs = 2;               // untimed calls of every candidate before timing
  int rounds = 7;                    // interleaved rounds; each times every candidate once
  double min_sample_seconds = 2e-4;  // one sample repeats the call until it lasts this long
  int max_calls_per_sample = 1000;
  double tie_band = 0.02;  // a candidate replaces the default only if > 2% faster (median)
};

struct AutotuneOptions {
  AutotuneMode mode = AutotuneMode::kLoad;
  std::string cache_path;             // explicit cache file; empty = default_cache_path()
  std::vector<std::string> skip_ops;  // these ops always run their default tactic
  double budget_seconds = 0;          // per tuning session; 0 = unlimited
  MeasureSettings measure;

  // MXQ_AUTOTUNE (mode), MXQ_AUTOTUNE_CACHE, MXQ_AUTOTUNE_SKIP_OPS, MXQ_AUTOTUNE_BUDGET.
  static AutotuneOptions from_env();
};

// What changes the set of tuned problems of a deployment; hashed into the cache file name, so
// deployments that tune different problems never share (or fight over) one file, while every
// rank and every pass (target, draft) of one deployment on one machine does.
struct Deployment {
  std::string model;        // e.g. "gpt-oss-120b"
  std::string draft_model;  // empty without speculative decoding
  int tp = 1;
  int ep = 1;
  // Canonical problems of target and draft: the models' whole sets, not what one run narrows
  // them to (a skip list or `mxq tune --ops` changes which keys are measured, not the file).
  std::vector<std::string> problems;
};

// "<model>-<16 hex digits>".
std::string deployment_key(const Deployment& deployment);
// <cache dir>/autotune/<mxq version>/<fingerprint slug>/<deployment key>.json
std::string default_cache_path(const Fingerprint& fingerprint, const Deployment& deployment);
// <directory of cache_path>/runs/<stem of cache_path>-<UTC time>-<pid>.json
std::string fresh_run_path(const std::string& cache_path);

}  // namespace mxq::tune
