#!/usr/bin/env python3
"""Prints the per-block timeline that `mxq bench moe --block-trace FILE` writes.

Needs a build configured with -DMXQ_MOE_BLOCK_TRACE=ON (include/mxq/moe/cuda_moe_trace.h says
what each point is). For every token count and replay: each kernel's blocks, the first and last
time (µs from the routing kernel's first block) each point was reached, and for the GEMMs how
long a block took (released -> end, its weight stream and its epilogue) and how many blocks ran
at each microsecond. Plain Python, no dependencies.

    python3 bench/block_trace_summary.py trace.json [--replays N]
"""

import argparse
import json
import sys

POINTS = ("start", "released", "mid", "end")


def percentile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def summarize_replay(replay):
    routing = replay["routing"]
    starts = [b[0] for b in routing if b[0] > 0]
    if not starts:
        print("  (no routing block recorded)")
        return
    t0 = min(starts)

    def us(ns):
        return (ns - t0) / 1000.0

    for kernel in ("routing", "gemm1", "gemm2", "combine"):
        blocks = [b for b in replay.get(kernel, []) if b[0] > 0]
        line = f"  {kernel:8s} {len(blocks):5d} blocks"
        for i, name in enumerate(POINTS):
            reached = [b[i] for b in blocks if b[i] > 0]
            if reached:
                line += f" | {name} {us(min(reached)):6.2f}..{us(max(reached)):6.2f}"
        print(line)
        if kernel not in ("gemm1", "gemm2"):
            continue
        done = [b for b in blocks if b[3] > 0 and b[1] > 0]
        if not done:
            continue
        life = [(b[3] - b[1]) / 1000.0 for b in done]
        stream = [(b[2] - b[1]) / 1000.0 for b in done if b[2] > 0]
        epilogue = [(b[3] - b[2]) / 1000.0 for b in done if b[2] > 0]
        print(
            f"           released->end p10/p50/p90/max {percentile(life, 0.1):.2f} "
            f"{percentile(life, 0.5):.2f} {percentile(life, 0.9):.2f} {max(life):.2f} us"
            f" | stream p50 {percentile(stream, 0.5):.2f} | epilogue p50 "
            f"{percentile(epilogue, 0.5):.2f}"
        )
        first = int(min(us(b[1]) for b in done))
        last = int(max(us(b[3]) for b in done)) + 1
        running = [
            sum(1 for b in done if us(b[1]) <= t < us(b[3])) for t in range(first, last)
        ]
        print(f"           running at each us from {first}: {' '.join(map(str, running))}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="the JSON file of mxq bench moe --block-trace")
    parser.add_argument("--replays", type=int, default=2, help="replays to print per token count")
    args = parser.parse_args()
    try:
        with open(args.trace, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"block_trace_summary: cannot read {args.trace}: {e}")
    print(f"{trace['preset']}: {trace['points_format']}")
    for point in trace["points"]:
        for i, replay in enumerate(point["replays"][: args.replays]):
            print(f"T={point['tokens']} ({point['resolved_variant']}), replay {i}:")
            summarize_replay(replay)


if __name__ == "__main__":
    main()
