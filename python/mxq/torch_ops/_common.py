"""What the torch ops share (internal): dtype constants, the argument checks of the real and the
fake implementations, conversions between torch tensors and mxq's arrays, the registration of
host-only ops and of ops without a gradient."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .._errors import DtypeError, Error, InvalidArgumentError

_F32, _BF16, _U8 = torch.float32, torch.bfloat16, torch.uint8
_E4M3 = torch.float8_e4m3fn
_E8M0 = getattr(torch, "float8_e8m0fnu", None)  # torch >= 2.7



# --- argument checks (shared by the real and the fake implementations) ---------------------

def _names(dtypes: Sequence[torch.dtype]) -> str:
    names = [str(d).replace("torch.", "") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _check(t: Any, name: str, dtypes: Sequence[Optional[torch.dtype]], ndim: Optional[int] = None,
           min_ndim: int = 0, contiguous: bool = True) -> Tensor:
    if not isinstance(t, Tensor):
        raise DtypeError(f"{name}: expected a torch.Tensor, found {type(t).__name__}")
    dtypes = [d for d in dtypes if d is not None]
    if t.dtype not in dtypes:
        raise DtypeError(f"{name}: expected {_names(dtypes)}, found "
                         f"{str(t.dtype).replace('torch.', '')}")
    if ndim is not None and t.dim() != ndim:
        raise InvalidArgumentError(f"{name}: expected {ndim} dimensions, found shape "
                                   f"{list(t.shape)}", "shape_mismatch")
    if t.dim() < min_ndim:
        raise InvalidArgumentError(f"{name}: expected at least {min_ndim} dimensions, found shape "
                                   f"{list(t.shape)}", "shape_mismatch")
    if contiguous and not t.is_contiguous():
        raise InvalidArgumentError(f"{name}: expected a contiguous tensor, found shape "
                                   f"{list(t.shape)} with strides {list(t.stride())} "
                                   "(use .contiguous())")
    return t


def _check_device(t: Optional[Tensor], name: str, device: torch.device) -> None:
    if t is not None and t.device != device:
        raise InvalidArgumentError(f"{name}: expected a tensor on {device} (where x is), found one "
                                   f"on {t.device}", "device_mismatch")


def _check_size(ok: Any, message: str) -> None:
    """A shape condition; symbolic under torch.compile's dynamic shapes (then torch._check
    records it instead of branching on it)."""
    if isinstance(ok, bool):
        if not ok:
            raise InvalidArgumentError(message, "shape_mismatch")
    else:
        torch._check(ok, lambda: message)


def _ceil_div(a: Any, b: int) -> Any:
    return (a + b - 1) // b


# --- conversions ------------------------------------------------------------------------------

def _codes(t: Tensor) -> Tensor:
    """float8 tensors as uint8 views of the same bytes (mxq reads uint8 as codes)."""
    return t.view(_U8) if t.dtype in (_E4M3, _E8M0) and t.dtype is not None else t


def _from_numpy(array: np.ndarray, dtype: torch.dtype) -> Tensor:
    """torch view of an mxq result (no copy); ml_dtypes arrays travel as same-size integers."""
    if array.dtype.itemsize == 2 and array.dtype.kind not in "iuf":
        return torch.from_numpy(array.view(np.int16)).view(dtype)
    if array.dtype.itemsize == 1 and array.dtype.kind not in "iub":
        return torch.from_numpy(array.view(np.uint8)).view(dtype)
    tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def _from_device(result: Any, dtype: torch.dtype) -> Tensor:
    """torch view of a DLPack result mxq produced on a GPU (storage dtype), no copy."""
    tensor = torch.from_dlpack(result)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def _stream(x: Tensor) -> int:
    return int(torch.cuda.current_stream(x.device).cuda_stream)


def _host_only(op: str, *named: Tuple[str, Optional[Tensor]]) -> None:
    for name, t in named:
        if isinstance(t, Tensor) and t.device.type != "cpu":
            raise InvalidArgumentError(f"{name}: expected a CPU tensor, found one on {t.device} "
                                       f"(mxq has no CUDA kernel for {op}; use .cpu())",
                                       "device_mismatch")
    raise InvalidArgumentError(f"{op}: expected CPU tensors", "device_mismatch")


def _register_cpu_only(op: Any, name: str, arg_names: Sequence[str]) -> None:
    """CUDA tensors to a host-only op: an InvalidArgumentError naming the argument (not a
    dispatch error)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        _host_only(name, *zip(arg_names, args))

    op.register_kernel("cuda", refuse)



# --- ops without a gradient -------------------------------------------------------------------------------
#
# Every op with a floating input has a formula: without one, autograd lets a requires-grad
# input give requires-grad outputs (float8 and e8m0 ones too) and torch.compile fails while
# tracing the backward. block_fp8_linear has a gradient; the others fail clearly when a backward
# reaches them, so their forward still runs and compiles with requires-grad inputs.

_QUANTIZE = "quantization is piecewise constant; detach the input or run it under torch.no_grad()"
_DEQUANTIZE = ("mxq's dequantization is for inference; detach the codes and scales or run it under "
               "torch.no_grad()")
_NO_GRADIENT_REASONS = {
    "mxfp4_moe": "mxq's MoE op is for inference; run it under torch.no_grad()",
    "moe_route": "mxq's router is for inference; run it under torch.no_grad()",
    "quantize_mxfp4": _QUANTIZE,
    "quantize_fp8_block": _QUANTIZE,
    "quantize_fp8_groups": _QUANTIZE,
    "e4m3_encode": _QUANTIZE,
    "dequantize_mxfp4": _DEQUANTIZE,
    "dequantize_fp8_block": _DEQUANTIZE,
    "e4m3_decode": _DEQUANTIZE,
}


@torch.library.custom_op("mxq::_no_gradient", mutates_args=(), device_types=("cpu", "cuda"))
def _no_gradient(grads: Sequence[Tensor], shape: Sequence[int], dtype: torch.dtype,
                 op: str) -> Tensor:
    """The backward of ``mxq::{op}``, which has no gradient: raises when it runs. An op, not a
    Python raise in the formula, because torch.compile traces the backward (with this op's fake,
    an input-shaped gradient) even when no backward ever runs. It takes every output gradient
    so that, compiled too, it runs after the backward of what came later (as in eager)."""
    raise Error(f"mxq.{op} has no gradient ({_NO_GRADIENT_REASONS[op]})", "unsupported")


@_no_gradient.register_fake
def _(grads, shape, dtype, op):
    return grads[0].new_empty(shape, dtype=dtype)


# Kept by dead-code elimination although it computes nothing: when a later op's backward ignores
# the gradient's values (torch.round's is zero), the compiled backward must still fail as the
# eager one does, not hand back a zero gradient.
if hasattr(torch.fx.node, "has_side_effect"):  # marked not backward-compatible by torch
    torch.fx.node.has_side_effect(torch.ops.mxq._no_gradient.default)


def _register_no_gradient(op: Any, name: str) -> None:
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        ctx.input_meta = [(t.shape, t.dtype) if isinstance(t, Tensor) else None for t in inputs]

    def backward(ctx: Any, *grads: Tensor) -> Tuple[Optional[Tensor], ...]:
        grads = [g for g in grads if g is not None]
        # needs_input_grad covers the arguments passed (the dispatcher drops trailing defaults)
        return tuple(torch.ops.mxq._no_gradient(grads, meta[0], meta[1], name) if needed else None
                     for needed, meta in zip(ctx.needs_input_grad, ctx.input_meta))

    op.register_autograd(backward, setup_context=setup_context)


