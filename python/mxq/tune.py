"""``mxq.autotune()``: the C++ autotuner (a cache file of tactic decisions) as a context manager.

    with mxq.autotune(cache="tactics.json", mode="tune", phase="target"):
        model(x)            # mxq ops tune the problems they meet and run the winners

Inside the block the innermost context's tuner is *current* (a context variable, so threads and
asyncio tasks each see their own). mxq's ops consult it: in ``"tune"`` / ``"fresh"`` mode a
(problem, token bucket) the cache lacks is measured on synthetic data of the same shape, saved
to the cache file at once, and the winner serves from then on; in ``"load"`` mode the cache's
decisions serve and nothing is measured; ``"off"`` serves the defaults. Leaving the block closes
the tuning pass (saves, also after an exception). Outside any block the ops use their own
dispatch (``tactic="auto"``).

Which ops consult it: the block-FP8 linear (``BlockFp8Linear.forward``,
``torch.ops.mxq.block_fp8_linear``) with ``tactic="auto"`` on the tuner's device (CPU tactics
for ``device="cpu"``, CUDA tactics for ``device="cuda[:N]"``), and the MoE layer on a GPU
(``MoELayer.forward`` with CUDA input, ``device="cuda[:N]"``:
its GEMM variant per rank and token count; on the CPU (``MoELayer.forward`` with host input,
``device="cpu"``) its expert tiling.
"""

from __future__ import annotations

import contextvars
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _mxq
from ._errors import InvalidArgumentError

__all__ = ["Autotune", "autotune", "current"]

_MODES = ("off", "load", "tune", "fresh")
_CURRENT: contextvars.ContextVar[Tuple["Autotune", ...]] = contextvars.ContextVar(
    "mxq_autotune", default=())


class Autotune:
    """One autotuner and, in tune/fresh mode, one tuning pass (``phase``). See :func:`autotune`."""

    def __init__(self, cache: Optional[str] = None, mode: str = "tune", phase: str = "target", *,
                 device: str = "cpu", budget_seconds: Optional[float] = None,
                 skip_ops: Optional[Sequence[str]] = None) -> None:
        if mode not in _MODES:
            raise InvalidArgumentError(
                f"mode: expected one of {', '.join(_MODES)}, found {mode!r}")
        if device != "cpu" and not device.startswith("cuda"):
            raise InvalidArgumentError(
                f"device: expected \"cpu\" or \"cuda[:N]\", found {device!r}")
        self.mode = mode
        self.phase = phase
        self.device = device
        self._backend, _, index = device.partition(":")
        if index and not index.isdigit():
            raise InvalidArgumentError(
                f"device: expected \"cpu\" or \"cuda[:N]\", found {device!r}")
        self._index = int(index or 0)
        if isinstance(skip_ops, str):  # one op name, not its characters
            skip_ops = [skip_ops]
        self._tuner = _mxq.Autotuner(mode, None if cache is None else str(cache), self._backend,
                                     self._index, budget_seconds,
                                     None if skip_ops is None else list(skip_ops))
        self._session: Optional[Any] = None
        self._problems: Dict[Tuple[Any, ...], Any] = {}
        self._visited: set = set()
        self._records: List[Dict[str, Any]] = []
        self._token: Optional[contextvars.Token] = None

    # --- context manager ---
    def __enter__(self) -> "Autotune":
        if self._token is not None:
            raise InvalidArgumentError(
                "mxq.autotune: this context is already active (make a new one)")
        if self.mode in ("tune", "fresh"):
            self._session = _mxq.TuningSession(self._tuner, self.phase)
        self._token = _CURRENT.set(_CURRENT.get() + (self,))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
        session, self._session = self._session, None
        if session is None:
            return
        self._records = session.records
        try:
            session.close()  # saves and publishes
        except Exception as error:  # noqa: BLE001
            if exc_type is None:
                raise
            warnings.warn(f"mxq.autotune: saving the tuning pass failed: {error}", RuntimeWarning)

    # --- facts ---
    @property
    def cache_path(self) -> str:
        """The cache file read and written (a new runs/ file in fresh mode; "" when off)."""
        return self._tuner.cache_path

    @property
    def records(self) -> List[Dict[str, Any]]:
        """What the tuning pass did, one dict per (problem, bucket): status ("tuned", "hit",
        "skipped", ...), tactic, reason, timings and every candidate's result."""
        return self._session.records if self._session is not None else list(self._records)

    def decisions(self) -> List[Dict[str, Any]]:
        """The decisions the tuner serves: problem, bucket, tactic, pass, median_us."""
        return self._tuner.decisions()

    @property
    def warnings(self) -> List[str]:
        return self._tuner.warnings

    # --- what the ops call ---
    def serves(self, device: str, index: int = 0) -> bool:
        """Whether this tuner's tactics are for ``device`` ("cpu" or "cuda") ``index``."""
        return device == self._backend and (device == "cpu" or index == self._index)

    def tune(self, problem: Any, tokens: int) -> None:
        """In tune/fresh mode, measures what the cache lacks for ``problem`` at ``tokens``
        (its token bucket) and publishes a new winner at once; otherwise nothing."""
        if self._session is None or tokens < 1:
            return
        key = (problem.canonical, tokens)
        if key in self._visited:
            return
        records = self._session.tune_tokens(problem, [tokens])
        self._visited.add(key)
        if any(r["status"] == "tuned" for r in records):
            self._tuner.publish()  # serve the new winner now, not only when the pass ends

    def linear_tuner(self, device: str, index: int, n: int, k: int, block: Tuple[int, int],
                     activation_scales: str, out_dtype: str, tokens: int) -> Optional[Any]:
        """The autotuner the block-FP8 linear op should consult for this call (after tuning its
        problem in tune mode), or None when this tuner is not for ``device``."""
        found = self.linear_tuning(device, index, n, k, block, activation_scales, out_dtype,
                                   tokens)
        return found[0] if found is not None else None

    def linear_tuning(self, device: str, index: int, n: int, k: int, block: Tuple[int, int],
                      activation_scales: str, out_dtype: str,
                      tokens: int) -> Optional[Tuple[Any, Any]]:
        """As linear_tuner, with the call's block_fp8_linear problem (built once per shape), which
        the op passes along so that consulting the cache allocates nothing."""
        if not self.serves(device, index):
            return None
        key = (n, k, tuple(block), activation_scales, out_dtype)
        problem = self._problems.get(key)
        if problem is None:
            problem = _mxq.TuneProblem.block_fp8_linear(n, k, tuple(block), activation_scales,
                                                        out_dtype)
            self._problems[key] = problem
        self.tune(problem, tokens)
        return self._tuner, problem

    def moe_cpu_tuner(self, core: Any, num_ranks: int, tokens: int) -> Optional[Any]:
        """The autotuner the CPU MoE forward should consult (each rank's moe_expert_gemm
        problem tuned first in tune mode), or None when this tuner is not for the CPU."""
        if not self.serves("cpu"):
            return None
        for rank in range(num_ranks):
            self.tune(core.tune_problem(rank), tokens)
        return self._tuner

    def __repr__(self) -> str:
        return (f"Autotune(mode={self.mode!r}, phase={self.phase!r}, device={self.device!r}, "
                f"cache={self.cache_path!r})")


def autotune(cache: Optional[str] = None, mode: str = "tune", phase: str = "target", *,
             device: str = "cpu", budget_seconds: Optional[float] = None,
             skip_ops: Optional[Sequence[str]] = None) -> Autotune:
    """A context manager making an autotuner current for mxq's ops (module docstring).

    ``cache``: the cache file (JSON); None = the default file under the mxq cache directory.
    ``mode``: "tune" (serve the cache, measure what it lacks), "load" (serve the cache only),
    "fresh" (measure everything into a new file next to the cache), "off" (defaults).
    ``phase``: the tuning pass's name ("target", "draft", ...); passes merge in one cache, none
    erases another's decisions. ``device``: whose tactics, "cpu" or "cuda[:N]" (measured on that
    GPU). ``budget_seconds`` bounds the pass; ``skip_ops`` always run their
    default. Unset options come from MXQ_AUTOTUNE_* (docs/autotune.md).
    """
    return Autotune(cache, mode, phase, device=device, budget_seconds=budget_seconds,
                    skip_ops=skip_ops)


def current() -> Optional[Autotune]:
    """The innermost active :func:`autotune` context, or None."""
    stack = _CURRENT.get()
    return stack[-1] if stack else None
