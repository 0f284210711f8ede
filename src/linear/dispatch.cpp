#include "mxq/linear/dispatch.h"

#include <algorithm>
#include <sstream>

#include "linear/cpu_tactics.h"
#include "linear/device_ops.h"
#include "mxq/core/error.h"

namespace mxq::linear {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::int64_t tiles(const LinearProblem& p, std::int64_t bm, std::int64_t bn) {
  return ceil_div(p.m, bm) * ceil_div(p.n, bn);
}

bool is_kind_request(std::string_view requested) {
  return requested == "auto" || requested == "fast" || requested == "fallback" ||
         requested == "reference";
}

// Whether a tactic is among those `requested` names.
bool requested_includes(std::string_view requested, const LinearTactic& tactic) {
  if (requested == "auto") return true;
  if (requested == "fast") return tactic.kind() == TacticKind::kFast;
  if (requested == "fallback") return tactic.kind() == TacticKind::kFallback;
  if (requested == "reference") return tactic.kind() == TacticKind::kReference;
  return tactic.name() == requested;
}

struct Preference {
  std::string name;
  std::string because;
};

// The default choice among supported tactics of one kind (names as registered). Measured on an
// H200 (docs/PERF.md): with many waves of 128x128 tiles the large tile wins (fewer operand bytes
// per FLOP); otherwise the last wave's idle SMs dominate, so the tile whose count fills the SMs
// best wins, and among near-equal fills the larger tile (the 64x128 one overlapping promotion
// with the next wgmma).
Preference preferred_fast(const LinearProblem& p) {
  const std::int64_t sms = p.sm_count > 0 ? p.sm_count : 132;
  if (p.m > 64 && tiles(p, 128, 128) >= 2 * sms) {
    return {"cuda.sm90_wgmma.m128n128",
            detail::concat("M > 64 and ", tiles(p, 128, 128), " 128x128 tiles fill ", sms,
                           " SMs at least twice")};
  }
  struct Candidate {
    const char* name;
    std::int64_t tiles;
  };
  std::vector<Candidate> candidates;  // larger tiles first
  if (p.m > 64) candidates.push_back({"cuda.sm90_wgmma.m128n128", tiles(p, 128, 128)});
  candidates.push_back({"cuda.sm90_wgmma.m64n128_overlap", tiles(p, 64, 128)});
  candidates.push_back({"cuda.sm90_wgmma.m64n64", tiles(p, 64, 64)});
  // Fraction of the SM slots of all waves that hold a tile.
  const auto fill = [&](const Candidate& c) {
    return static_cast<double>(c.tiles) / static_cast<double>(ceil_div(c.tiles, sms) * sms);
  };
  double best_fill = 0;
  for (const Candidate& c : candidates) best_fill = std::max(best_fill, fill(c));
  constexpr double kFillTolerance = 0.05;
  for (const Candidate& c : candidates) {
    if (fill(c) >= best_fill - kFillTolerance) {
      return {c.name, detail::concat(c.tiles, " tiles fill ", static_cast<int>(100 * fill(c) + 0.5),
                                     "% of the SM slots of their waves (", sms, " SMs)")};
    }
  }
  return {candidates.back().name, "smallest tile"};  // not reached: the best fill is a candidate
}

Preference preferred_fallback(const LinearProblem& p) {
  if (p.device.is_cpu()) {
    return {"cpu.blocked_f32.n64", "64-column tiles"};
  }
  const std::int64_t sms = p.sm_count > 0 ? p.sm_count : 132;
  {
    // The wgmma kernel where it supports the block: the fast path's tile rule, else the first
    // wgmma tile that supports the block.
    Preference tile = preferred_fast(p);
    tile.name.replace(0, std::string_view("cuda.sm90_wgmma").size(), "cuda.sm90_wgmma_any");
    if (tile.name.ends_with("_overlap")) tile.name.resize(tile.name.size() - 8);  // not compiled
    const LinearTactic* preferred = find_tactic(tile.name);
    if (preferred != nullptr && preferred->supports(p)) return tile;
    for (const auto& tactic : linear_tactics()) {
      if (tactic->name().starts_with("cuda.sm90_wgmma_any.") && tactic->supports(p)) {
        return {tactic->name(), "the wgmma tile that supports block " + to_string(p.block)};
      }
    }
  }
  if (p.block.k % 64 != 0) {
    return {"cuda.mma_sync.m64n128k32",
            detail::concat("block K extent ", p.block.k,
                           " is not a multiple of 64: 32-byte K chunks waste no work")};
  }
  if (p.m <= 16) return {"cuda.mma_sync.m16n64k64", "M <= 16: 16-row tiles"};
  if (p.m <= 64 || tiles(p, 128, 128) < sms) {
    return {"cuda.mma_sync.m64n128k64",
            detail::concat("M = ", p.m, ": 64x128 tiles (", tiles(p, 64, 128), " tiles)")};
  }
  return {"cuda.mma_sync.m128n128k64",
          detail::concat(tiles(p, 128, 128), " 128x128 tiles fill ", sms, " SMs")};
}

std::string params_text(const LinearTactic& tactic) {
  std::ostringstream out;
  const auto params = tactic.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    out << (i == 0 ? "" : " ") << params[i].name << "=" << params[i].value;
  }
  return out.str();
}

}  // namespace

const std::vector<std::unique_ptr<LinearTactic>>& linear_tactics() {
  static const std::vector<std::unique_ptr<LinearTactic>> tactics = [] {
    std::vector<std::unique_ptr<LinearTactic>> list;
    internal::append_cuda_tactics(list);  // fast first, then fallback (none without CUDA)
    internal::append_cpu_tactics(list);
    return list;
  }();
  return tactics;
}

const LinearTactic* find_tactic(std::string_view name) {
  for (const auto& tactic : linear_tactics()) {
    if (tactic->name() == name) return tactic.get();
  }
  return nullptr;
}

Explanation explain(const LinearProblem& problem, std::string_view requested) {
  Explanation result;
  result.problem = problem;
  result.requested = std::string(requested);
  const auto& tactics = linear_tactics();

  std::vector<Support> support;
  support.reserve(tactics.size());
  for (const auto& tactic : tactics) support.push_back(tactic->supports(problem));

  // Supported tactics among those requested, best kind first (fast, fallback, reference).
  const auto supported_of = [&](TacticKind kind) {
    std::vector<const LinearTactic*> list;
    for (std::size_t i = 0; i < tactics.size(); ++i) {
      if (support[i] && tactics[i]->kind() == kind && requested_includes(requested, *tactics[i]))
        list.push_back(tactics[i].get());
    }
    return list;
  };
  Preference preference;
  // CUDA: fast before fallback. CPU: the reference by default, the blocked tactics on request.
  const std::vector<TacticKind> kinds =
      problem.device.is_cuda() ? std::vector<TacticKind>{TacticKind::kFast, TacticKind::kFallback,
                                                         TacticKind::kReference}
                               : std::vector<TacticKind>{TacticKind::kReference,
                                                         TacticKind::kFallback, TacticKind::kFast};
  for (const TacticKind kind : kinds) {
    const auto candidates = supported_of(kind);
    if (candidates.empty()) continue;
    if (!is_kind_request(requested)) {
      preference = {candidates.front()->name(), "requested by name"};
    } else if (kind == TacticKind::kFast) {
      preference = preferred_fast(problem);
    } else if (kind == TacticKind::kFallback) {
      preference = preferred_fallback(problem);
    } else {
      preference = {candidates.front()->name(), "the CPU reference (fp64 accumulation)"};
    }
    // A preferred name that is not among the candidates falls back to the first candidate.
    result.chosen = candidates.front();
    for (const LinearTactic* candidate : candidates) {
      if (candidate->name() == preference.name) result.chosen = candidate;
    }
    if (result.chosen->name() != preference.name) {
      preference.because = "first supported " + std::string(to_string(kind)) + " tactic";
    }
    if (requested == "auto" && kind == TacticKind::kFallback && problem.device.is_cuda()) {
      preference.because = "no fast tactic supports the problem; " + preference.because;
    }
    result.chosen_because = std::string(to_string(kind)) + " path; " + preference.because;
    break;
  }

  for (std::size_t i = 0; i < tactics.size(); ++i) {
    const LinearTactic& tactic = *tactics[i];
    if (&tactic == result.chosen) continue;
    std::string reason;
    if (!support[i]) {
      reason = support[i].reason;
    } else if (!requested_includes(requested, tactic)) {
      reason = "supported, but not requested (--tactic " + std::string(requested) + ")";
    } else if (result.chosen != nullptr && result.chosen->kind() != tactic.kind()) {
      reason = "supported, but a " + std::string(to_string(result.chosen->kind())) +
               " tactic is preferred";
    } else {
      reason = "supported, but " + (result.chosen ? result.chosen->name() : std::string("?")) +
               " is preferred: " + preference.because;
    }
    result.rejected.push_back({tactic.name(), reason});
  }
  return result;
}

std::string Explanation::str() const {
  std::ostringstream out;
  out << "problem:   " << problem.str() << "\n";
  out << "requested: " << requested << "\n";
  if (chosen != nullptr) {
    out << "chosen:    " << chosen->name() << " (" << to_string(chosen->kind());
    const std::string params = params_text(*chosen);
    if (!params.empty()) out << "; " << params;
    out << ")\n";
    out << "because:   " << chosen_because << "\n";
  } else {
    out << "chosen:    none: no "
        << (is_kind_request(requested) ? requested + " tactic" : requested)
        << " supports this problem\n";
  }
  out << "not chosen:\n";
  for (const TacticRejection& rejection : rejected) {
    out << "  " << rejection.tactic << ": " << rejection.reason << "\n";
  }
  return out.str();
}

const LinearTactic& select_tactic(const LinearProblem& problem, std::string_view requested) {
  if (!is_kind_request(requested) && find_tactic(requested) == nullptr) {
    std::ostringstream known;
    known << "auto, fast, fallback, reference";
    for (const auto& tactic : linear_tactics()) known << ", " << tactic->name();
    fail_argument(ErrorCode::kInvalidArgument, "tactic", detail::concat("one of: ", known.str()),
                  detail::concat('\'', requested, '\''));
  }
  const Explanation explanation = explain(problem, requested);
  if (explanation.chosen == nullptr) {
    if (!is_kind_request(requested)) {
      const LinearTactic* tactic = find_tactic(requested);
      fail(ErrorCode::kUnsupported, "tactic ", requested, " does not support ", problem.str(), ": ",
           tactic->supports(problem).reason);
    }
    fail(ErrorCode::kUnsupported, "no ", requested == "auto" ? "" : std::string(requested) + " ",
         "tactic supports ", problem.str(), "\n", explanation.str());
  }
  return *explanation.chosen;
}

}  // namespace mxq::linear
