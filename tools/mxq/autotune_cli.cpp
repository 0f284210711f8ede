#include "autotune_cli.h"

#include <algorithm>
#include <filesystem>

#include "mxq/core/error.h"
#include "mxq/tune/registry.h"

namespace mxq::cli {

std::vector<tune::PresetProblem> preset_problems_for(const std::string& preset,
                                                     const tune::ParallelLayout& layout,
                                                     tune::Backend backend) {
  std::vector<tune::PresetProblem> out;
  std::vector<std::string> ops;
  for (tune::PresetProblem& p : tune::find_preset(preset).problems(layout)) {
    if (std::find(ops.begin(), ops.end(), p.problem.op()) == ops.end()) {
      ops.push_back(p.problem.op());
    }
    if (tune::builtin_tactics().find_op(p.problem.op(), backend) != nullptr) {
      out.push_back(std::move(p));
    }
  }
  if (out.empty()) {
    std::string names;
    for (const std::string& op : ops) names += (names.empty() ? "" : ", ") + op;
    fail(ErrorCode::kUnsupported, "preset ", preset, " has nothing to tune on --device ",
         tune::to_string(backend), ": its ops (", names, ") have no ", tune::to_string(backend),
         " tactics in this build");
  }
  return out;
}

tune::Deployment preset_deployment(const std::string& preset, const tune::ParallelLayout& layout,
                                   tune::Backend backend) {
  tune::Deployment deployment;
  deployment.model = preset;
  deployment.tp = layout.tp;
  deployment.ep = layout.ep;
  for (const tune::PresetProblem& p : preset_problems_for(preset, layout, backend)) {
    deployment.problems.push_back(p.problem.canonical());
  }
  return deployment;
}

nlohmann::json fingerprint_json(const tune::Fingerprint& fp) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : fp.fields()) {
    out[name] = tune::Fingerprint::numeric_field(name) ? nlohmann::json(std::stoll(value))
                                                       : nlohmann::json(value);
  }
  return out;
}

nlohmann::json ServingTuner::json() const {
  return {{"mode", mode},
          {"cache", tuner ? nlohmann::json(cache) : nlohmann::json(nullptr)},
          {"note", note}};
}

ServingTuner serving_tuner(tune::Backend backend, const std::optional<tune::Deployment>& deployment,
                           int device, dist::Communicator* comm) {
  ServingTuner out;
  tune::AutotuneOptions options = tune::AutotuneOptions::from_env();
  out.mode = std::string(tune::to_string(options.mode));
  if (options.mode == tune::AutotuneMode::kOff) {
    out.note = "MXQ_AUTOTUNE=off: the cache is not read; the default tactics run";
    return out;
  }
  if (options.mode == tune::AutotuneMode::kFresh) {
    out.note = "MXQ_AUTOTUNE=fresh reads no cache; the default tactics run";
    return out;
  }
  if (options.cache_path.empty() && !deployment) {
    out.note =
        "no cache file to read: set MXQ_AUTOTUNE_CACHE to the file `mxq tune` wrote; the default "
        "tactics run";
    return out;
  }
  options.mode = tune::AutotuneMode::kLoad;  // serving never writes the cache
  tune::AutotunerConfig config;
  config.options = options;
  config.backend = backend;
  config.device = device;
  config.deployment = deployment;
  config.communicator = comm;
  out.tuner = std::make_unique<tune::Autotuner>(config);
  if (comm != nullptr) out.tuner->seal();  // warns (below) when this rank adopted rank 0's
  out.cache = out.tuner->cache_path();
  if (!std::filesystem::exists(out.cache)) {
    out.note = "no cache file at " + out.cache + " yet (run `mxq tune`): the default tactics run";
  } else {
    out.note = "reading " + out.cache + " (" + std::to_string(out.tuner->decisions().size()) +
               " servable decision(s))";
    // Why it serves nothing, when it does not (an unreadable or foreign file): the warning.
    for (const std::string& warning : out.tuner->warnings()) out.note += "; " + warning;
  }
  return out;
}

}  // namespace mxq::cli
