"""The timing method the Python benches share (bench/moe_grouped_mm.py, linear_deepgemm.py): a
CUDA graph per input set and side, the sides replayed alternately so clock drift hits each,
CUDA events around each replay, the median per side."""

from __future__ import annotations

import statistics
from typing import Callable

import torch

WARM_UP_ROUNDS = 3


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph, after two calls off the capture stream (torch's recipe;
    libraries that compile or allocate on first use do it there)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def median_us(sides: dict[str, list[torch.cuda.CUDAGraph]], repeats: int) -> dict[str, float]:
    """Each side's median replay time in microseconds: round i replays graph i % sets of every
    side in turn; WARM_UP_ROUNDS rounds first, untimed."""
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(repeats + WARM_UP_ROUNDS)] for name in sides}
    for i in range(repeats + WARM_UP_ROUNDS):
        for name, graphs in sides.items():
            start, end = events[name][i]
            start.record()
            graphs[i % len(graphs)].replay()
            end.record()
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) * 1e3
                                    for s, e in events[name][WARM_UP_ROUNDS:])
            for name in sides}
