#!/usr/bin/env python3
"""PNG charts of the benches' JSON in docs/perf-data/, next to each file (`<stem>.png`).

    python3 scripts/perf_plots.py                   the newest JSON of each kind docs/PERF.md uses
    python3 scripts/perf_plots.py FILE.json ...     these files

MoE (`mxq bench moe --json`): effective TB/s on the touched weights and TFLOPS against T (log
x), with the copy ceiling measured in the same run, the read floor (the touched bytes over the
floor's time) and the bf16 baseline. Linear (`mxq bench linear --json`): TFLOPS against M (log x),
one panel per (N, K): the dispatch's choice, the fastest mxq tactic and cuBLASLt.

Needs matplotlib (`pip install matplotlib`); run scripts/perf_page.py afterwards so the page
links the charts. Exit status: 0 done, 2 an error.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perf_page  # noqa: E402  (the loader and the JSON field mapping are shared)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _log2_ticks(ax, values: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([str(v) for v in values])
    ax.minorticks_off()


def _save(fig, path: Path) -> None:
    # No timestamp or version in the PNG's metadata, so a re-run on the same data gives the same
    # file with the same matplotlib.
    fig.savefig(path, dpi=110, metadata={"Software": None})


def plot_moe(run: perf_page.Run, out: Path) -> Path:
    plt = _pyplot()
    d = run.data
    pts = [p for p in d["points"] if isinstance(p.get("mxq"), dict)]
    t = [p["tokens"] for p in pts]
    m = [p["mxq"] for p in pts]
    tb = [x["touched_weight_bytes"] for x in m]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    card = run.meta.get("gpu") or d.get("gpu") or "GPU not recorded"
    fig.suptitle(f"MXFP4 MoE, {d.get('preset')} layer, TP={d.get('tp')}: {card}, {run.date}")

    ax1.plot(t, [x["effective_gbps"] / 1e3 for x in m], "o-", label="mxq (one launch)")
    in_graph = [(ti, b / (x["layer_in_graph_us"] * 1e-6) / 1e12) for ti, b, x in zip(t, tb, m)
                if x.get("layer_in_graph_us")]
    if in_graph:
        ax1.plot(*zip(*in_graph), "o--", label="mxq (in a graph of 8)")
    floor = [(p["tokens"], b / (p["read_floor"]["total_us"] * 1e-6) / 1e12)
             for p, b in zip(pts, tb) if isinstance(p.get("read_floor"), dict)]
    if floor:
        ax1.plot(*zip(*floor), "s:", color="gray", label="read floor (same bytes, floor's time)")
    if d.get("copy_ceiling_gbps"):
        ax1.axhline(d["copy_ceiling_gbps"] / 1e3, color="black", lw=1,
                    label=f"copy ceiling (read + write), same run "
                          f"({d['copy_ceiling_gbps'] / 1e3:.2f} TB/s)")
    base = [(p["tokens"], b / (p["baseline_bf16"]["total_us"] * 1e-6) / 1e12)
            for p, b in zip(pts, tb) if isinstance(p.get("baseline_bf16"), dict)]
    if base:
        ax1.plot(*zip(*base), "^-", color="tab:red", label="bf16 baseline (same bytes)")
    ax1.set_ylabel("TB/s on the touched MXFP4 weights")
    ax1.set_xlabel("tokens T")
    _log2_ticks(ax1, t)
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)

    ax2.plot(t, [x["tflops"] for x in m], "o-", label="mxq (one launch)")
    floor_tf = [(p["tokens"], x["tflops"] * x["total_us"] / p["read_floor"]["total_us"])
                for p, x in zip(pts, m) if isinstance(p.get("read_floor"), dict)]
    if floor_tf:
        ax2.plot(*zip(*floor_tf), "s:", color="gray", label="at the read floor's time")
    base_tf = [(p["tokens"], p["baseline_bf16"]["tflops"]) for p in pts
               if isinstance(p.get("baseline_bf16"), dict)]
    if base_tf:
        ax2.plot(*zip(*base_tf), "^-", color="tab:red", label="bf16 baseline")
    ax2.set_yscale("log")
    ax2.set_ylabel("TFLOPS (2·T·top_k·3·H·I per layer)")
    ax2.set_xlabel("tokens T")
    _log2_ticks(ax2, t)
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
    return out


def plot_linear(run: perf_page.Run, out: Path) -> Path:
    plt = _pyplot()
    d = run.data
    shapes: list[tuple[int, int]] = []
    for p in d["points"]:
        if (p["n"], p["k"]) not in shapes:
            shapes.append((p["n"], p["k"]))
    cols = min(3, len(shapes))
    rows = (len(shapes) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    card = run.meta.get("gpu") or d.get("gpu") or "GPU not recorded"
    fig.suptitle(f"Block-FP8 linear (128x128 weight blocks), {d.get('preset')}: {card}, "
                 f"{run.date}")
    for i, (n, k) in enumerate(shapes):
        ax = axes[i // cols][i % cols]
        pts = sorted((p for p in d["points"] if (p["n"], p["k"]) == (n, k)), key=lambda p: p["m"])
        ms = [p["m"] for p in pts]
        series: dict[str, list[tuple[int, float]]] = {"mxq (dispatch)": [], "mxq (fastest)": [],
                                                       "cuBLASLt": []}
        for p in pts:
            t = perf_page.linear_timings(p)
            for label, timing in (("mxq (dispatch)", t["default"].get("128x128")),
                                  ("mxq (fastest)", t["best"].get("128x128")),
                                  ("cuBLASLt", t["cublas"])):
                if timing is not None:
                    series[label].append((p["m"], timing["tflops"]))
        for label, style in (("mxq (dispatch)", "o-"), ("mxq (fastest)", "x:"),
                             ("cuBLASLt", "^-")):
            if series[label]:
                ax.plot(*zip(*series[label]), style, label=label)
        ax.set_title(f"N={n}, K={k}", fontsize=10)
        _log2_ticks(ax, ms)
        ax.set_xlabel("M")
        ax.set_ylabel("TFLOPS")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=8)
    for j in range(len(shapes), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
    return out


# docs/perf-log/data/ keeps runs of several cards: their names may end in the card (`-h100`).
DATED_TAGGED = re.compile(r"^(?P<prefix>.+)-(?P<date>\d{4}-\d{2}-\d{2})(-[a-z0-9]+)?\.json$")


def plot_file(path: Path) -> Path:
    m = DATED_TAGGED.match(path.name)
    if m is None:
        raise perf_page.PageError(f"{path}: expected a name <prefix>-<YYYY-MM-DD>[-<card>].json")
    run = perf_page.load_run(m.group("date"), path, ".")
    out = path.with_suffix(".png")
    if "experts" in run.data and "top_k" in run.data:
        return plot_moe(run, out)
    if all("timings" in p for p in run.data["points"]):
        return plot_linear(run, out)
    raise perf_page.PageError(f"{path}: neither `mxq bench moe` nor `mxq bench linear` JSON")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path,
                        help="bench JSON files (default: the newest of each kind in --data)")
    parser.add_argument("--data", type=Path, default=perf_page.DEFAULT_DATA,
                        help="default: docs/perf-data")
    args = parser.parse_args(argv)
    try:
        _pyplot()
    except ImportError:
        print("perf_plots.py: error: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    files = list(args.files)
    if not files:
        found = perf_page.data_files(args.data)
        prefixes = {b.prefix for b in perf_page.BLOCKS.values()}
        files = [found[p][-1][1] for p in sorted(prefixes) if p in found]
        if not files:
            print(f"perf_plots.py: no bench JSON in {args.data}: nothing to draw")
            return 0
    try:
        for f in files:
            print(f"perf_plots.py: wrote {plot_file(f)}")
    except (perf_page.PageError, KeyError, OSError) as e:
        print(f"perf_plots.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
