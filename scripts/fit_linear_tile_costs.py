#!/usr/bin/env python3
"""Fits the block-FP8 linear dispatch's tile cost model to `mxq bench linear --json` runs.

The dispatch (src/linear/dispatch.cpp, `kTileCosts`) picks the fast path's wgmma tile by the least
modeled time, waves x (setup_us + us_per_k_1000 * K / split / 1000), with waves = ceil(units /
slots): a unit is a tile (a cluster's tiles along N for the multicast tiles), tiles = ceil(M / bm)
* ceil(N / bn), slots = SMs / blocks per cluster; a split-K tile's blocks each stream K / split. This script fits (setup_us, us_per_k_1000) of every timed
`cuda.sm90_wgmma.*` tile on 128x128 blocks, by least squares on the relative error (each point
weighted by 1 / its time, so the small problems count as much as the large ones), then says how
the fitted rule does: at how many points its choice is the fastest tile and how far it is from the
fastest elsewhere. It prints the C++ table to paste, or with --json the numbers.

  python3 scripts/fit_linear_tile_costs.py docs/perf-log/data/linear-deepseek-v3-full-2026-12-06-h100.json
  python3 scripts/fit_linear_tile_costs.py --tiles m256n128,m128n128,... <run.json>  (the rule's tiles only)

(Give it runs of every tile; docs/perf-log/data also holds A/B extracts, Nsight summaries and runs
of tiles measured and removed, which it refuses with an error naming the file or tile.)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

FAST_PREFIX = "cuda.sm90_wgmma."
# Up to this M (one 64-row tile) the dispatch does not use the model (kDecodeMaxM in
# dispatch.cpp): it takes the widest of these 64-row tiles whose waves are within
# DECODE_WAVE_SLACK as full as the fullest one's.
DECODE_MAX_M = 64
DECODE_TILES = ["m64n128_overlap", "m64n64", "m64n32_overlap", "m64n16"]  # kDecodeTiles
DECODE_WAVE_SLACK = 0.05
TILE = re.compile(r"\.m(\d+)n(\d+)(?:_overlap)?(?:_x(\d+))?(?:_splitk(\d+))?$")


def _tile_match(name: str) -> re.Match:
    match = TILE.search(name)
    if match is None:
        raise ValueError(f"{name}: not a wgmma tile name "
                         "(expected ...m<bm>n<bn>[_overlap][_x<cluster>][_splitk<split>])")
    return match


def tile_of(name: str) -> Tuple[int, int]:
    """(bm, bn) of a fast tactic's name, e.g. cuda.sm90_wgmma.m64n128_overlap -> (64, 128)."""
    match = _tile_match(name)
    return int(match.group(1)), int(match.group(2))


def cluster_of(name: str) -> int:
    """Blocks per cluster of a fast tactic (cuda.sm90_wgmma.m256n128_x2 -> 2; 1 without _x)."""
    match = _tile_match(name)
    return int(match.group(3)) if match.group(3) else 1


def split_of(name: str) -> int:
    """Blocks splitting K per tile (cuda.sm90_wgmma.m64n128_overlap_splitk4 -> 4; 1 without)."""
    match = _tile_match(name)
    return int(match.group(4)) if match.group(4) else 1


def waves(m: int, n: int, bm: int, bn: int, sms: int, cluster: int = 1, split: int = 1) -> int:
    """Waves of work units: a cluster's `cluster` tiles along N (or one tile split over `split`
    blocks) on sms / (cluster * split) slots."""
    units = -(-m // bm) * -(-n // (bn * cluster))
    return -(-units // max(1, sms // (cluster * split)))


def waves_of(name: str, p: dict) -> int:
    bm, bn = tile_of(name)
    return waves(p["m"], p["n"], bm, bn, p["sms"], cluster_of(name), split_of(name))


def load_points(paths: List[Path]) -> List[dict]:
    """Every (m, n, k, sm_count, {tactic: us}) of the fast tiles on 128x128 blocks."""
    points = []
    for path in paths:
        run = json.loads(path.read_text())
        if "points" not in run or "sm_count" not in run:
            raise ValueError(f"{path}: not `mxq bench linear --json` output (no points/sm_count)")
        for point in run["points"]:
            us: Dict[str, float] = {}
            for timing in point["timings"]:
                name = timing["name"].removesuffix(" *")
                # A tail split (..._tail_<tile>) is two launches of tiles fitted on their own.
                if timing.get("blocks") == "128x128" and name.startswith(FAST_PREFIX) \
                        and "_tail_" not in name and timing.get("us") is not None:
                    us[name] = float(timing["us"])
            if us:
                points.append({"m": point["m"], "n": point["n"], "k": point["k"],
                               "sms": run["sm_count"], "us": us})
    if not points:
        raise ValueError("no fast-path timings on 128x128 blocks in the given files")
    return points


def fit(points: List[dict], tiles: Optional[List[str]] = None) -> Dict[str, Tuple[float, float]]:
    """(setup_us, us_per_k_1000) per tactic (those of `tiles`, e.g. "m256n128", when given): least
    squares of (model - us) / us over its points. The model is linear in both:
    us = w * setup + w * k / 1000 * per_k, w = waves."""
    costs = {}
    names = sorted({name for p in points for name in p["us"]})
    if tiles is not None:
        missing = [t for t in tiles if FAST_PREFIX + t not in names]
        if missing:
            raise ValueError(f"--tiles: not timed in the given files: {', '.join(missing)}")
        names = [name for name in names if name[len(FAST_PREFIX):] in tiles]
    for name in names:
        # Normal equations of the 2-parameter weighted least squares.
        s11 = s12 = s22 = r1 = r2 = 0.0
        for p in points:
            if name not in p["us"]:
                continue
            w = waves_of(name, p)
            x1, x2 = w / p["us"][name], w * p["k"] / split_of(name) / 1000.0 / p["us"][name]
            s11, s12, s22 = s11 + x1 * x1, s12 + x1 * x2, s22 + x2 * x2
            r1, r2 = r1 + x1, r2 + x2  # the target (us / us) is 1
        det = s11 * s22 - s12 * s12
        if det <= 1e-9 * s11 * s22:  # one K only: the two columns are proportional
            raise ValueError(f"{name}: its points cannot separate setup from per-K cost "
                             "(time it at two K values at least)")
        costs[name] = ((r1 * s22 - r2 * s12) / det, (r2 * s11 - r1 * s12) / det)
    return costs


def modeled_us(cost: Tuple[float, float], name: str, p: dict) -> float:
    return waves_of(name, p) * (cost[0] + cost[1] * p["k"] / split_of(name) / 1000.0)


def wave_fill(n: int, bn: int, sms: int) -> float:
    """The fraction of the waves' tile slots that ceil(n / bn) 64-row tiles fill."""
    tiles = -(-n // bn)
    return tiles / (-(-tiles // sms) * sms)


def decode_choice(names: List[str], p: dict) -> str:
    """The dispatch's tile at M <= DECODE_MAX_M among `names`; '' when none is a decode tile."""
    usable = [FAST_PREFIX + tile for tile in DECODE_TILES if FAST_PREFIX + tile in names]
    if not usable:
        return ""
    fill = {name: wave_fill(p["n"], tile_of(name)[1], p["sms"]) for name in usable}
    fullest = max(fill.values())
    return next(name for name in usable if fill[name] >= fullest - DECODE_WAVE_SLACK)


def rule_choice(costs: Dict[str, Tuple[float, float]], p: dict) -> str:
    """The dispatch's tile at point p: the decode rule up to DECODE_MAX_M, else the least modeled
    time."""
    if p["m"] <= DECODE_MAX_M:
        decode = decode_choice(list(p["us"]), p)  # kDecodeTiles: not from the cost table
        if decode:
            return decode
    return min(costs, key=lambda name: modeled_us(costs[name], name, p))


def evaluate(points: List[dict], costs: Dict[str, Tuple[float, float]]) -> dict:
    """The fitted rule at every point that timed every fitted tile: how often it picks the fastest,
    its worst ratio to the fastest (with where), and each point's choice and ratio."""
    fastest_picks, compared, worst, worst_at = 0, 0, 1.0, ""
    errors = []
    choices = []
    for p in points:
        for name, us in p["us"].items():
            if name not in costs:
                continue
            errors.append((modeled_us(costs[name], name, p) - us) / us)
        if not all(name in p["us"] for name in costs):
            continue
        chosen = rule_choice(costs, p)
        best = min(p["us"].values())
        ratio = p["us"][chosen] / best
        compared += 1
        fastest_picks += ratio == 1.0
        choices.append({"m": p["m"], "n": p["n"], "k": p["k"], "chosen": chosen, "ratio": ratio})
        if ratio > worst:
            worst, worst_at = ratio, f"M={p['m']} N={p['n']} K={p['k']}: {chosen}"
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    return {"points": compared, "fastest": fastest_picks, "worst_ratio": worst,
            "worst_at": worst_at, "rms_relative_error": rms, "choices": choices}


def cpp_table(costs: Dict[str, Tuple[float, float]]) -> str:
    rows = []
    for name, (setup, per_k) in sorted(costs.items(), key=lambda kv: -kv[1][1]):
        bm, bn = tile_of(name)
        rows.append(f'    {{"{name}", {bm}, {bn}, {cluster_of(name)}, {split_of(name)}, {setup:.2f}, '
                    f'{per_k:.2f}}},')
    return (f"constexpr std::array<TileCost, {len(rows)}> kTileCosts{{{{\n" + "\n".join(rows)
            + "\n}};")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="`mxq bench linear --json` output")
    parser.add_argument("--json", action="store_true", help="print the fit and its evaluation "
                                                            "as JSON")
    parser.add_argument("--tiles", help="fit and evaluate the rule with only these tiles (comma "
                        "list, e.g. m256n128,m128n128,m64n64: the tiles of dispatch.cpp's "
                        "kTileCosts); the fastest of every timed tile stays the yardstick")
    args = parser.parse_args(argv)
    try:
        points = load_points(args.files)
        costs = fit(points, args.tiles.split(",") if args.tiles else None)
    except (OSError, ValueError, KeyError) as error:
        print(f"fit_linear_tile_costs: {error}", file=sys.stderr)
        return 2
    quality = evaluate(points, costs)
    if args.json:
        print(json.dumps({"costs": {name: {"setup_us": c[0], "us_per_k_1000": c[1]}
                                    for name, c in costs.items()}, **quality}, indent=2))
        return 0
    print(cpp_table(costs))
    print(f"// {quality['points']} points timed every tile: the fitted rule picks the fastest at "
          f"{quality['fastest']}, worst {quality['worst_ratio']:.3f}x the fastest "
          f"({quality['worst_at']}); model error {100 * quality['rms_relative_error']:.1f}% RMS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
