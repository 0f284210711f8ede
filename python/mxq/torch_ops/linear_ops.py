"""The block-FP8 linear op, its straight-through gradient, and the BlockFp8Linear module."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .. import _mxq
from .. import tune as _tune
from .._errors import InvalidArgumentError
from ._common import (
    _BF16,
    _E4M3,
    _F32,
    _OUT_DTYPES,
    _U8,
    _ceil_div,
    _check,
    _check_device,
    _check_size,
    _codes,
    _from_device,
    _from_numpy,
    _no_scope,
    _stream,
)
from .format_ops import _check_block


# --- block-FP8 linear -----------------------------------------------------------------------

def _check_linear(x: Tensor, weight: Tensor, weight_scale: Tensor, block_n: int, block_k: int,
                  bias: Optional[Tensor], out_dtype: str) -> None:
    _check(x, "x", (_BF16,), min_ndim=1)
    _check(weight, "weight", (_E4M3, _U8), ndim=2)
    _check(weight_scale, "weight_scale", (_F32, torch.int32), ndim=2)
    _check_block(block_n, block_k)
    if bias is not None:
        _check(bias, "bias", (_BF16, _F32), ndim=1)
    for name, t in (("weight", weight), ("weight_scale", weight_scale), ("bias", bias)):
        _check_device(t, name, x.device)
    if out_dtype not in _OUT_DTYPES:
        raise InvalidArgumentError(f"out_dtype: expected \"bf16\" or \"f32\", found "
                                   f"{out_dtype!r}")
    _check_size(x.shape[-1] == weight.shape[1],
                f"x: expected K = {weight.shape[1]} columns (the weight is {list(weight.shape)}), "
                f"found shape {list(x.shape)}")
    if bias is not None:
        _check_size(bias.shape[0] == weight.shape[0],
                    f"bias: expected shape [{weight.shape[0]}], found {list(bias.shape)}")


@torch.library.custom_op("mxq::block_fp8_linear", mutates_args=(), device_types=("cpu", "cuda"))
def block_fp8_linear(x: Tensor, weight: Tensor, weight_scale: Tensor, block_n: int = 128,
                     block_k: int = 128, bias: Optional[Tensor] = None,
                     activation_scales: str = "fp32", out_dtype: str = "bf16",
                     tactic: str = "auto") -> Tensor:
    """y [..., N] = x [..., K] W^T (+ bias), W block-FP8: E4M3 codes [N, K] with float32
    scales [ceil(N/bn), ceil(K/bk)] (or packed UE8M0 int32), x bfloat16 quantized per
    1 x block_k group inside the op. out_dtype "bf16" or "f32". The weight is read in place."""
    _check_linear(x, weight, weight_scale, block_n, block_k, bias, out_dtype)
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty((*lead, n), dtype=_OUT_DTYPES[out_dtype])
    with torch.cuda.device(x.device) if x.device.type == "cuda" else _no_scope():
        w = _mxq.BlockFp8Weight.borrow(_codes(weight), weight_scale, (block_n, block_k))
    tuner = _linear_tuner(x2, n, k, block_n, block_k, activation_scales, out_dtype, tactic)
    if x.device.type == "cpu":
        y = _from_numpy(w.linear(x2, bias, tactic, activation_scales, out_dtype, 0, tuner),
                        _OUT_DTYPES[out_dtype])
    else:
        with torch.cuda.device(x.device):  # torch exports CUDA tensors of the current device only
            y = _from_device(w.linear(x2, bias, tactic, activation_scales, out_dtype, _stream(x),
                                      tuner), _OUT_DTYPES[out_dtype])
    return y.reshape(*lead, n)


@block_fp8_linear.register_fake
def _(x, weight, weight_scale, block_n=128, block_k=128, bias=None, activation_scales="fp32",
      out_dtype="bf16", tactic="auto"):
    _check_linear(x, weight, weight_scale, block_n, block_k, bias, out_dtype)
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=_OUT_DTYPES[out_dtype])


def _linear_tuner(x: Tensor, n: int, k: int, block_n: int, block_k: int, activation_scales: str,
                  out_dtype: str, tactic: str) -> Optional[Any]:
    """The current mxq.autotune() tuner when it serves this call (its problem tuned first)."""
    current = _tune.current()
    if current is None or tactic != "auto":
        return None
    return current.linear_tuner(x.device.type, x.device.index or 0, n, k, (block_n, block_k),
                                activation_scales, out_dtype, int(x.shape[0]))



def _unpack_ue8m0(packed: Tensor, mn: int, groups: int) -> Tensor:
    """float32 [mn, groups] from packed UE8M0 int32 [ceil(groups/4), round_up(mn, 4)]: K-group
    4p+i of row m is byte i (lowest first) of element (p, m). Torch ops, on packed's device."""
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=packed.device)
    codes = (packed.unsqueeze(-1) >> shifts) & 0xFF  # [P, MN', 4]; the mask undoes sign fill
    codes = codes.permute(1, 0, 2).reshape(packed.shape[1], -1)[:mn, :groups]
    # 2^(e-127) as float32 bits: exponent field e; code 0 is the subnormal 2^-127, 0xFF NaN
    # (as mxq's e8m0_to_float).
    bits = torch.where(codes == 0, 1 << 22, codes << 23)
    return torch.where(codes == 0xFF, 0x7FC00000, bits).view(_F32)


def _dequantized_weight(weight: Tensor, weight_scale: Tensor, block_n: int, block_k: int) -> Tensor:
    """float32 W [N, K]: the E4M3 codes times their block's scale (torch ops, on W's device)."""
    n, k = weight.shape
    scale = weight_scale
    if scale.dtype == torch.int32:
        scale = _unpack_ue8m0(scale, _ceil_div(n, block_n), _ceil_div(k, block_k))
    scale = scale.repeat_interleave(block_n, 0)[:n].repeat_interleave(block_k, 1)[:, :k]
    return weight.view(_E4M3).float() * scale


def _linear_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    x, weight, weight_scale, block_n, block_k, bias = inputs[:6]
    ctx.save_for_backward(weight, weight_scale)
    ctx.x_meta = (x.shape, x.dtype)
    ctx.block = (block_n, block_k)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _linear_backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
    """Straight-through estimate: the activation quantization counts as the identity, so
    grad_x = grad_y W (W dequantized, float32) and grad_bias = grad_y summed over the tokens.
    The weight and its scales are frozen (no gradient), as for LoRA on an FP8 model."""
    weight, weight_scale = ctx.saved_tensors
    grad = grad.reshape(-1, weight.shape[0]).float()
    # needs_input_grad covers the arguments passed: the dispatcher drops trailing defaults.
    needs_grad = tuple(ctx.needs_input_grad) + (False,) * 9
    grad_x = grad_bias = None
    if needs_grad[0]:
        w = _dequantized_weight(weight, weight_scale, *ctx.block)
        grad_x = (grad @ w).to(ctx.x_meta[1]).reshape(ctx.x_meta[0])
    if needs_grad[5]:
        grad_bias = grad.sum(0).to(ctx.bias_dtype)
    return grad_x, None, None, None, None, grad_bias, None, None, None


block_fp8_linear.register_autograd(_linear_backward, setup_context=_linear_setup_context)



# --- modules ----------------------------------------------------------------------------------

def _host_bias(bias: Any) -> Optional[Tensor]:
    """A torch copy of an mxq.BlockFp8Linear's host bias (NumPy float32, ml_dtypes bfloat16 or
    a torch tensor), its dtype kept."""
    if bias is None:
        return None
    if isinstance(bias, Tensor):
        return bias.detach().clone()
    array = np.array(bias)  # a copy, as for the codes and scales
    if array.dtype.name == "bfloat16":  # ml_dtypes: torch.from_numpy does not know it
        return _from_numpy(array, _BF16)
    return torch.from_numpy(array)


class BlockFp8Linear(torch.nn.Module):
    """``torch.ops.mxq.block_fp8_linear`` with its weight as buffers (moved by ``.to()``,
    saved in ``state_dict``): E4M3 ``weight`` [N, K], ``weight_scale`` (float32 block scales or
    packed UE8M0 int32), optional ``bias`` [N] (bfloat16 or float32).

    The buffers keep their dtypes: ``model.half()``, ``.bfloat16()``, ``.float()``,
    ``.double()`` and ``.to(dtype)`` leave this layer's buffers as they are (the op needs E4M3
    codes; rounding the scales would change the weight), while device moves (``.to(device)``,
    ``.cuda()``, ``.to("meta")``) and ``.to_empty()`` / ``.share_memory()`` apply. Its gradient
    (autograd): for x (straight-through) and the bias; the weight and scales are frozen."""

    def __init__(self, weight: Tensor, weight_scale: Tensor, block: Sequence[int] = (128, 128),
                 bias: Optional[Tensor] = None, activation_scales: str = "fp32",
                 out_dtype: str = "bf16") -> None:
        super().__init__()
        self.block_n, self.block_k = (int(v) for v in block)
        self.activation_scales = activation_scales
        self.out_dtype = out_dtype
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_mxq(cls, linear: Any, **kwargs: Any) -> "BlockFp8Linear":
        """From an :class:`mxq.BlockFp8Linear` on the host (its codes, scales and bias are
        copied; a bfloat16 or float32 bias keeps its dtype)."""
        q = torch.from_numpy(np.array(linear.q.view(np.uint8))).view(_E4M3)
        scale = torch.from_numpy(np.array(linear.scale))
        return cls(q, scale, tuple(linear.block), _host_bias(linear.bias), **kwargs)

    def _apply(self, fn: Any, recurse: bool = True) -> "BlockFp8Linear":
        """Module.to() and friends, minus dtype changes: ``fn`` applies to a buffer when it keeps
        the dtype, else only its device move does (no round trip through the new dtype: lossy
        for scales, and a transient copy of the weight)."""

        def keep_dtype(t: Tensor) -> Tensor:
            probe = fn(torch.empty(1, dtype=t.dtype, device=t.device))  # where fn sends t
            return fn(t) if probe.dtype == t.dtype else t.to(device=probe.device)

        return super()._apply(keep_dtype, recurse)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mxq.block_fp8_linear(x, self.weight, self.weight_scale, self.block_n,
                                              self.block_k, self.bias, self.activation_scales,
                                              self.out_dtype)

    def extra_repr(self) -> str:
        n, k = self.weight.shape
        return f"N={n}, K={k}, block={self.block_n}x{self.block_k}, out={self.out_dtype}"


