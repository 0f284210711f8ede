"""mxq.MoELayer: an MXFP4 Mixture-of-Experts layer (gpt-oss / DeepSeek style), CPU reference.

The C++ ``MoeLayer`` holds *every* rank of a TP x EP grid in one object (rank id =
``ep_rank * tp_size + tp_rank``) and its forward pass sums the ranks, as a distributed run would
after its all-reduce. :meth:`MoELayer.from_checkpoint` therefore loads the whole simulated grid;
:meth:`MoELayer.rank` gives one rank's shard facts and weights. One rank per process: the
engine-facing op (below).

On a GPU, :meth:`MoELayer.forward` runs CUDA arrays (torch, CuPy, any DLPack exporter) on a copy
of the layer uploaded to that device (:meth:`MoELayer.cuda`), on the caller's stream.

An inference engine (one rank per process, its own tensors, CUDA graphs) uses the engine-facing
op instead: ``mxq.torch_ops.Mxfp4MoE`` / ``torch.ops.mxq.mxfp4_moe`` (docs/engines.md).
"""

from __future__ import annotations

import atexit
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from . import _device, _mxq
from ._errors import Error, InvalidArgumentError
from . import tune as _tune

ArrayLike = Any

__all__ = ["MoELayer", "MoERank", "MoEUpdate", "ForwardResult", "PARAMS"]

# Every live layer, weakly, so that the ones still alive when the interpreter exits can be
# released first (_release_layers_at_exit).
_LIVE_LAYERS: "weakref.WeakSet[MoELayer]" = weakref.WeakSet()


class _ReleasedCore:
    """Stands in for a layer's C++ core after _release_layers_at_exit."""

    def __getattr__(self, name: str) -> Any:
        raise InvalidArgumentError("mxq.MoELayer: released at interpreter exit (its C++ state and "
                                   "device copies were freed when the interpreter began to shut "
                                   "down)")


@atexit.register
def _release_layers_at_exit() -> None:
    """Frees the C++ state and device copies of every layer still alive when the interpreter
    exits, while CUDA and the extension are still up. A layer can outlive the program's last
    reference to it in a reference cycle that Python's collector cannot see through — with
    torch 2.11, the guards in torch.compile's per-code cache hold a compiled module, whose class
    holds that code, so a module holding a layer stays alive — and nanobind would then
    report the layer's C++ object as leaked. An exit handler registered before mxq was imported
    runs after this one: a layer it uses raises mxq.InvalidArgumentError."""
    for layer in list(_LIVE_LAYERS):
        layer._release()


PARAMS = ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias")


@dataclass(frozen=True)
class ForwardResult:
    """Everything one forward pass computed (arrays are float32 [T, H] unless noted)."""

    output: np.ndarray  # the rank sum rounded once to bf16 values (stored as float32)
    accumulator: np.ndarray  # the fp32 rank sum before that rounding
    magnitude: np.ndarray  # sum of |weight * y| over ranks and slots: the fp32 error scale
    expert_ids: np.ndarray  # int32 [T, top_k]; -1 for tokens whose input is not finite
    expert_weights: np.ndarray  # float32 [T, top_k]
    routing_seconds: float
    rank_seconds: List[float]
    total_seconds: float
    # Per rank: the moe_expert_gemm tiling that ran ("reference": the layer's own) and whether
    # the current mxq.autotune() cache chose it.
    rank_tactics: List[str]
    rank_tactics_from_cache: List[bool]


class MoERank:
    """Read-only view of one rank of the simulated grid (its shard and its weights)."""

    def __init__(self, layer: "MoELayer", rank_id: int) -> None:
        self._layer = layer
        self._rank_id = rank_id

    @property
    def rank_id(self) -> int:
        return self._rank_id

    @property
    def info(self) -> Dict[str, int]:
        """tp/ep rank and size, the channel and expert ranges held, I_rank and alignment."""
        return self._layer._core.rank_info(self._rank_id)

    @property
    def intermediate_size_per_partition_after_pad(self) -> int:
        return self.info["intermediate_size_per_partition_after_pad"]

    def param(self, name: str) -> np.ndarray:
        """A copy of parameter ``name`` (one of PARAMS) in the current layout."""
        return self._layer._core.rank_param(self._rank_id, name)

    def param_address(self, name: str) -> int:
        """Address of the parameter's storage (fixed across update sessions once prepared)."""
        return self._layer._core.rank_param_address(self._rank_id, name)

    def __repr__(self) -> str:
        i = self.info
        return (f"MoERank(tp {i['tp_rank']}/{i['tp_size']}, ep {i['ep_rank']}/{i['ep_size']}, "
                f"experts [{i['expert_begin']}, +{i['experts_local']}), "
                f"I_rank={i['intermediate_size_per_partition_after_pad']})")


class MoEUpdate:
    """A weight-update session (use as a context manager: ``with layer.update() as u``).

    Entering restores the checkpoint layout; :meth:`load` takes full checkpoint tensors (either
    layout's names, router included) in any order and number of calls; leaving prepares again
    with the previous alignment. A tensor that is unknown, of the wrong shape or dtype raises
    and changes nothing; the session still ends (tensors loaded before it stay loaded).
    """

    def __init__(self, layer: "MoELayer") -> None:
        self._layer = layer
        self._active = False

    def __enter__(self) -> "MoEUpdate":
        self._layer._core.begin_update()
        self._active = True
        return self

    def load(self, name: str, tensor: ArrayLike) -> None:
        """Load checkpoint tensor ``name`` (read without a copy; the layer copies its shard)."""
        if not self._active:
            raise InvalidArgumentError(
                "MoEUpdate.load: the session is not open (use `with layer.update()`)")
        self._layer._core.load(name, tensor)

    def __exit__(self, *exc: object) -> None:
        self._active = False
        try:
            self._layer._core.end_update()
        finally:
            self._layer._drop_device_copies()


class MoELayer:
    """One MXFP4 MoE layer over a simulated TP x EP grid (see the module docstring)."""

    def __init__(self, core: "_mxq.MoeLayer") -> None:
        self._core = core
        # CUDA device index -> (_mxq.MoeGpuLayer, the mxq.autotune() context it consults or None)
        self._device_copies: Dict[int, Any] = {}
        # Bumped (under _device_lock) after every change of the weights: an upload that raced a
        # change is not kept, so no copy of older weights outlives the change.
        self._weights_version = 0
        self._device_lock = threading.Lock()
        _LIVE_LAYERS.add(self)

    @classmethod
    def from_checkpoint(
        cls,
        path: str,
        layer: int = 0,
        tp_rank: Optional[int] = None,
        tp_size: int = 1,
        ep_rank: Optional[int] = None,
        ep_size: int = 1,
        align: Optional[int] = 128,
        *,
        intermediate_per_rank: int = 0,
        top_k: Optional[int] = None,
        activation: Optional[str] = None,
        activation_quant: Optional[str] = None,
    ) -> "MoELayer":
        """Load layer ``layer`` of a checkpoint (directory or .safetensors file) for all ranks.

        ``tp_size`` x ``ep_size`` ranks are simulated; each copies only its rows/columns of the
        memory-mapped tensors. ``align`` pads I_rank to a multiple of it (``prepare``); None or 0
        keeps the checkpoint layout. ``tp_rank`` / ``ep_rank`` are accepted for the future
        one-rank-per-process loader and must be None now (use :meth:`rank`).
        ``activation_quant``: ``"bf16"`` (W4A16, the default) or ``"fp8_g128"`` (W4A8: each GEMM
        input row quantized to E4M3 in groups of 128, on the CPU and on CUDA; see docs/moe.md).
        """
        if tp_rank is not None or ep_rank is not None:
            raise NotImplementedError(
                "tp_rank/ep_rank: loading one rank per process needs mxq's distributed runtime, "
                "which is not available yet; from_checkpoint loads every rank of the "
                f"tp_size x ep_size grid: use layer.rank(tp_rank, ep_rank) for one rank")
        # Every size (tp_size, ep_size, intermediate_per_rank, align) is checked against the
        # layer and this machine's memory before anything is allocated (docs/moe.md).
        core = _mxq.MoeLayer.from_checkpoint(
            str(path), layer, tp_size, ep_size, intermediate_per_rank, top_k, activation,
            activation_quant, align or 0)
        result = cls(core)
        if align:
            result.prepare(align)
        return result

    # --- facts (read-only) ---
    @property
    def config(self) -> Dict[str, Any]:
        """hidden_size, intermediate_size, num_experts, top_k, activation, has_bias, ..."""
        return self._core.config

    @property
    def layer_index(self) -> int:
        return self._core.layer_index

    @property
    def tp_size(self) -> int:
        return self._core.tp_size

    @property
    def ep_size(self) -> int:
        return self._core.ep_size

    @property
    def num_ranks(self) -> int:
        return self._core.num_ranks

    @property
    def intermediate_size_per_partition(self) -> int:
        """The ranks' intermediate size in checkpoint layout (the TP width), prepared or not."""
        return self._core.intermediate_size_per_partition

    @property
    def intermediate_size_per_partition_after_pad(self) -> int:
        """I_rank as stored: the TP width in checkpoint layout, the padded P once prepared."""
        return self._core.intermediate_size_per_partition_after_pad

    @property
    def prepared(self) -> bool:
        return self._core.prepared

    @property
    def padding_summary(self) -> Dict[str, Any]:
        """before/after I_rank, wasted_fraction and the warning message."""
        return self._core.padding_summary

    def rank(self, tp_rank: int = 0, ep_rank: int = 0) -> MoERank:
        """One rank of the grid (rank id = ep_rank * tp_size + tp_rank)."""
        for value, size, label in ((tp_rank, self.tp_size, "tp_rank"), (ep_rank, self.ep_size, "ep_rank")):
            if not 0 <= value < size:
                raise InvalidArgumentError(
                    f"{label}: expected a value in [0, {size}), found {value}", "out_of_range")
        return MoERank(self, ep_rank * self.tp_size + tp_rank)

    @property
    def ranks(self) -> List[MoERank]:
        return [MoERank(self, r) for r in range(self.num_ranks)]

    # --- actions ---
    def prepare(self, align: int = 128) -> Dict[str, Any]:
        """Pad every rank's I_rank to a multiple of ``align``; returns the padding summary."""
        try:
            return self._core.prepare(align)
        finally:
            self._drop_device_copies()

    def restore(self) -> None:
        """Undo the padding in place (back to checkpoint layout)."""
        try:
            self._core.restore_checkpoint_layout()
        finally:
            self._drop_device_copies()

    def cuda(self, device: int = 0, max_tokens: int = 1024) -> "MoELayer":
        """Upload the current weights (every rank) to CUDA device ``device`` for up to
        ``max_tokens`` tokens per call (the workspace is sized for it). :meth:`forward` with
        CUDA arrays does this by itself on first use and again, larger, when a call has more
        tokens; call it first so that no upload (which allocates and synchronizes) happens
        inside a timed region or a CUDA graph capture. Inside :func:`mxq.autotune` with
        ``device="cuda:N"`` the copy consults that tuner (for good: the tuner lives as long as
        the copy). An upload replaces the previous copy, and prepare, restore and weight updates
        drop it: capture CUDA graphs again after any of them.
        """
        if not _mxq.with_cuda:
            raise Error("MoELayer.cuda: this build of mxq has no CUDA support (install it where "
                        "nvcc is found, or with MXQ_CUDA=ON)", "unsupported")
        if max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens: expected >= 1, found {max_tokens}")
        self._upload(device, max_tokens, self._serving_tuner(device))
        return self

    @staticmethod
    def _serving_tuner(device: int) -> Optional[Any]:
        current = _tune.current()
        return current if current is not None and current.serves("cuda", device) else None

    def _upload(self, device: int, max_tokens: int, tuner: Optional[Any]) -> Any:
        # The C++ upload copies the weights under the layer's reader lock (never torn) and is
        # refused mid-update; the copy is kept only if no change of the weights came since.
        version = self._weights_version
        copy = _mxq.MoeGpuLayer.upload(self._core, max_tokens, device, "auto",
                                       None if tuner is None else tuner._tuner)
        with self._device_lock:
            if version == self._weights_version:
                self._device_copies[device] = (copy, tuner)
        return copy

    def _device_copy(self, device: int, tokens: int) -> Any:
        tuner = self._serving_tuner(device)
        entry = self._device_copies.get(device)
        if entry is None or entry[0].max_tokens < tokens or (
                tuner is not None and entry[1] is not tuner):
            size = 1024 if entry is None else entry[0].max_tokens
            if size < tokens:
                size = max(tokens, 2 * size)
            # A copy made under a tuner keeps it; a new tuning context gets a copy of its own.
            copy = self._upload(device, size,
                                tuner if tuner is not None or entry is None else entry[1])
        else:
            copy = entry[0]
        if tuner is not None:
            for problem in copy.tune_problems():
                tuner.tune(problem, tokens)
        return copy

    def device_tactic(self, device: int, tokens: int, rank: int = 0) -> Dict[str, Any]:
        """What a CUDA forward of ``tokens`` tokens runs on ``rank`` of the copy on ``device``
        (after :meth:`cuda` or a CUDA forward): tactic name and whether the tuner chose it."""
        entry = self._device_copies.get(device)
        if entry is None:
            raise InvalidArgumentError(
                f"device: no copy of this layer on cuda:{device} yet (call cuda())")
        return entry[0].tactic_for(tokens, rank)

    def _drop_device_copies(self) -> None:
        with self._device_lock:
            self._weights_version += 1
            self._device_copies.clear()

    def _release(self) -> None:
        self._drop_device_copies()
        self._core = _ReleasedCore()

    def forward_cuda(self, x: ArrayLike, out: Optional[ArrayLike] = None,
                     expert_ids: Optional[ArrayLike] = None,
                     expert_weights: Optional[ArrayLike] = None,
                     stream: Optional[int] = None) -> Any:
        """bf16 y [T, H] for bf16 x [T, H] in CUDA memory (CuPy: uint16 bit patterns), queued on
        ``stream`` (default: x's framework's current stream), no host synchronization.

        Writes into ``out`` (bf16 [T, H] on x's device) and returns it, or allocates the output
        (torch: with torch's allocator; otherwise mxq's) in x's framework.
        """
        device = _device.device_of(x)
        if device[0] != "cuda":
            raise InvalidArgumentError("x: expected a CUDA array, found a host array (forward() "
                                       "runs host arrays on the CPU)", "device_mismatch")
        with _device.device_scope(x):
            return self._forward_cuda(x, device[1], out, expert_ids, expert_weights, stream)

    def _forward_cuda(self, x: ArrayLike, device: int, out: Optional[ArrayLike],
                      expert_ids: Optional[ArrayLike], expert_weights: Optional[ArrayLike],
                      stream: Optional[int]) -> Any:
        if stream is None:
            stream = _device.current_stream(x)
        tokens = int(x.shape[0])
        copy = self._device_copy(device, max(tokens, 1))
        if out is None and type(x).__module__.startswith("torch"):
            import torch

            out = torch.empty((tokens, copy.hidden_size), dtype=torch.bfloat16, device=x.device)
        if tokens == 0:
            if out is not None:
                return out
            empty = _mxq._copy_to_device(np.empty((0, copy.hidden_size), np.uint16),
                                         f"cuda:{device}")
            return _device.to_framework(empty, x, "bf16")
        if out is not None:
            copy.forward(x, out, stream, expert_ids, expert_weights)
            return out
        return _device.to_framework(copy.forward(x, None, stream, expert_ids, expert_weights),
                                    x, "bf16")

    def forward(
        self,
        x: ArrayLike,
        expert_ids: Optional[ArrayLike] = None,
        expert_weights: Optional[ArrayLike] = None,
    ) -> np.ndarray:
        """Output float32 [T, H] for ``x`` [T, H] (float32, rounded to bf16 on entry, or bfloat16).

        Routing is the layer's router unless ``expert_ids`` (int32 [T, top_k]) and
        ``expert_weights`` (float32 [T, top_k]) are given. A CUDA ``x`` (bf16) runs on the GPU
        (:meth:`forward_cuda`) and gives bf16 [T, H] on that device.
        """
        if _device.is_cuda(x):
            return self.forward_cuda(x, expert_ids=expert_ids, expert_weights=expert_weights)
        return self._core.forward(x, expert_ids, expert_weights, self._cpu_tuner(x))["output"]

    def _cpu_tuner(self, x: ArrayLike) -> Optional[Any]:
        """The current mxq.autotune() tuner when it serves the CPU (each rank's expert-tiling
        problem tuned first in tune mode), else None."""
        current = _tune.current()
        if current is None:
            return None
        tokens = int(x.shape[0]) if len(x.shape) > 0 else 0
        return current.moe_cpu_tuner(self._core, self.num_ranks, tokens)

    def forward_details(
        self,
        x: ArrayLike,
        expert_ids: Optional[ArrayLike] = None,
        expert_weights: Optional[ArrayLike] = None,
    ) -> ForwardResult:
        """Like :meth:`forward`, with the fp32 accumulator, routing and timings."""
        return ForwardResult(**self._core.forward(x, expert_ids, expert_weights,
                                                  self._cpu_tuner(x)))

    def update(self) -> MoEUpdate:
        """A weight-update session: ``with layer.update() as u: u.load(name, array)``."""
        return MoEUpdate(self)

    def __repr__(self) -> str:
        c = self.config
        return (f"MoELayer(layer={self.layer_index}, E={c['num_experts']}, H={c['hidden_size']}, "
                f"I={c['intermediate_size']}, top_k={c['top_k']}, tp={self.tp_size}, "
                f"ep={self.ep_size}, I_rank={self.intermediate_size_per_partition_after_pad})")
