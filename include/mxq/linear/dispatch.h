// Dispatch of the block-FP8 linear op over its registered tactics, and explain(): which tactic
// runs for a problem and, for every tactic not chosen, the first reason why.
//
// Rules (docs/linear.md): the fast path (cuda.sm90_wgmma.*) is eligible only when the block is
// {128, 128}, K % 128 == 0, N % 16 == 0, the output is bf16 and the GPU is sm_90; the fallbacks
// take every other block: cuda.sm90_wgmma_any.* (sm_90; block K extent 64 or 128, N extent 64
// or a multiple of 128, K and N multiples of 16), cuda.mma_sync.* (every block with bn, bk
// multiples of 16); the CPU tactics accept any block. "auto" prefers fast over fallback and picks a
// tile from M, N and the SM count; on the CPU it picks the reference.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mxq/linear/problem.h"
#include "mxq/linear/tactic.h"

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

  // Multi-line, human-readable.
  [[nodiscard]] std::string str() const;
};

// `requested` is "auto", "fast" (the preferred supported fast tactic), "fallback" (likewise), or a
// tactic's exact name. Never throws for an unsupported request; `chosen` is then null.
Explanation explain(const LinearProblem& problem, std::string_view requested = "auto");

// The tactic explain() chooses; throws mxq::Error(kUnsupported) with the explanation when none
// (a forced tactic that does not support the problem names its reason), and kInvalidArgument
// for an unknown name.
const LinearTactic& select_tactic(const LinearProblem& problem,
                                  std::string_view requested = "auto");

}  // namespace mxq::linear
