// Dispatch of the block-FP8 linear op over its registered tactics, and explain(): which tactic
// runs for a problem and, for every tactic not chosen, the first reason why.
//
// Rules (docs/linear.md): the fast path (cuda.sm90_wgmma.*) is eligible only when the block is
// {128, 128}, K % 128 == 0, N % 16 == 0, the output is bf16 and the GPU is sm_90; the fallbacks
// take every other block: cuda.sm90_wgmma_any.* (sm_90; block K extent 64 or 128, N extent 64
// or a multiple of 128, K and N multiples of 16), cuda.mma_sync.* (every block with bn, bk
// multiples of 16); the CPU tactics accept any block. "auto" prefers fast over fallback and picks a
// tile from M, N and the SM count; on the CPU it picks the reference.
//
// Autotuner: given a tune::Autotuner (of the problem's backend), "auto" first asks its cache for
// the block_fp8_linear problem at M (mxq/linear/tune.h). A tuned tactic runs when it
// supports the actual problem; when the cache's winner is the default "auto", or the cache has no
// entry, or its tactic does not support the problem, the rules above decide. Forced requests
// ("fast", "fallback", a name) never consult the tuner.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/linear/problem.h"
#include "mxq/linear/tactic.h"

namespace mxq::tune {
class Autotuner;
class Problem;
}  // namespace mxq::tune

namespace mxq::linear {

// Every tactic of this build, in preference order (fast before fallback before reference within
// a device). The list is built once and never changes.
const std::vector<std::unique_ptr<LinearTactic>>& linear_tactics();
// nullptr when no tactic has this name.
const LinearTactic* find_tactic(std::string_view name);

struct TacticRejection {
  std::string tactic;
  std::string reason;  // the first unsupported reason, or why a supported tactic lost
};

struct Explanation {
  LinearProblem problem;
  std::string requested;                  // "auto", "fast", "fallback" or a tactic name
  const LinearTactic* chosen = nullptr;   // null when nothing matching `requested` supports it
  std::string chosen_because;             // e.g. "fast path; tile m128n128 for 1792 tiles"
  std::vector<TacticRejection> rejected;  // every registered tactic that was not chosen
  // With an autotuner: whether its cache made the choice (a tuned tactic, or the cache's verdict
  // that the dispatch rule is fastest), and what the cache said, e.g. "cache entry for token
  // bucket 64: sm90_wgmma[...] (file ...)" or "no cache entry for token bucket 64: the dispatch
  // rule decides". Empty when no tuner was given.
  bool from_tuner = false;
  std::string tuner_note;

  // Multi-line, human-readable.
  [[nodiscard]] std::string str() const;
};

// `requested` is "auto", "fast" (the preferred supported fast tactic), "fallback" (likewise), or a
// tactic's exact name. Never throws for an unsupported request; `chosen` is then null. `tuner`
// (optional): see the top of this file; throws mxq::Error(kInvalidArgument) when its backend is
// not the problem's device's.
Explanation explain(const LinearProblem& problem, std::string_view requested = "auto",
                    const tune::Autotuner* tuner = nullptr);

// The tactic explain() chooses; throws mxq::Error(kUnsupported) with the explanation when none
// (a forced tactic that does not support the problem names its reason), and kInvalidArgument
// for an unknown name or a tuner of another backend. `tune_problem`: the problem's
// block_fp8_linear problem built once by the caller (linear::block_fp8_linear_problem), so that
// consulting the tuner allocates nothing; null: built here. `from_tuner` (optional out): whether
// the tuner's cache made the choice.
const LinearTactic& select_tactic(const LinearProblem& problem, std::string_view requested = "auto",
                                  const tune::Autotuner* tuner = nullptr,
                                  const tune::Problem* tune_problem = nullptr,
                                  bool* from_tuner = nullptr);

}  // namespace mxq::linear
