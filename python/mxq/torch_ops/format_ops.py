"""The format ops: MXFP4 and block-FP8 quantize / dequantize, E4M3 codecs, FP8 activation groups."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from .. import _mxq
from .._errors import InvalidArgumentError
from ._common import (
    _BF16,
    _E4M3,
    _E8M0,
    _F32,
    _U8,
    _ceil_div,
    _check,
    _check_size,
    _codes,
    _from_numpy,
    _register_cpu_only,
    _register_no_gradient,
    _stream,
)


# --- MXFP4 --------------------------------------------------------------------------------

def _check_quantize_mxfp4(x: Tensor) -> None:
    _check(x, "x", (_F32, _BF16), min_ndim=1)
    _check_size(x.shape[-1] % 32 == 0,
                f"x: expected a last dimension that is a multiple of 32, found shape {list(x.shape)}")


@torch.library.custom_op("mxq::quantize_mxfp4", mutates_args=(), device_types="cpu")
def quantize_mxfp4(x: Tensor, scale_rule: str = "floor") -> Tuple[Tensor, Tensor]:
    """MXFP4 along the last axis of float32/bfloat16 x [..., K]: uint8 blocks [..., K/32, 16]
    (two E2M1 per byte, low nibble first) and E8M0 scales [..., K/32] (float8_e8m0fnu; uint8
    with torch < 2.7, which lacks that dtype)."""
    _check_quantize_mxfp4(x)
    blocks, scales = _mxq.quantize_mxfp4(x, scale_rule)
    return _from_numpy(blocks, _U8), _from_numpy(scales, _E8M0 or _U8)


@quantize_mxfp4.register_fake
def _(x, scale_rule="floor"):
    _check_quantize_mxfp4(x)
    groups = x.shape[-1] // 32
    return (x.new_empty((*x.shape[:-1], groups, 16), dtype=_U8),
            x.new_empty((*x.shape[:-1], groups), dtype=_E8M0 or _U8))


def _check_dequantize_mxfp4(blocks: Tensor, scales: Tensor) -> None:
    _check(blocks, "blocks", (_U8,), min_ndim=2)
    _check(scales, "scales", (_E8M0, _U8), min_ndim=1)
    _check_size(blocks.shape[-1] == 16,
                f"blocks: expected [..., G, 16] (16 bytes per block), found {list(blocks.shape)}")
    message = f"scales: expected shape {list(blocks.shape[:-1])}, found {list(scales.shape)}"
    _check_size(scales.dim() == blocks.dim() - 1, message)
    for dim in range(scales.dim()):
        _check_size(scales.shape[dim] == blocks.shape[dim], message)


@torch.library.custom_op("mxq::dequantize_mxfp4", mutates_args=(), device_types="cpu")
def dequantize_mxfp4(blocks: Tensor, scales: Tensor) -> Tensor:
    """float32 [..., G*32] from MXFP4 blocks uint8 [..., G, 16] and E8M0 scales [..., G]."""
    _check_dequantize_mxfp4(blocks, scales)
    return _from_numpy(_mxq.dequantize_mxfp4(blocks, _codes(scales)), _F32)


@dequantize_mxfp4.register_fake
def _(blocks, scales):
    _check_dequantize_mxfp4(blocks, scales)
    return blocks.new_empty((*blocks.shape[:-2], blocks.shape[-2] * 32), dtype=_F32)


# --- E4M3 ---------------------------------------------------------------------------------

@torch.library.custom_op("mxq::e4m3_encode", mutates_args=(), device_types="cpu")
def e4m3_encode(x: Tensor, saturate: bool = True) -> Tensor:
    """E4M3 (float8_e4m3fn) codes of float32 x, round-to-nearest-even; saturating to ±448 unless
    ``saturate=False`` (then overflow is NaN). Bit-exact with CUDA's __nv_cvt_float_to_fp8."""
    _check(x, "x", (_F32,))
    return _from_numpy(_mxq.e4m3_encode(x, saturate), _E4M3)


@e4m3_encode.register_fake
def _(x, saturate=True):
    _check(x, "x", (_F32,))
    return torch.empty_like(x, dtype=_E4M3)


@torch.library.custom_op("mxq::e4m3_decode", mutates_args=(), device_types="cpu")
def e4m3_decode(codes: Tensor) -> Tensor:
    """float32 values of E4M3 codes (float8_e4m3fn, or uint8 bit patterns)."""
    _check(codes, "codes", (_E4M3, _U8))
    return _from_numpy(_mxq.e4m3_decode(_codes(codes)), _F32)


@e4m3_decode.register_fake
def _(codes):
    _check(codes, "codes", (_E4M3, _U8))
    return torch.empty_like(codes, dtype=_F32)


# --- block-FP8 ----------------------------------------------------------------------------

def _check_block(block_n: int, block_k: int) -> None:
    if block_n < 1 or block_k < 1:
        raise InvalidArgumentError(f"block: expected two positive extents (n, k), found "
                                   f"({block_n}, {block_k})")


@torch.library.custom_op("mxq::quantize_fp8_block", mutates_args=(), device_types="cpu")
def quantize_fp8_block(x: Tensor, block_n: int = 128, block_k: int = 128,
                       scale_mode: str = "fp32") -> Tuple[Tensor, Tensor]:
    """Block-FP8 of float32/bfloat16 x [N, K] in block_n x block_k blocks: E4M3 [N, K] and the
    float32 dequantization scales [ceil(N/bn), ceil(K/bk)] ("ue8m0": powers of two)."""
    _check(x, "x", (_F32, _BF16), ndim=2)
    _check_block(block_n, block_k)
    q, scale = _mxq.quantize_fp8_block(x, (block_n, block_k), scale_mode)
    return _from_numpy(q, _E4M3), _from_numpy(scale, _F32)


@quantize_fp8_block.register_fake
def _(x, block_n=128, block_k=128, scale_mode="fp32"):
    _check(x, "x", (_F32, _BF16), ndim=2)
    _check_block(block_n, block_k)
    n, k = x.shape
    return (x.new_empty((n, k), dtype=_E4M3),
            x.new_empty((_ceil_div(n, block_n), _ceil_div(k, block_k)), dtype=_F32))


def _check_dequantize_fp8_block(q: Tensor, scale: Tensor, block_n: int, block_k: int) -> None:
    _check(q, "q", (_E4M3, _U8), ndim=2)
    _check(scale, "scale", (_F32,), ndim=2)
    _check_block(block_n, block_k)
    want = (_ceil_div(q.shape[0], block_n), _ceil_div(q.shape[1], block_k))
    for dim in (0, 1):
        _check_size(scale.shape[dim] == want[dim],
                    f"scale: expected shape [ceil(N/{block_n}), ceil(K/{block_k})] = {list(want)}, "
                    f"found {list(scale.shape)}")


@torch.library.custom_op("mxq::dequantize_fp8_block", mutates_args=(), device_types="cpu")
def dequantize_fp8_block(q: Tensor, scale: Tensor, block_n: int = 128,
                         block_k: int = 128) -> Tensor:
    """float32 [N, K] = q * scale of its block."""
    _check_dequantize_fp8_block(q, scale, block_n, block_k)
    return _from_numpy(_mxq.dequantize_fp8_block(_codes(q), scale, (block_n, block_k)), _F32)


@dequantize_fp8_block.register_fake
def _(q, scale, block_n=128, block_k=128):
    _check_dequantize_fp8_block(q, scale, block_n, block_k)
    return torch.empty_like(q, dtype=_F32)


def _check_quantize_fp8_groups(x: Tensor, group_k: int) -> None:
    _check(x, "x", (_BF16,) if x.device.type == "cuda" else (_F32, _BF16), ndim=2)
    if group_k < 1:
        raise InvalidArgumentError(f"group_k: expected a positive group size, found {group_k}")


@torch.library.custom_op("mxq::quantize_fp8_groups", mutates_args=(), device_types=("cpu", "cuda"))
def quantize_fp8_groups(x: Tensor, group_k: int = 128,
                        scale_mode: str = "fp32") -> Tuple[Tensor, Tensor]:
    """The block-FP8 linear op's activation quantization: x [M, K] (CPU: float32 or bfloat16;
    CUDA: bfloat16) per 1 x group_k group -> E4M3 [M, K] and float32 scales [M, ceil(K/group_k)].
    On CUDA it is the device kernel of the linear op (bit-equal to the host quantizer)."""
    _check_quantize_fp8_groups(x, group_k)
    if x.device.type == "cpu":
        from .. import formats

        q, scale = formats.quantize_fp8_groups(x, group_k, scale_mode)
        return _from_numpy(q, _E4M3), _from_numpy(scale, _F32)
    # CUDA: outputs and the workspace from torch's caching allocator; nothing mxq allocates.
    m, k = x.shape
    q = torch.empty((m, k), dtype=_E4M3, device=x.device)
    scale = torch.empty((m, _ceil_div(k, group_k)), dtype=_F32, device=x.device)
    workspace = torch.empty(_mxq.quantize_activations_workspace_bytes(m, k, group_k, True),
                            dtype=torch.uint8, device=x.device)
    with torch.cuda.device(x.device):
        _mxq.quantize_activations_into(x, group_k, scale_mode, q.view(torch.uint8), scale,
                                       workspace, _stream(x))
    return q, scale


@quantize_fp8_groups.register_fake
def _(x, group_k=128, scale_mode="fp32"):
    _check_quantize_fp8_groups(x, group_k)
    m, k = x.shape
    return x.new_empty((m, k), dtype=_E4M3), x.new_empty((m, _ceil_div(k, group_k)), dtype=_F32)



# --- host-only ops: CUDA tensors are refused naming the argument ------------------------------

_register_cpu_only(quantize_mxfp4, "quantize_mxfp4", ("x",))
_register_cpu_only(dequantize_mxfp4, "dequantize_mxfp4", ("blocks", "scales"))
_register_cpu_only(e4m3_encode, "e4m3_encode", ("x",))
_register_cpu_only(e4m3_decode, "e4m3_decode", ("codes",))
_register_cpu_only(quantize_fp8_block, "quantize_fp8_block", ("x",))
_register_cpu_only(dequantize_fp8_block, "dequantize_fp8_block", ("q", "scale"))



_register_no_gradient(quantize_mxfp4, "quantize_mxfp4")
_register_no_gradient(quantize_fp8_block, "quantize_fp8_block")
_register_no_gradient(quantize_fp8_groups, "quantize_fp8_groups")
_register_no_gradient(e4m3_encode, "e4m3_encode")
_register_no_gradient(dequantize_mxfp4, "dequantize_mxfp4")
_register_no_gradient(dequantize_fp8_block, "dequantize_fp8_block")
_register_no_gradient(e4m3_decode, "e4m3_decode")
