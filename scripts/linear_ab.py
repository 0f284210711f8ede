#!/usr/bin/env python3
"""Compares `mxq bench linear --json` runs of several builds of mxq (an A/B of a kernel change),
round by round, and writes the compact record docs/perf-log/data keeps of such a comparison.

    python3 scripts/linear_ab.py --build base=base_1.json,base_2.json --build new=new_1.json,new_2.json
        [--baseline base] [--blocks 64x64] [--tactic NAME ...] [--m M ...] [--json] [--out FILE
        --card TEXT --date YYYY-MM-DD --command TEXT --describe BUILD=TEXT ...]

Each build's runs are its rounds (run them interleaved with the other builds': the card's clock
and temperature drift between calls). A tactic's time at a point is the median of its rounds; its
ratio at a point is that time over the baseline build's; the table gives, per tactic and weight
block shape, the geometric mean of the ratios over the points both builds timed, their range and
the points counted (below 1: the build is faster). cuBLASLt and the dispatch's choice (the
tactic the bench marks with " *") are compared like the tactics: cuBLASLt's ratio says how much
the card itself drifted between the builds' rounds.

--out writes {"card", "date", "builds": {build: description}, "command", "us": {build: {"NxK
M=m": {tactic: [us of each round]}}}} with the 64x64-block timings under "<tactic> 64x64".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Tuple

CHOSEN_MARK = " *"
# A timing's key: (point "NxK M=m", tactic name, weight block shape "128x128" or "64x64").
Key = Tuple[str, str, str]


class InputError(Exception):
    """A file or argument that this script cannot use; the message says which and why."""


def point_name(point: dict) -> str:
    return f"{point['n']}x{point['k']} M={point['m']}"


def load_round(path: Path) -> Dict[Key, float]:
    """The timings of one bench run, by (point, tactic, blocks); the dispatch's choice also as
    "auto"."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: not readable as JSON ({error})") from error
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise InputError(f"{path}: not `mxq bench linear --json` output (no \"points\" list)")
    timings: Dict[Key, float] = {}
    for point in data["points"]:
        name = point_name(point)
        for timing in point.get("timings", []):
            tactic = timing["name"]
            blocks = timing.get("blocks", "128x128")
            if tactic.endswith(CHOSEN_MARK):
                tactic = tactic[: -len(CHOSEN_MARK)]
                timings[(name, "auto", blocks)] = timing["us"]
            timings[(name, tactic, blocks)] = timing["us"]
    if not timings:
        raise InputError(f"{path}: no timings")
    return timings


def load_build(paths: List[Path]) -> Dict[Key, List[float]]:
    """Every round's time of each (point, tactic, blocks), in the order of the files."""
    rounds: Dict[Key, List[float]] = {}
    for path in paths:
        for key, us in load_round(path).items():
            rounds.setdefault(key, []).append(us)
    return rounds


def point_m(point: str) -> int:
    """M of a point named by point_name."""
    return int(point.rsplit("M=", 1)[1])


def compare(builds: Dict[str, Dict[Key, List[float]]], baseline: str,
            blocks: str | None = None, tactics: List[str] | None = None,
            ms: List[int] | None = None) -> List[dict]:
    """Per other build, tactic and block shape: the geomean, min and max over the common points of
    median(build's rounds) / median(baseline's rounds), and how many points (only the points of
    M in `ms`, when given)."""
    rows = []
    base = builds[baseline]
    for build, rounds in builds.items():
        if build == baseline:
            continue
        ratios: Dict[Tuple[str, str], List[float]] = {}
        for key, times in rounds.items():
            point, tactic, key_blocks = key
            if blocks is not None and key_blocks != blocks:
                continue
            if tactics and tactic not in tactics:
                continue
            if ms and point_m(point) not in ms:
                continue
            if key not in base:
                continue  # a tactic the baseline has not (a new one) or a point it did not time
            ratios.setdefault((tactic, key_blocks), []).append(
                statistics.median(times) / statistics.median(base[key]))
        for (tactic, key_blocks), values in sorted(ratios.items()):
            rows.append({"build": build, "tactic": tactic, "blocks": key_blocks,
                         "geomean": math.exp(sum(math.log(v) for v in values) / len(values)),
                         "min": min(values), "max": max(values), "points": len(values)})
    return rows


def record(builds: Dict[str, Dict[Key, List[float]]], card: str, date: str, command: str,
           describe: Dict[str, str]) -> dict:
    """The compact record of the comparison (docs/perf-log/data)."""
    us: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    for build, rounds in builds.items():
        per_point: Dict[str, Dict[str, List[float]]] = {}
        for (point, tactic, blocks), times in sorted(rounds.items()):
            label = tactic if blocks == "128x128" else f"{tactic} {blocks}"
            per_point.setdefault(point, {})[label] = [round(t, 2) for t in times]
        us[build] = per_point
    return {"card": card, "date": date, "builds": {b: describe.get(b, b) for b in builds},
            "command": command, "us": us}


def parse_pairs(values: List[str], what: str) -> Dict[str, str]:
    pairs = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise InputError(f"{what}: expected NAME=VALUE, found '{value}'")
        if name in pairs:
            raise InputError(f"{what}: '{name}' given twice")
        pairs[name] = rest
    return pairs


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="append", default=[], metavar="NAME=RUN[,RUN...]",
                        help="a build and its runs (rounds), comma-separated; at least two builds")
    parser.add_argument("--baseline", help="the build the others are compared with (default: the "
                        "first --build)")
    parser.add_argument("--blocks", choices=["128x128", "64x64"],
                        help="only the timings on these weight blocks")
    parser.add_argument("--tactic", nargs="+", default=[],
                        help="only these tactics (exact names; auto = the dispatch's choice)")
    parser.add_argument("--m", nargs="+", type=int, default=[], metavar="M",
                        help="only the points of these M (e.g. the decode ones: --m 1 64 128)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--out", type=Path, help="write the compact record of the runs here")
    parser.add_argument("--card", default="", help="the GPU, for --out")
    parser.add_argument("--date", default="", help="the date of the runs, for --out")
    parser.add_argument("--command", default="", help="the bench command, for --out")
    parser.add_argument("--describe", action="append", default=[], metavar="BUILD=TEXT",
                        help="what a build is (commit, change), for --out")
    args = parser.parse_args(argv)
    try:
        runs = parse_pairs(args.build, "--build")
        if len(runs) < 2:
            raise InputError("--build: give at least two builds to compare")
        baseline = args.baseline or next(iter(runs))
        if baseline not in runs:
            raise InputError(f"--baseline: '{baseline}' is not one of the builds "
                             f"({', '.join(runs)})")
        builds = {name: load_build([Path(p) for p in files.split(",")])
                  for name, files in runs.items()}
        rows = compare(builds, baseline, args.blocks, args.tactic, args.m)
        if not rows:
            raise InputError("no tactic was timed at a common point by the baseline and another "
                             "build (check --blocks, --tactic and --m)")
        if args.out:
            args.out.write_text(json.dumps(
                record(builds, args.card, args.date, args.command,
                       parse_pairs(args.describe, "--describe")), indent=1) + "\n")
    except InputError as error:
        print(f"linear_ab.py: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"baseline": baseline, "rows": rows}, indent=1))
        return 0
    print(f"time / {baseline}'s (median of each build's rounds; geomean over the common points)")
    print(f"{'build':<8} {'tactic':<44} {'blocks':<8} {'geomean':>8} {'min':>6} {'max':>6} "
          f"{'points':>6}")
    for row in rows:
        print(f"{row['build']:<8} {row['tactic']:<44} {row['blocks']:<8} {row['geomean']:8.3f} "
              f"{row['min']:6.3f} {row['max']:6.3f} {row['points']:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
