// The autotuner the commands share: the problems of a preset for one backend (what `mxq tune`
// tunes and what names a deployment's cache file), and the read-only tuner that `mxq linear`,
// `mxq moe` and `mxq run` consult when MXQ_AUTOTUNE is load or tune.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mxq/tune/autotuner.h"
#include "mxq/tune/presets.h"

namespace mxq::cli {

// The preset's problems whose op has tactics for `backend` (a preset lists every backend's).
// Throws mxq::Error when none has (naming the preset's ops).
std::vector<tune::PresetProblem> preset_problems_for(const std::string& preset,
                                                     const tune::ParallelLayout& layout,
                                                     tune::Backend backend);

// The deployment `mxq tune --preset PRESET --tp T --ep E --device D` tunes (no draft, no --ops):
// it names the default cache file.
tune::Deployment preset_deployment(const std::string& preset, const tune::ParallelLayout& layout,
                                   tune::Backend backend);

// A fingerprint as JSON, numbers as numbers (as the cache file writes it).
nlohmann::json fingerprint_json(const tune::Fingerprint& fp);

// What a command reads: a tuner over the cache file, or none and why.
struct ServingTuner {
  std::unique_ptr<tune::Autotuner> tuner;  // null: nothing consulted (default tactics/dispatch)
  std::string mode;                        // MXQ_AUTOTUNE
  std::string cache;                       // the file read, when tuner is set
  std::string note;                        // one line: what is read, or why nothing is
  [[nodiscard]] nlohmann::json json() const;
};

// MXQ_AUTOTUNE=load or tune: a tuner of `backend` reading MXQ_AUTOTUNE_CACHE, else the default
// file of `deployment` (when given), in load mode (a command that serves never writes the
// cache; tuning is `mxq tune`'s). off / fresh, or no file to read: none, with the reason.
// With `comm` (the ranks of a multi-process run) the ranks seal together before serving: one that
// read another version of the file (a writer in between) adopts rank 0's decisions. Collective:
// every rank calls it with the same environment.
ServingTuner serving_tuner(tune::Backend backend, const std::optional<tune::Deployment>& deployment,
                           int device = 0, dist::Communicator* comm = nullptr);

}  // namespace mxq::cli
