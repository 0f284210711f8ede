#include "mxq/linear/dispatch.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include <any>
#include <optional>

#include "linear/cpu/tactics.h"
#include "linear/cuda/tile_schedule.h"
#include "linear/device_ops.h"
#include "linear/tune_support.h"
#include "mxq/core/error.h"
#include "mxq/linear/tune.h"
#include "mxq/tune/autotuner.h"

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

// The default choice among supported tactics of one kind (names as registered). `because` is
// written only when `explained` (the text costs more than the choice, and the per-call path does
// not print it).
//
// The fast path's tile: the least modeled time, waves x (setup + per-K cost), with the per-tile
// costs fitted (`scripts/fit_linear_tile_costs.py --tiles <the tiles below>`) to every tactic's
// time in `mxq bench linear` on an H100 (132 SMs, M = 1 ... 4096, main with the weight scales
// staged in shared memory: docs/perf-log/data/linear-deepseek-v3-full-2026-12-07-h100.json). On
// that run the rule's tile is within 1.04x of the fastest timed tile at every point
// (dispatch_test), the fastest at 57 of 66 by the script's count. A 128x128 tile costs about 2x a
// 64x64 one for 4x the work, so many waves favour the large tiles, while a last wave that leaves
// SMs idle favours the small ones: the 112-wide tiles fill 132 SMs at N = 7168 (one wave of 128
// 256x112 tiles at M = 512, where 256x128 makes 112), 3-6% faster there at M = 256 ... 2048. The
// 2-block cluster tile measured 2.1-2.4x slower than m256n128 (still 1.06-1.27x after its stages
// were released at CTA scope): the model never picks it.
// `m64n64_splitk2` (two blocks a tile, each streaming half of K) wins a few points at M = 128,
// N = 2112; `m128n64` fills 132 SMs at N = 2112, M = 512 (one wave of 4 x 33 tiles, where 128x128
// makes 68 and 64x128 136).
//
// At M <= 64 (one 64-row tile: decode and small batches) there is little work to model: every
// tile streams the same weights, and what sets the time is how evenly the tiles fill the SMs'
// waves, then the width of the tile (a wider tile streams faster per SM; not for the bytes it
// keeps in flight: rings three times deeper did not change a narrow tile's rate). The rule: the
// widest 64-row tile whose waves are within 5% as full as the fullest tile's. Checked against
// every M <= 64 point of the 2026-12-06 H100 run after tiles of short M stopped loading TMA's zero
// fill (docs/perf-log/data/linear-deepseek-v3-short-a-2026-12-06-h100.json): N = 2112 takes 132
// 64x16 tiles (14.9 us at M = 1 against 16.1 for the best split-K tile and 17.4 for cuBLASLt),
// N = 4096 128 64x32 ones, N = 7168 112 64x64 ones (45.4 us at K = 16384 against 47.5 for 56
// 64x128 tiles and 49.5 split over K), N = 24576 384 64x64 ones (three nearly full waves beat two
// of 64x128 tiles, the second half empty), N = 32768 256 64x128 ones.
struct TileCost {
  const char* name;  // the fast tactic; its fallback twin is "cuda.sm90_wgmma_any." + the tile
  std::int64_t bm;
  std::int64_t bn;
  std::int64_t cluster;  // blocks per cluster along N: a work unit is `cluster` tiles
  std::int64_t split_k;  // blocks per tile splitting K: each streams K / split_k
  double setup_us;       // per wave, whatever K
  double us_per_k_1000;  // per wave, per 1000 of K (of the block's share of K)
};
constexpr std::array<TileCost, 13> kTileCosts{{
    {"cuda.sm90_wgmma.m256n128_x2", 256, 128, 2, 1, 4.11, 6.83},
    {"cuda.sm90_wgmma.m256n128", 256, 128, 1, 1, 3.61, 6.08},
    {"cuda.sm90_wgmma.m256n112", 256, 112, 1, 1, 3.15, 5.57},
    {"cuda.sm90_wgmma.m128n128_overlap", 128, 128, 1, 1, 2.22, 3.81},
    {"cuda.sm90_wgmma.m128n112", 128, 112, 1, 1, 1.81, 3.62},
    {"cuda.sm90_wgmma.m128n128", 128, 128, 1, 1, 2.30, 3.55},
    {"cuda.sm90_wgmma.m64n64_splitk2", 64, 64, 1, 2, 3.32, 2.71},
    {"cuda.sm90_wgmma.m64n128", 64, 128, 1, 1, 1.54, 2.67},
    {"cuda.sm90_wgmma.m128n64", 128, 64, 1, 1, 1.05, 2.60},
    {"cuda.sm90_wgmma.m64n128_overlap", 64, 128, 1, 1, 1.32, 2.52},
    {"cuda.sm90_wgmma.m64n64", 64, 64, 1, 1, 0.80, 1.94},
    {"cuda.sm90_wgmma.m64n32", 64, 32, 1, 1, 0.63, 1.69},
    {"cuda.sm90_wgmma.m64n16", 64, 16, 1, 1, 0.60, 1.45},
}};
constexpr std::string_view kFastPrefix = "cuda.sm90_wgmma.";
// The tail splits (launch.h, kWgmmaTailSplits): the head tile for the rows it fills whole waves
// with, the tail tile for the rest, each at its own cost above, plus the second launch.
struct TailSplitCost {
  std::string_view name;
  const TileCost* head;
  const TileCost* tail;
};
// The cost entry named `name` (a name not in kTileCosts fails to compile: a throw in a constant
// expression).
constexpr const TileCost* tile_cost(std::string_view name) {
  for (const TileCost& c : kTileCosts) {
    if (c.name == name) return &c;
  }
  throw std::logic_error("no such tile cost");
}
constexpr std::array<TailSplitCost, 1> kTailSplitCosts{{
    {"cuda.sm90_wgmma.m256n128_tail_m64n64", tile_cost("cuda.sm90_wgmma.m256n128"),
     tile_cost("cuda.sm90_wgmma.m64n64")},
}};
// A second kernel in the stream: its launch and its first loads (a guess; with it the model
// gave 68.2 and 117.5 us for the split at M = 2048 and 4096, N = 2112, K = 7168, measured 67.2 and
// 117.0 on an H100).
constexpr double kSecondLaunchUs = 2.0;
constexpr std::int64_t kDecodeMaxM = 64;
// The decode tiles, widest first; each width in its faster form, measured at M <= 64 (H100):
// the 128-wide one overlapping (as fast or faster), and the 32-wide one too (4096 x 7168: 3-5%).
// The 16-wide one overlaps only on blocks shallower than 128 (preferred_fallback; on 128x128
// blocks it ran 5-7% slower; docs/perf-log/linear.md).
struct DecodeTile {
  std::string_view tile;
  std::int64_t bn;
};
constexpr std::array<DecodeTile, 4> kDecodeTiles{
    {{"m64n128_overlap", 128}, {"m64n64", 64}, {"m64n32_overlap", 32}, {"m64n16", 16}}};
// Tiles that fill their waves within this fraction of the fullest count as full.
constexpr double kDecodeWaveSlack = 0.05;

// The decode rule above among the tiles `usable`, named with `prefix`; an empty name when none is.
template <typename Usable>
Preference decode_tile(const LinearProblem& p, std::string_view prefix, bool explained,
                       Usable usable) {
  const std::int64_t sms = p.sm_count > 0 ? p.sm_count : 132;
  // The fraction of the waves' tile slots the tiles of width `bn` fill.
  const auto fill = [&](std::int64_t bn) {
    const std::int64_t count = tiles(p, 64, bn);
    return static_cast<double>(count) / static_cast<double>(ceil_div(count, sms) * sms);
  };
  // Each tile's supports() asked once (this is the per-call path).
  std::array<bool, kDecodeTiles.size()> usable_tile{};
  double fullest = 0.0;
  for (std::size_t i = 0; i < kDecodeTiles.size(); ++i) {
    usable_tile[i] = usable(detail::concat(prefix, kDecodeTiles[i].tile));
    if (usable_tile[i]) fullest = std::max(fullest, fill(kDecodeTiles[i].bn));
  }
  for (std::size_t i = 0; i < kDecodeTiles.size(); ++i) {
    const DecodeTile& candidate = kDecodeTiles[i];
    if (!usable_tile[i] || fill(candidate.bn) < fullest - kDecodeWaveSlack) continue;
    std::string name = detail::concat(prefix, candidate.tile);
    return {std::move(name),
            explained ? detail::concat("M <= ", kDecodeMaxM,
                                       ": the widest 64-row tile whose waves are as full as any (",
                                       tiles(p, 64, candidate.bn), " 64x", candidate.bn,
                                       " tiles on ", sms, " SMs fill ",
                                       std::lround(100 * fill(candidate.bn)), "% of their waves)")
                      : std::string()};
  }
  return {};
}

// The tile of least modeled time among those `usable`, named with `prefix` (kFastPrefix or the
// fallback's); an empty name when none is usable. `one_warpgroup_per_k_scale` multiplies the
// per-K cost of the 64-row (one consumer warpgroup) tiles.
template <typename Usable>
Preference least_modeled_tile(const LinearProblem& p, std::string_view prefix, bool explained,
                              double one_warpgroup_per_k_scale, Usable usable) {
  const std::int64_t sms = p.sm_count > 0 ? p.sm_count : 132;
  // Waves of work units (a cluster's tiles along N count as one) over `m` rows on
  // sms / blocks-per-unit slots.
  const auto waves = [&](const TileCost& c, std::int64_t m) {
    return ceil_div(ceil_div(m, c.bm) * ceil_div(p.n, c.bn * c.cluster),
                    std::max<std::int64_t>(1, sms / (c.cluster * c.split_k)));
  };
  const auto name_of = [&](std::string_view fast_name) {
    return detail::concat(prefix, fast_name.substr(kFastPrefix.size()));
  };
  const auto modeled_us = [&](const TileCost& c, std::int64_t m) {
    const double per_k = c.us_per_k_1000 * (c.bm == 64 ? one_warpgroup_per_k_scale : 1.0);
    return static_cast<double>(waves(c, m)) *
           (c.setup_us +
            per_k * static_cast<double>(p.k) / static_cast<double>(c.split_k) / 1000.0);
  };
  const TileCost* best = nullptr;
  for (const TileCost& c : kTileCosts) {
    if (!usable(name_of(c.name))) continue;
    if (best == nullptr || modeled_us(c, p.m) < modeled_us(*best, p.m)) best = &c;
  }
  if (best == nullptr) return {};
  // A tail split beats the best single tile where its head's whole waves plus the tail's (and
  // the second launch) cost less.
  for (const TailSplitCost& split : kTailSplitCosts) {
    const std::string name = name_of(split.name);
    const std::int64_t head_rows =
        linear::gpu::tail_split_rows(p.m, p.n, split.head->bm, split.head->bn, sms);
    if (head_rows == 0 || !usable(name)) continue;
    const double split_us = modeled_us(*split.head, head_rows) +
                            modeled_us(*split.tail, p.m - head_rows) + kSecondLaunchUs;
    if (split_us >= modeled_us(*best, p.m)) continue;
    return {name, explained
                      ? detail::concat(
                            "least modeled time: ", head_rows, " rows in ",
                            waves(*split.head, head_rows), " whole wave(s) of ", split.head->bm,
                            "x", split.head->bn, " tiles, the other ", p.m - head_rows, " in ",
                            split.tail->bm, "x", split.tail->bn, " tiles on ", sms, " SMs (",
                            std::round(10 * split_us) / 10, " us modeled, against ",
                            std::round(10 * modeled_us(*best, p.m)) / 10, " for ", best->name, ")")
                      : std::string()};
  }
  return {name_of(best->name),
          explained
              ? detail::concat("least modeled time: ", waves(*best, p.m), " wave(s) of ",
                               tiles(p, best->bm, best->bn), " ", best->bm, "x", best->bn,
                               " tiles on ", sms, " SMs",
                               best->cluster > 1 ? detail::concat(" in clusters of ", best->cluster)
                                                 : std::string(),
                               best->split_k > 1
                                   ? detail::concat(", K split over ", best->split_k, " blocks")
                                   : std::string(),
                               " (", std::round(10 * modeled_us(*best, p.m)) / 10, " us modeled)")
              : std::string()};
}

// The decode rule at M <= kDecodeMaxM, else the least modeled time.
template <typename Usable>
Preference preferred_tile(const LinearProblem& p, std::string_view prefix, bool explained,
                          double one_warpgroup_per_k_scale, Usable usable) {
  if (p.m <= kDecodeMaxM) {
    Preference decode = decode_tile(p, prefix, explained, usable);
    if (!decode.name.empty()) return decode;
  }
  return least_modeled_tile(p, prefix, explained, one_warpgroup_per_k_scale, usable);
}

Preference preferred_fast(const LinearProblem& p, bool explained) {
  return preferred_tile(p, kFastPrefix, explained, 1.0, [&](const std::string& name) {
    const LinearTactic* tactic = find_tactic(name);
    return tactic != nullptr && tactic->supports(p);
  });
}

Preference preferred_fallback(const LinearProblem& p, bool explained) {
  if (p.device.is_cpu()) {
    return {"cpu.blocked_f32.n64", "64-column tiles"};
  }
  const std::int64_t sms = p.sm_count > 0 ? p.sm_count : 132;
  // The wgmma kernel where it supports the block, its tile by the fast path's model among the
  // tiles it has (the same kernel's times at 128x128 blocks are the fast path's, within 1%).
  // Its 256-row tile is left to the tuner: on 64x64 blocks it is 1.05-1.14x the rule's tile at
  // M >= 512 on four of the six DeepSeek-V3 shapes but 0.58-0.86x on 2112 x 7168 (H100,
  // docs/perf-log/data/linear-deepseek-v3-fallback-2026-12-06-h100.json), where the model fitted
  // to the fast path would still choose it. Its plain 128x128 tile gives way to the overlapping
  // one, 3-12% faster at every M >= 256 point on 64x64 blocks (two 64-deep units a stage: twice
  // the promotions to hide; docs/perf-log/data/linear-deepseek-v3-short-a-2026-12-06-h100.json).
  // Blocks shallower than 128 put two or four scale units in a stage: a 64-row tile promotes each
  // on its one consumer warpgroup, and its time grows more than a 128-row tile's (on 64x64
  // blocks, M >= 128: median 1.43x the fast path's time for m64n128_overlap, 1.60x for m64n64,
  // 1.34x for m128n128_overlap, same run as above). Without this the model took the 64-row tile
  // at M = 1024, N = 2112, K = 7168 (88.6 us against 84.9 for the 128-row one).
  const bool shallow = p.block.k < 128;
  const double per_k_scale = shallow ? 1.15 : 1.0;
  const auto usable = [&](const std::string& name) {
    if (name == "cuda.sm90_wgmma_any.m256n128" || name == "cuda.sm90_wgmma_any.m128n128") {
      return false;
    }
    const LinearTactic* tactic = find_tactic(name);
    return tactic != nullptr && tactic->supports(p);
  };
  Preference tile = preferred_tile(p, "cuda.sm90_wgmma_any.", explained, per_k_scale, usable);
  // On blocks shallower than 128 (two scale units a stage) both narrow tiles run in their
  // overlapping form, whether the decode rule or the model named them (64x64 blocks, 2112 x 7168:
  // M <= 64 24.4 -> 22.3 us, M = 128 26.2 -> 23.8; H100).
  if (shallow &&
      (tile.name == "cuda.sm90_wgmma_any.m64n32" || tile.name == "cuda.sm90_wgmma_any.m64n16")) {
    std::string twin = tile.name + "_overlap";
    if (usable(twin)) {
      tile = {std::move(twin), explained
                                   ? tile.because +
                                         "; its two-accumulator form: the block holds two scale "
                                         "units a stage"
                                   : std::string()};
    }
  }
  if (!tile.name.empty()) return tile;
  if (p.block.k % 64 != 0) {
    return {"cuda.mma_sync.m64n128k32",
            explained ? detail::concat("block K extent ", p.block.k,
                                       " is not a multiple of 64: 32-byte K chunks waste no work")
                      : std::string()};
  }
  if (p.m <= 16) return {"cuda.mma_sync.m16n64k64", "M <= 16: 16-row tiles"};
  if (p.m <= 64 || tiles(p, 128, 128) < sms) {
    return {"cuda.mma_sync.m64n128k64", explained ? detail::concat("M = ", p.m, ": 64x128 tiles (",
                                                                   tiles(p, 64, 128), " tiles)")
                                                  : std::string()};
  }
  return {"cuda.mma_sync.m128n128k64",
          explained ? detail::concat(tiles(p, 128, 128), " 128x128 tiles fill ", sms, " SMs")
                    : std::string()};
}

// What the rules choose for `requested` (no autotuner): the first kind in the device's order
// (CUDA: fast, fallback, reference; CPU: reference, fallback, fast) with a supported tactic, and
// within it the preferred one (else the first supported). Only the tactics of the kinds looked at
// are asked whether they support the problem, and the reasons are written only when `explained`:
// this is the per-call path of select_tactic.
struct RuleChoice {
  const LinearTactic* tactic = nullptr;  // null: nothing requested supports the problem
  TacticKind kind = TacticKind::kReference;
  std::string because;  // why this tactic within its kind (when explained)
};

RuleChoice choose_by_rule(const LinearProblem& problem, std::string_view requested,
                          bool explained) {
  static constexpr std::array<TacticKind, 3> kCudaOrder{TacticKind::kFast, TacticKind::kFallback,
                                                        TacticKind::kReference};
  static constexpr std::array<TacticKind, 3> kCpuOrder{TacticKind::kReference,
                                                       TacticKind::kFallback, TacticKind::kFast};
  for (const TacticKind kind : problem.device.is_cuda() ? kCudaOrder : kCpuOrder) {
    const LinearTactic* first = nullptr;
    const LinearTactic* preferred = nullptr;
    Preference preference;
    for (const auto& tactic : linear_tactics()) {
      if (tactic->kind() != kind || !requested_includes(requested, *tactic) ||
          !tactic->supports(problem)) {
        continue;
      }
      if (first == nullptr) {
        first = tactic.get();
        if (!is_kind_request(requested)) {
          preference = {first->name(), "requested by name"};
        } else if (kind == TacticKind::kFast) {
          preference = preferred_fast(problem, explained);
        } else if (kind == TacticKind::kFallback) {
          preference = preferred_fallback(problem, explained);
        } else {
          preference = {first->name(), "the CPU reference (fp64 accumulation)"};
        }
      }
      if (preferred == nullptr && tactic->name() == preference.name) preferred = tactic.get();
    }
    if (first == nullptr) continue;
    RuleChoice choice{preferred != nullptr ? preferred : first, kind,
                      std::move(preference.because)};
    if (explained) {
      // A preferred name that is not among the candidates falls back to the first candidate.
      if (preferred == nullptr)
        choice.because = "first supported " + std::string(to_string(kind)) + " tactic";
      if (requested == "auto" && kind == TacticKind::kFallback && problem.device.is_cuda()) {
        choice.because = "no fast tactic supports the problem; " + choice.because;
      }
    }
    return choice;
  }
  return {};
}

std::string params_text(const LinearTactic& tactic) {
  std::ostringstream out;
  const TacticParams params = tactic.params();
  for (const tune::TacticParam& param : params.items()) {
    out << (&param == &params.items().front() ? "" : " ") << param.name << "=" << param.value;
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

namespace {

// What the tuner's cache says about a problem. Allocation-free when the cache holds a tactic that
// supports the problem (the serving path).
struct CacheVerdict {
  tune::Selection selection;
  const LinearTactic* tactic = nullptr;  // the cached linear tactic; null for "auto" or no entry
  Support support;                       // of `tactic` on the problem
  [[nodiscard]] bool tuned() const { return selection.source == tune::SelectionSource::kTuned; }
  // The cache's tactic runs.
  [[nodiscard]] bool use_tactic() const { return tuned() && tactic != nullptr && support.ok; }
  // The cache decided: its tactic runs, or it found the dispatch rule ("auto") fastest.
  [[nodiscard]] bool decided() const { return tuned() && (tactic == nullptr ? true : support.ok); }
};

void check_tuner_backend(const tune::Autotuner& tuner, const LinearProblem& problem) {
  const tune::Backend wanted =
      problem.device.is_cuda() ? tune::Backend::kCuda : tune::Backend::kCpu;
  if (tuner.backend() != wanted) {
    fail_argument(ErrorCode::kInvalidArgument, "tuner",
                  detail::concat("an autotuner of backend ", tune::to_string(wanted),
                                 " (the problem is on ", problem.device, ")"),
                  detail::concat("backend ", tune::to_string(tuner.backend())));
  }
}

CacheVerdict ask_cache(const tune::Autotuner& tuner, const tune::Problem& tuned,
                       const LinearProblem& problem) {
  CacheVerdict verdict;
  verdict.selection = tuner.lookup(tuned, problem.m);
  if (!verdict.tuned() || verdict.selection.tactic == nullptr) return verdict;
  const auto* native = std::any_cast<const LinearTactic*>(&verdict.selection.tactic->native);
  if (native == nullptr) {
    fail(ErrorCode::kInternal, "autotuner tactic ", verdict.selection.tactic->id(),
         " of op block_fp8_linear does not name a linear tactic");
  }
  verdict.tactic = *native;
  if (verdict.tactic != nullptr) verdict.support = verdict.tactic->supports(problem);
  return verdict;
}

// One line on what the cache said, for Explanation::tuner_note.
std::string describe_verdict(const CacheVerdict& verdict, const tune::Autotuner& tuner,
                             const LinearProblem& problem) {
  std::string bucket = "token bucket ?";
  if (const tune::OpSpec* op =
          tuner.registry().find_op(linear::kBlockFp8LinearOp, tuner.backend())) {
    bucket =
        detail::concat("token bucket ", op->buckets[tune::bucket_index(op->buckets, problem.m)]);
  }
  const std::string file = tuner.cache_path().empty()
                               ? std::string(" (autotune mode off)")
                               : " (" + std::string(tune::to_string(tuner.mode())) +
                                     " mode, file " + tuner.cache_path() + ")";
  const std::string id =
      verdict.selection.tactic != nullptr ? verdict.selection.tactic->id() : std::string("?");
  switch (verdict.selection.source) {
    case tune::SelectionSource::kTuned:
      if (verdict.tactic == nullptr) {
        return "cache entry for " + bucket + ": auto (the dispatch rule was fastest)" + file;
      }
      if (!verdict.support) {
        return "cache entry for " + bucket + ": " + id + " (" + verdict.tactic->name() +
               "), which does not support this problem (" + verdict.support.reason +
               "): the dispatch rule decides" + file;
      }
      return "cache entry for " + bucket + ": " + id + " (" + verdict.tactic->name() + ")" + file;
    case tune::SelectionSource::kDefault:
      return "no cache entry for this problem at " + bucket + ": the dispatch rule decides" + file;
    case tune::SelectionSource::kSkipped:
      return "block_fp8_linear is in the skip list (MXQ_AUTOTUNE_SKIP_OPS): the dispatch rule "
             "decides";
    case tune::SelectionSource::kOutOfRange:
      return "the cache entry for " + bucket +
             " is not valid for M = " + std::to_string(problem.m) + ": the dispatch rule decides" +
             file;
    case tune::SelectionSource::kUnknownOp:
      return "the tuner has no block_fp8_linear tactics for " +
             std::string(tune::to_string(tuner.backend())) + ": the dispatch rule decides";
  }
  return "?";
}

}  // namespace

Explanation explain(const LinearProblem& problem, std::string_view requested,
                    const tune::Autotuner* tuner) {
  std::optional<CacheVerdict> verdict;
  if (tuner != nullptr && requested == "auto") {
    check_tuner_backend(*tuner, problem);
    verdict = ask_cache(*tuner, internal::tune_problem_of(problem), problem);
  }
  const LinearTactic* cached = verdict && verdict->use_tactic() ? verdict->tactic : nullptr;
  Explanation result;
  result.problem = problem;
  result.requested = std::string(requested);
  const auto& tactics = linear_tactics();

  std::vector<Support> support;
  support.reserve(tactics.size());
  for (const auto& tactic : tactics) support.push_back(tactic->supports(problem));

  const RuleChoice rule = choose_by_rule(problem, requested, /*explained=*/true);
  result.chosen = rule.tactic;
  if (rule.tactic != nullptr) {
    result.chosen_because = std::string(to_string(rule.kind)) + " path; " + rule.because;
  }

  // The autotuner's cached tactic overrides the rules' choice.
  const LinearTactic* rule_choice = rule.tactic;
  if (cached != nullptr) {
    result.chosen = cached;
    result.chosen_because = "autotuner cache (" + verdict->selection.tactic->id() + ")";
  }
  if (tuner != nullptr) {
    result.from_tuner = verdict && verdict->decided();
    result.tuner_note = verdict ? describe_verdict(*verdict, *tuner, problem)
                                : "not consulted: tactic '" + std::string(requested) +
                                      "' was requested (only auto consults it)";
  }

  for (std::size_t i = 0; i < tactics.size(); ++i) {
    const LinearTactic& tactic = *tactics[i];
    if (&tactic == result.chosen) continue;
    std::string reason;
    if (cached != nullptr && support[i]) {
      reason = &tactic == rule_choice
                   ? "the dispatch rule's choice (" + rule.because +
                         "), but the autotuner's cache chose " + cached->name()
                   : "supported, but the autotuner's cache chose " + cached->name();
    } else if (!support[i]) {
      reason = support[i].reason;
    } else if (!requested_includes(requested, tactic)) {
      reason = "supported, but not requested (--tactic " + std::string(requested) + ")";
    } else if (result.chosen != nullptr && result.chosen->kind() != tactic.kind()) {
      reason = "supported, but a " + std::string(to_string(result.chosen->kind())) +
               " tactic is preferred";
    } else {
      reason = "supported, but " + (result.chosen ? result.chosen->name() : std::string("?")) +
               " is preferred: " + rule.because;
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
  if (!tuner_note.empty()) out << "autotune:  " << tuner_note << "\n";
  out << "not chosen:\n";
  for (const TacticRejection& rejection : rejected) {
    out << "  " << rejection.tactic << ": " << rejection.reason << "\n";
  }
  return out.str();
}

const LinearTactic& select_tactic(const LinearProblem& problem, std::string_view requested,
                                  const tune::Autotuner* tuner, const tune::Problem* tune_problem,
                                  bool* from_tuner) {
  if (from_tuner != nullptr) *from_tuner = false;
  if (tuner != nullptr && requested == "auto") {
    check_tuner_backend(*tuner, problem);
    std::optional<tune::Problem> built;
    if (tune_problem == nullptr) {
      built = internal::tune_problem_of(problem);
      tune_problem = &*built;
    } else if (!internal::tune_problem_matches(*tune_problem, problem)) {
      fail_argument(ErrorCode::kInvalidArgument, "tune_problem",
                    "the block_fp8_linear problem of " + problem.str(), tune_problem->canonical());
    }
    const CacheVerdict verdict = ask_cache(*tuner, *tune_problem, problem);
    if (from_tuner != nullptr) *from_tuner = verdict.decided();
    if (verdict.use_tactic()) return *verdict.tactic;
  }
  if (!is_kind_request(requested) && find_tactic(requested) == nullptr) {
    std::ostringstream known;
    known << "auto, fast, fallback, reference";
    for (const auto& tactic : linear_tactics()) known << ", " << tactic->name();
    fail_argument(ErrorCode::kInvalidArgument, "tactic", detail::concat("one of: ", known.str()),
                  detail::concat('\'', requested, '\''));
  }
  const RuleChoice rule = choose_by_rule(problem, requested, /*explained=*/false);
  if (rule.tactic != nullptr) return *rule.tactic;
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
