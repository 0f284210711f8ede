"""PyTorch custom ops ``torch.ops.mxq.*`` over mxq's CPU implementations (design, first cut).

Imported only on request (``import mxq.torch_ops``) and only where torch is importable; mxq
itself never imports torch. Each op has a real implementation (host tensors go to mxq without a
copy through DLPack; results come back through NumPy without a copy) and a fake (shape-only)
implementation, so ``torch.compile(fullgraph=True)`` can trace modules that call them.

Status: written without torch available (it could not be installed on the development machine);
tests/python/test_torch_ops.py runs the opcheck and torch.compile checks where torch exists.
CUDA tensors are refused with ValueError until mxq's CUDA paths are bound (no stream handling
yet).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from . import _mxq

__all__ = ["quantize_mxfp4", "dequantize_mxfp4", "quantize_fp8_block", "block_fp8_linear"]


def _from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """torch view of an mxq result (no copy): ml_dtypes arrays travel as same-size integers."""
    if array.dtype.itemsize == 2 and array.dtype.kind not in "iuf":
        return torch.from_numpy(array.view(np.int16)).view(dtype)
    if array.dtype.itemsize == 1 and array.dtype.kind not in "iub":
        return torch.from_numpy(array.view(np.uint8)).view(dtype)
    return torch.from_numpy(array)


def _host(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, found one on {t.device} "
                         "(mxq's CUDA ops are not bound to Python yet)")
    return t


# --- MXFP4 --------------------------------------------------------------------------------

@torch.library.custom_op("mxq::quantize_mxfp4", mutates_args=())
def quantize_mxfp4(x: torch.Tensor, scale_rule: str = "floor") -> Tuple[torch.Tensor, torch.Tensor]:
    blocks, scales = _mxq.quantize_mxfp4(_host(x, "x"), scale_rule)
    return _from_numpy(blocks, torch.uint8), _from_numpy(scales, torch.float8_e8m0fnu)


@quantize_mxfp4.register_fake
def _(x, scale_rule="floor"):
    groups = x.shape[-1] // 32
    return (x.new_empty((*x.shape[:-1], groups, 16), dtype=torch.uint8),
            x.new_empty((*x.shape[:-1], groups), dtype=torch.float8_e8m0fnu))


@torch.library.custom_op("mxq::dequantize_mxfp4", mutates_args=())
def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    out = _mxq.dequantize_mxfp4(_host(blocks, "blocks"), _host(scales, "scales"))
    return _from_numpy(out, torch.float32)


@dequantize_mxfp4.register_fake
def _(blocks, scales):
    return blocks.new_empty((*blocks.shape[:-2], blocks.shape[-2] * 32), dtype=torch.float32)


# --- block-FP8 ----------------------------------------------------------------------------

@torch.library.custom_op("mxq::quantize_fp8_block", mutates_args=())
def quantize_fp8_block(x: torch.Tensor, block_n: int, block_k: int,
                       scale_mode: str = "fp32") -> Tuple[torch.Tensor, torch.Tensor]:
    q, scale = _mxq.quantize_fp8_block(_host(x, "x"), (block_n, block_k), scale_mode)
    return _from_numpy(q, torch.float8_e4m3fn), _from_numpy(scale, torch.float32)


@quantize_fp8_block.register_fake
def _(x, block_n, block_k, scale_mode="fp32"):
    n, k = x.shape
    return (x.new_empty((n, k), dtype=torch.float8_e4m3fn),
            x.new_empty((-(-n // block_n), -(-k // block_k)), dtype=torch.float32))


@torch.library.custom_op("mxq::block_fp8_linear", mutates_args=())
def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     block_n: int, block_k: int, bias: Optional[torch.Tensor] = None,
                     out_dtype: str = "bf16") -> torch.Tensor:
    # The C++ weight owns its parts, so each call copies them once; a module keeping an
    # mxq.BlockFp8Linear avoids that (a handle-based op is the next step).
    w = _mxq.BlockFp8Weight.from_arrays(_host(weight, "weight"), _host(weight_scale, "weight_scale"),
                                        (block_n, block_k))
    out = w.linear(_host(x, "x"), None if bias is None else _host(bias, "bias"), "auto", "fp32",
                   out_dtype)
    return _from_numpy(out, torch.bfloat16 if out_dtype == "bf16" else torch.float32)


@block_fp8_linear.register_fake
def _(x, weight, weight_scale, block_n, block_k, bias=None, out_dtype="bf16"):
    return x.new_empty((x.shape[0], weight.shape[0]),
                       dtype=torch.bfloat16 if out_dtype == "bf16" else torch.float32)
