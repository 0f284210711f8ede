// `mxq tune`: tunes every problem of a deployment (a preset, optionally with a draft preset)
// into its cache file: the target pass, then the draft pass. Misses are measured and saved one
// by one; hits cost nothing. Progress on stderr (a bar on a terminal, plain lines otherwise);
// --json prints what was tuned, hit, skipped and why on stdout.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autotune_cli.h"
#include "cli_util.h"
#include "commands.h"
#include "launch.h"
#include "moe_gpu.h"
#include "mxq/core/env.h"
#include "mxq/core/error.h"
#include "mxq/tune/autotuner.h"
#include "mxq/tune/presets.h"
#include "mxq/tune/registry.h"

namespace mxq::cli {
namespace {

using tune::TuneRecord;
using tune::TuneStatus;

struct TuneArgs {
  std::string preset;
  std::string draft_preset;
  int tp = 1;
  int ep = 1;
  std::vector<std::int64_t> tokens;
  std::vector<std::string> ops;
  std::string device = "cpu";
  std::string cache;
  double budget = 0;          // --budget: seconds for all passes together
  bool budget_given = false;  // else each pass has MXQ_AUTOTUNE_BUDGET's seconds
  bool fresh = false;
  bool json = false;
};

struct PlannedPass {
  std::string name;    // "target" / "draft"
  std::string preset;  // preset name
  std::vector<tune::PresetProblem> problems;
};

// The preset's problems of the backend's ops, narrowed to --ops, with --tokens.
std::vector<tune::PresetProblem> select_problems(const std::string& preset_name,
                                                 const TuneArgs& args, tune::Backend backend) {
  std::vector<tune::PresetProblem> out;
  for (tune::PresetProblem& p : preset_problems_for(preset_name, {args.tp, args.ep}, backend)) {
    if (!args.ops.empty() &&
        std::find(args.ops.begin(), args.ops.end(), p.problem.op()) == args.ops.end()) {
      continue;
    }
    if (!args.tokens.empty()) p.tokens = args.tokens;
    out.push_back(std::move(p));
  }
  return out;
}

// Number of (problem, bucket) keys a pass will visit.
std::size_t count_keys(const PlannedPass& pass, const tune::Autotuner& tuner) {
  std::size_t total = 0;
  for (const tune::PresetProblem& p : pass.problems) {
    const tune::OpSpec* op = tuner.registry().find_op(p.problem.op(), tuner.backend());
    if (op == nullptr) {
      ++total;
      continue;
    }
    std::vector<std::int64_t> buckets;
    for (std::int64_t t : p.tokens)
      buckets.push_back(op->buckets[tune::bucket_index(op->buckets, t)]);
    std::sort(buckets.begin(), buckets.end());
    total +=
        static_cast<std::size_t>(std::unique(buckets.begin(), buckets.end()) - buckets.begin());
  }
  return total;
}

std::string describe(const TuneRecord& r) {
  char line[512];
  std::string what = std::string(tune::to_string(r.status)) + " " + r.tactic;
  if (r.status == TuneStatus::kTuned && r.default_us > 0 && r.median_us > 0) {
    std::snprintf(line, sizeof line, " (%.1f us, default %.1f us, %.2fx)", r.median_us,
                  r.default_us, r.default_us / r.median_us);
    what += line;
  }
  if (!r.reason.empty()) what += " — " + r.reason;
  return r.pass + " " + r.problem + " bucket " + std::to_string(r.bucket) + ": " + what;
}

class Progress {
 public:
  Progress(std::size_t total, bool bar) : total_(total), bar_(bar) {}
  ~Progress() {
    if (bar_ && done_ > 0) std::fprintf(stderr, "\n");
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void record(const TuneRecord& r) {
    ++done_;
    if (bar_) {
      constexpr int kWidth = 30;
      const int filled = total_ == 0 ? kWidth : static_cast<int>(kWidth * done_ / total_);
      std::string bar(static_cast<std::size_t>(filled), '#');
      bar.resize(kWidth, '.');
      std::fprintf(stderr, "\r\033[K[%s] %zu/%zu %s %s@%lld %s", bar.c_str(), done_, total_,
                   r.pass.c_str(), r.problem.c_str(), static_cast<long long>(r.bucket),
                   std::string(tune::to_string(r.status)).c_str());
    } else {
      std::fprintf(stderr, "tune [%zu/%zu] %s\n", done_, total_, describe(r).c_str());
    }
    std::fflush(stderr);
  }

 private:
  std::size_t total_;
  bool bar_;
  std::size_t done_ = 0;
};

nlohmann::json record_json(const TuneRecord& r) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const tune::CandidateResult& c : r.candidates) {
    candidates.push_back({{"tactic", c.tactic}, {"status", c.status}, {"median_us", c.median_us}});
  }
  return {{"pass", r.pass},
          {"problem", r.problem},
          {"op", r.op},
          {"bucket", r.bucket},
          {"status", tune::to_string(r.status)},
          {"tactic", r.tactic},
          {"reason", r.reason},
          {"median_us", r.median_us},
          {"default_us", r.default_us},
          {"seconds", r.seconds},
          {"candidates", candidates}};
}

void run_tune(const TuneArgs& args) {
  const tune::Backend backend = tune::backend_from_string(args.device);
  if (backend == tune::Backend::kCuda) require_gpu_for_device_cuda();
  if (args.tp < 1 || args.ep < 1) {
    fail_argument(ErrorCode::kInvalidArgument, "--tp/--ep", ">= 1",
                  std::to_string(args.tp) + "/" + std::to_string(args.ep));
  }
  if (static_cast<std::int64_t>(args.tp) * args.ep > std::numeric_limits<int>::max()) {
    fail_argument(ErrorCode::kOutOfRange, "--tp x --ep",
                  "at most " + std::to_string(std::numeric_limits<int>::max()) + " ranks",
                  std::to_string(args.tp) + " x " + std::to_string(args.ep));
  }
  if (args.budget < 0) fail_argument(ErrorCode::kInvalidArgument, "--budget", ">= 0", args.budget);
  for (std::int64_t t : args.tokens) {
    if (t < 1) fail_argument(ErrorCode::kInvalidArgument, "--tokens", "counts >= 1", t);
  }
  // Every --ops name must be an op some pass tunes on this device: a typo would tune nothing.
  if (!args.ops.empty()) {
    std::vector<std::string> known;
    for (const std::string& preset : {args.preset, args.draft_preset}) {
      if (preset.empty()) continue;
      for (const tune::PresetProblem& p :
           preset_problems_for(preset, {args.tp, args.ep}, backend)) {
        if (std::find(known.begin(), known.end(), p.problem.op()) == known.end())
          known.push_back(p.problem.op());
      }
    }
    for (const std::string& name : args.ops) {
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      std::string list;
      for (const std::string& op : known) list += (list.empty() ? "" : ", ") + op;
      fail(ErrorCode::kInvalidArgument, "--ops: '", name,
           "' is not an op the preset(s) tune on --device ", args.device,
           " (expected one of: ", list, ")");
    }
  }

  // --tp x --ep ranks on as many GPUs: one process each, tuning together over NCCL (pooled
  // timings, one decision table); else this process tunes alone.
  const RankSetup group = launch_ranks("tune", args.tp * args.ep, backend == tune::Backend::kCuda);
  if (group.spawned()) return;  // rank 0 printed the result
  const bool prints = group.prints();
  std::vector<PlannedPass> passes;
  passes.push_back({"target", args.preset, select_problems(args.preset, args, backend)});
  if (!args.draft_preset.empty()) {
    passes.push_back(
        {"draft", args.draft_preset, select_problems(args.draft_preset, args, backend)});
  }

  tune::AutotuneOptions options = tune::AutotuneOptions::from_env();
  const bool fresh = args.fresh || options.mode == tune::AutotuneMode::kFresh;
  options.mode = fresh ? tune::AutotuneMode::kFresh : tune::AutotuneMode::kTune;
  if (!args.cache.empty()) options.cache_path = args.cache;
  // --budget is shared by the passes (below); without it each pass has MXQ_AUTOTUNE_BUDGET's
  // seconds, as a library session would.
  if (args.budget_given) options.budget_seconds = args.budget;

  tune::Deployment deployment;
  deployment.model = args.preset;
  deployment.draft_model = args.draft_preset;
  deployment.tp = args.tp;
  deployment.ep = args.ep;
  // The models' whole problem sets: `--ops` narrows what this run measures, not which file it
  // writes (the one `mxq run` and a later full `mxq tune` read).
  for (const PlannedPass& pass : passes) {
    for (const tune::PresetProblem& p :
         preset_problems_for(pass.preset, {args.tp, args.ep}, backend))
      deployment.problems.push_back(p.problem.canonical());
  }

  tune::AutotunerConfig config;
  config.options = options;
  config.backend = backend;
  config.device = group.rank.local_rank;
  config.deployment = deployment;
  config.communicator = group.comm.get();  // null: a single rank
  // A cache that cannot be saved into is refused now, in one message, not after every key was
  // tuned (each save warning again).
  config.require_saving = true;
  tune::Autotuner tuner(config);

  std::size_t total = 0;
  for (const PlannedPass& pass : passes) total += count_keys(pass, tuner);
  if (!args.json && prints) {
    std::printf("tuning %zu key(s) of %s%s on %s %s into %s\n", total, args.preset.c_str(),
                args.draft_preset.empty() ? "" : (" + draft " + args.draft_preset).c_str(),
                tuner.fingerprint().backend.c_str(), tuner.fingerprint().device.c_str(),
                tuner.cache_path().c_str());
    std::fflush(stdout);
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<TuneRecord> records;
  {
    Progress progress(total, prints && stderr_is_terminal());
    for (const PlannedPass& pass : passes) {
      std::optional<double> budget;  // the session takes options.budget_seconds
      if (args.budget_given && args.budget > 0) {
        const double used =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        budget = std::max(args.budget - used, 1e-9);
      }
      tune::TuningSession session(tuner, pass.name, budget);
      session.on_record([&](const TuneRecord& r) { progress.record(r); });
      for (const tune::PresetProblem& p : pass.problems) session.tune_tokens(p.problem, p.tokens);
      session.close();
      records.insert(records.end(), session.records().begin(), session.records().end());
    }
  }
  tuner.seal();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::map<std::string, int> counts;
  for (const char* s : {"tuned", "hit", "skipped", "not_tuned", "budget", "failed"}) counts[s] = 0;
  for (const TuneRecord& r : records) ++counts[std::string(tune::to_string(r.status))];
  char digest[17];
  std::snprintf(digest, sizeof digest, "%016llx",
                static_cast<unsigned long long>(tuner.decisions_digest()));
  if (!prints) {
    // The other ranks: one line on stderr, so a launcher's log shows they agreed.
    std::fprintf(stderr, "mxq tune: rank %d of %d: %zu decision(s), digest %s, cache %s\n",
                 group.rank.rank, group.rank.size, tuner.decisions().size(), digest,
                 tuner.cache_path().c_str());
  } else if (args.json) {
    nlohmann::json out;
    out["cache"] = tuner.cache_path();
    out["mode"] = tune::to_string(tuner.mode());
    out["fingerprint"] = fingerprint_json(tuner.fingerprint());
    out["preset"] = args.preset;
    out["draft_preset"] = args.draft_preset;
    out["seconds"] = seconds;
    out["budget"] = {{"seconds", args.budget_given ? args.budget : options.budget_seconds},
                     {"for", args.budget_given ? "all passes" : "each pass"},
                     {"from", args.budget_given ? "--budget" : "MXQ_AUTOTUNE_BUDGET"}};
    out["summary"] = counts;
    out["ranks"] = group.rank.size;
    out["launch"] = {{"mode", dist::to_string(group.plan.mode)}, {"reason", group.plan.reason}};
    out["digest"] = digest;
    nlohmann::json list = nlohmann::json::array();
    for (const TuneRecord& r : records) list.push_back(record_json(r));
    out["records"] = list;
    out["warnings"] = tuner.warnings();
    print_json(out);
  } else {
    for (const TuneRecord& r : records) {
      if (r.status != TuneStatus::kHit && r.status != TuneStatus::kTuned) {
        std::printf("  %s\n", describe(r).c_str());
      }
    }
    std::printf("%d tuned, %d hit, %d skipped, %d over budget, %d failed in %.1f s; cache %s\n",
                counts["tuned"], counts["hit"], counts["skipped"], counts["budget"],
                counts["failed"], seconds, tuner.cache_path().c_str());
    std::printf("%d rank(s) (%s); decisions digest %s\n", group.rank.size,
                std::string(dist::to_string(group.plan.mode)).c_str(), digest);
  }
  if (counts["failed"] > 0) {
    fail(ErrorCode::kInternal, counts["failed"], " key(s) could not be tuned (see above)");
  }
  if (const int unsaved = tuner.unsaved_count(); unsaved > 0) {
    const std::vector<std::string> warnings = tuner.warnings();
    fail(ErrorCode::kIo, unsaved, " tuned decision(s) were not saved to ", tuner.cache_path(),
         warnings.empty() ? std::string() : " (" + warnings.back() + ")",
         "; tune into another file with --cache FILE or --fresh");
  }
}

}  // namespace

void register_tune(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tune", "Tune the problems of a deployment preset (target, then draft) into its cache file");
  auto args = std::make_shared<TuneArgs>();
  std::string presets;
  for (const tune::DeploymentPreset& p : tune::deployment_presets()) {
    presets += (presets.empty() ? "" : ", ") + p.name;
  }
  cmd->add_option("--preset", args->preset, "Deployment preset (" + presets + ")")->required();
  cmd->add_option("--draft-preset", args->draft_preset, "Draft model preset (second pass)");
  cmd->add_option("--tp", args->tp,
                  "Tensor-parallel size (--device cuda with at least TPxEP GPUs: one tuning "
                  "process per GPU, timings pooled over NCCL)")
      ->capture_default_str();
  cmd->add_option("--ep", args->ep, "Expert-parallel size")->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "Token counts to tune (default: the preset's)")
      ->delimiter(',');
  cmd->add_option("--ops", args->ops, "Only these ops")->delimiter(',');
  // The ops each device tunes, as this build registers them.
  std::string device_ops;
  for (const tune::Backend backend : {tune::Backend::kCpu, tune::Backend::kCuda}) {
    std::string names;
    for (const tune::OpSpec* op : tune::builtin_tactics().ops(backend)) {
      names += (names.empty() ? "" : ", ") + op->name;
    }
    device_ops += std::string(device_ops.empty() ? "" : "; ") +
                  std::string(tune::to_string(backend)) + ": " +
                  (names.empty() ? "none in this build" : names);
  }
  cmd->add_option(
         "--device", args->device,
         "cpu or cuda (GPU 0): tunes the preset's ops that have tactics there (" + device_ops + ")")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--cache", args->cache,
                  "Cache file (default: MXQ_AUTOTUNE_CACHE, else the deployment's default path); "
                  "checked before tuning: it must be writable and not another machine's or "
                  "build's");
  cmd->add_option("--budget", args->budget,
                  "Seconds for all passes together; 0 = no limit (default: MXQ_AUTOTUNE_BUDGET "
                  "seconds for each pass, itself 0 unless set)");
  cmd->add_flag("--fresh", args->fresh,
                "Read no cache; write a new timestamped file under runs/ (= MXQ_AUTOTUNE=fresh)");
  cmd->add_flag("--json", args->json, "Print what was tuned, hit, skipped and why as JSON");
  cmd->callback([args, cmd] {
    args->budget_given = cmd->count("--budget") > 0;
    run_tune(*args);
  });
}

}  // namespace mxq::cli
