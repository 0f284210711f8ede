"""mxq.BlockFp8Linear: y = x W^T (+ bias) with a block-FP8 weight (DeepSeek-V3 style).

x is bf16 [M, K] (``ml_dtypes.bfloat16`` NumPy arrays, any bf16 DLPack array, or uint16 bit
patterns), quantized inside the op per 1 x block.k group; the output is bf16 (or float32)
[M, N]. The op runs where the weight is: on the host, or on a CUDA device after
:meth:`BlockFp8Linear.to` (then x must be on that device too; torch and CuPy arrays are read in
place and the work is queued on their current stream).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from . import _device, _mxq
from . import tune as _tune
from ._mxq import BlockShape

ArrayLike = Any

__all__ = ["BlockFp8Linear"]


class BlockFp8Linear:
    """A block-FP8 weight and the linear op over it (CPU tactics on the host)."""

    def __init__(self, weight: "_mxq.BlockFp8Weight", bias: Optional[np.ndarray] = None,
                 origin: Optional[Dict[str, str]] = None) -> None:
        self._weight = weight
        self.bias = bias
        self.origin = origin or {}

    @classmethod
    def from_checkpoint(cls, path: str, name: str, bias: Optional[ArrayLike] = None) -> "BlockFp8Linear":
        """Load ``{name}.weight`` (F8_E4M3 [N, K]) and ``{name}.weight_scale_inv`` (F32).

        ``path`` is a DeepSeek-V3 style directory (config.json's weight_block_size) or one
        .safetensors file with ``weight_block_size`` metadata (e.g. ``mxq quantize fp8-block``).
        """
        weight, origin = _mxq.BlockFp8Weight.load(str(path), name)
        return cls(weight, bias, origin)

    @classmethod
    def from_arrays(cls, q: ArrayLike, scale: ArrayLike, block: Any = (128, 128),
                    bias: Optional[ArrayLike] = None) -> "BlockFp8Linear":
        """From E4M3 codes [N, K] (float8_e4m3fn or uint8) and scales: float32
        [ceil(N/bn), ceil(K/bk)] or packed UE8M0 int32. The weight keeps its own copy."""
        return cls(_mxq.BlockFp8Weight.from_arrays(q, scale, block), bias)

    @classmethod
    def borrow(cls, q: ArrayLike, scale: ArrayLike, block: Any = (128, 128),
               bias: Optional[ArrayLike] = None) -> "BlockFp8Linear":
        """Like :meth:`from_arrays` without the copy: the weight reads ``q`` and ``scale`` in
        place (host or CUDA, both on one device) and keeps them alive; do not modify them."""
        return cls(_mxq.BlockFp8Weight.borrow(q, scale, block), bias)

    @classmethod
    def quantize(cls, w: ArrayLike, block: Any = (128, 128), scale_mode: str = "fp32",
                 bias: Optional[ArrayLike] = None) -> "BlockFp8Linear":
        """Quantize a float32/bfloat16 weight [N, K] in blocks of ``block``."""
        return cls(_mxq.BlockFp8Weight.quantize(w, block, scale_mode), bias)

    @property
    def n(self) -> int:
        return self._weight.n

    @property
    def k(self) -> int:
        return self._weight.k

    @property
    def block(self) -> BlockShape:
        return self._weight.block

    @property
    def device(self) -> str:
        """Where the weight lives: "cpu" or "cuda:N"."""
        return self._weight.device

    def to(self, device: str) -> "BlockFp8Linear":
        """A copy on ``device`` ("cpu", "cuda", "cuda:N"); the bias is copied along."""
        bias = None if self.bias is None else _mxq._copy_to_device(self.bias, device)
        return BlockFp8Linear(self._weight.to(device), bias, self.origin)

    def cuda(self, device: int = 0) -> "BlockFp8Linear":
        return self.to(f"cuda:{device}")

    @property
    def scale_layout(self) -> str:
        """"fp32" or "packed-ue8m0"."""
        return self._weight.scale_layout

    @property
    def q(self) -> np.ndarray:
        """Read-only view of the E4M3 codes [N, K] (no copy; a DLPack array for a CUDA weight)."""
        return self._weight.q

    @property
    def scale(self) -> np.ndarray:
        """Read-only view of the scales (no copy; a DLPack array for a CUDA weight)."""
        return self._weight.scale

    def with_packed_ue8m0_scales(self) -> "BlockFp8Linear":
        """The same weight with DeepGEMM's packed UE8M0 scales (every scale a power of two)."""
        return BlockFp8Linear(self._weight.with_packed_ue8m0_scales(), self.bias, self.origin)

    def forward(self, x: ArrayLike, tactic: str = "auto", activation_scales: str = "fp32",
                out_dtype: str = "bf16", stream: Optional[int] = None) -> Any:
        """y [M, N] (bfloat16 or float32) for bf16 x [M, K], on the weight's device.

        Host: a NumPy array. CUDA: x's framework's array (a torch tensor for torch, a CuPy array
        of uint16 bf16 bits for CuPy, else a DLPack array), computed in the order of ``stream``
        (a cudaStream_t as an integer; default: x's framework's current stream), without a host
        synchronization. Inside :func:`mxq.autotune`, ``tactic="auto"`` runs the tuner's choice.
        """
        device, index = _device.device_of(x)
        tuner = self._tuner_for(device, index, x, tactic, activation_scales, out_dtype)
        if device == "cpu":
            return self._weight.linear(x, self.bias, tactic, activation_scales, out_dtype, 0, tuner)
        with _device.device_scope(x):
            if stream is None:
                stream = _device.current_stream(x)
            y = self._weight.linear(x, self.bias, tactic, activation_scales, out_dtype, stream,
                                    tuner)
            return _device.to_framework(y, x, out_dtype)

    def _tuner_for(self, device: str, index: int, x: ArrayLike, tactic: str,
                   activation_scales: str, out_dtype: str) -> Optional[Any]:
        """The current autotuner when it serves this call (tuning its problem first)."""
        current = _tune.current()
        shape = getattr(x, "shape", None)
        if current is None or tactic != "auto" or shape is None or len(shape) != 2:
            return None
        return current.linear_tuner(device, index, self.n, self.k, tuple(self.block),
                                    activation_scales, out_dtype, int(shape[0]))

    __call__ = forward

    def explain(self, m: int, tactic: str = "auto", activation_scales: str = "fp32",
                out_dtype: str = "bf16") -> Dict[str, Any]:
        """Which tactic runs for M = ``m`` tokens and, for every other tactic, why not.

        Returns a dict: problem, requested, chosen (None if nothing supports it),
        chosen_because, rejected [(tactic, reason)], text (the human-readable form), and
        from_tuner / tuner_note: whether the current :func:`mxq.autotune` cache made the choice.
        """
        device, _, index = self.device.partition(":")
        tuner = None
        current = _tune.current()
        if current is not None and tactic == "auto":
            tuner = current.linear_tuner(device, int(index or 0), self.n, self.k,
                                         tuple(self.block), activation_scales, out_dtype, m)
        return self._weight.explain(m, self.bias is not None, tactic, activation_scales, out_dtype,
                                    tuner)

    def __repr__(self) -> str:
        return (f"BlockFp8Linear(N={self.n}, K={self.k}, block={self.block!r}, "
                f"scales={self.scale_layout})")
