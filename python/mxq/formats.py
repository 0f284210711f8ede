"""Low-precision formats, bit-exact with mxq's C++ and CUDA codecs (docs/formats.md).

Inputs are host arrays (NumPy, or anything exporting DLPack / the buffer protocol), read
without copies. Code arrays may be ``uint8`` bit patterns or the matching ml_dtypes dtype
(``float8_e4m3fn``, ``float8_e8m0fnu``); results are NumPy arrays owning mxq tensors, with
E4M3 codes as ``ml_dtypes.float8_e4m3fn`` and E8M0 scales as ``ml_dtypes.float8_e8m0fnu``.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence, Tuple, Union

import numpy as np

from . import _mxq
from ._mxq import BlockShape

ArrayLike = Any  # NumPy array, torch.Tensor, CuPy array, or any DLPack exporter
BlockLike = Union[BlockShape, Tuple[int, int], Sequence[int], str]
ScaleRule = Literal["floor", "ceil"]
ScaleMode = Literal["fp32", "ue8m0"]

__all__ = [
    "BlockShape",
    "block_shape",
    "e2m1_encode",
    "e2m1_decode",
    "e4m3_encode",
    "e4m3_decode",
    "e8m0_encode",
    "e8m0_decode",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "quantize_fp8_block",
    "dequantize_fp8_block",
    "quantize_fp8_groups",
    "pack_ue8m0",
    "unpack_ue8m0",
]


def block_shape(block: BlockLike) -> BlockShape:
    """The typed block shape of ``block``: (n, k), [n, k], "NxK" or a BlockShape give equal values."""
    return BlockShape.parse(block)


def e2m1_encode(x: ArrayLike) -> np.ndarray:
    """FP4 E2M1 codes (one per uint8, 0..15) of float32 ``x``: round-to-nearest-even, saturating to ±6."""
    return _mxq.e2m1_encode(x)


def e2m1_decode(codes: ArrayLike) -> np.ndarray:
    """float32 values of E2M1 codes (uint8, 0..15; code 8 is -0.0)."""
    return _mxq.e2m1_decode(codes)


def e4m3_encode(x: ArrayLike, saturate: bool = True) -> np.ndarray:
    """E4M3 (e4m3fn) codes of float32 ``x``, RNE; ``saturate=False`` maps overflow to NaN."""
    return _mxq.e4m3_encode(x, saturate)


def e4m3_decode(codes: ArrayLike) -> np.ndarray:
    """float32 values of E4M3 codes (uint8 bit patterns or float8_e4m3fn)."""
    return _mxq.e4m3_decode(codes)


def e8m0_encode(x: ArrayLike, rounding: Literal["floor", "ceil"] = "floor") -> np.ndarray:
    """E8M0 scale bytes of float32 ``x`` (|x|'s power of two, rounded down or up; NaN/Inf -> 0xFF)."""
    return _mxq.e8m0_encode(x, rounding)


def e8m0_decode(codes: ArrayLike) -> np.ndarray:
    """float32 values 2^(b-127) of E8M0 bytes (0xFF is NaN, 0 is 2^-127)."""
    return _mxq.e8m0_decode(codes)


def quantize_mxfp4(x: ArrayLike, scale_rule: ScaleRule = "floor") -> Tuple[np.ndarray, np.ndarray]:
    """MXFP4-quantize the last axis of float32/bfloat16 ``x`` [..., K] (K % 32 == 0).

    Returns ``(blocks, scales)``: uint8 [..., K/32, 16] (two E2M1 codes per byte, element 2j in
    the low nibble) and float8_e8m0fnu [..., K/32].
    """
    return _mxq.quantize_mxfp4(x, scale_rule)


def dequantize_mxfp4(blocks: ArrayLike, scales: ArrayLike) -> np.ndarray:
    """float32 [..., G*32] from MXFP4 ``blocks`` uint8 [..., G, 16] and ``scales`` [..., G]."""
    return _mxq.dequantize_mxfp4(blocks, scales)


def quantize_fp8_block(
    x: ArrayLike, block: BlockLike = (128, 128), scale_mode: ScaleMode = "fp32"
) -> Tuple[np.ndarray, np.ndarray]:
    """Block-FP8-quantize float32/bfloat16 ``x`` [N, K] in blocks of ``block`` = (n, k).

    Returns ``(q, scale)``: float8_e4m3fn [N, K] and float32 [ceil(N/n), ceil(K/k)] (the
    dequantization multiplier). ``scale_mode="ue8m0"`` rounds each scale up to a power of two.
    """
    return _mxq.quantize_fp8_block(x, block, scale_mode)


def dequantize_fp8_block(q: ArrayLike, scale: ArrayLike, block: BlockLike = (128, 128)) -> np.ndarray:
    """float32 [N, K] = q * scale of its block."""
    return _mxq.dequantize_fp8_block(q, scale, block)


def quantize_fp8_groups(
    x: ArrayLike, group_k: int = 128, scale_mode: ScaleMode = "fp32"
) -> Tuple[np.ndarray, np.ndarray]:
    """Activation quantization in 1 x ``group_k`` groups along K (block-FP8 with block (1, group_k))."""
    return _mxq.quantize_fp8_groups(x, group_k, scale_mode)


def pack_ue8m0(scales: ArrayLike) -> np.ndarray:
    """Pack float32 power-of-two scales [MN, G] into int32 [ceil(G/4), round_up(MN, 4)] (DeepGEMM's layout)."""
    return _mxq.pack_ue8m0(scales)


def unpack_ue8m0(packed: ArrayLike, mn: int, groups: int) -> np.ndarray:
    """float32 [mn, groups] from packed UE8M0 int32 scales."""
    return _mxq.unpack_ue8m0(packed, mn, groups)
