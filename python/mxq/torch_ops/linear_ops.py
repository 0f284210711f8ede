"""The block-FP8 linear op, its straight-through gradient, and the BlockFp8Linear module."""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .. import _mxq
from .. import tune as _tune
from .._errors import DtypeError
from ._common import (
    _BF16,
    _E4M3,
    _F32,
    _U8,
    _ceil_div,
    _check,
    _check_device,
    _check_size,
    _codes,
    _from_numpy,
    _stream,
)
from .format_ops import _check_block


# --- block-FP8 linear -----------------------------------------------------------------------
#
# Three ops over mxq::linear::linear_into (docs/linear.md, "The linear as engines call it"):
#   block_fp8_linear       bf16 x -> a new output tensor (torch's allocator), with a gradient;
#   block_fp8_linear_out   bf16 x -> the caller's `out`;
#   fp8_gemm_nt            pre-quantized (x_q, x_scale) -> the caller's `out` (DeepGEMM's call).
# A custom op may not return an input, so writing into `out` is an op of its own that mutates it
# and returns nothing. Temporaries come from torch's caching allocator (a workspace of the size
# mxq asks for, requested only when the call needs one), CUDA work goes on torch's current
# stream, and nothing allocates with cudaMalloc or synchronizes: the ops can be captured in a
# CUDA graph.

_OUT = (_BF16, _F32)


def _check_weight(weight: Tensor, weight_scale: Tensor, block_n: int, block_k: int,
                  bias: Optional[Tensor], device: torch.device) -> None:
    _check(weight, "weight", (_E4M3, _U8), ndim=2)
    _check(weight_scale, "weight_scale", (_F32, torch.int32), ndim=2)
    _check_block(block_n, block_k)
    if bias is not None:
        _check(bias, "bias", (_BF16, _F32), ndim=1)
    for name, t in (("weight", weight), ("weight_scale", weight_scale), ("bias", bias)):
        _check_device(t, name, device)
    if bias is not None:
        _check_size(bias.shape[0] == weight.shape[0],
                    f"bias: expected shape [{weight.shape[0]}], found {list(bias.shape)}")


def _check_out_dtype(out_dtype: Any) -> None:
    if out_dtype not in _OUT:
        raise DtypeError(f"out_dtype: expected torch.bfloat16 or torch.float32, found "
                         f"{out_dtype!r}")


def _check_out(out: Tensor, lead: Sequence[Any], n: int, device: torch.device) -> None:
    _check(out, "out", _OUT, ndim=len(lead) + 1)
    _check_device(out, "out", device)
    want = (*lead, n)
    for have, size in zip(out.shape, want):
        _check_size(have == size, f"out: expected shape {list(want)}, found {list(out.shape)}")


def _check_linear(x: Tensor, weight: Tensor, weight_scale: Tensor, block_n: int, block_k: int,
                  bias: Optional[Tensor]) -> None:
    _check(x, "x", (_BF16,), min_ndim=1)
    _check_weight(weight, weight_scale, block_n, block_k, bias, x.device)
    _check_size(x.shape[-1] == weight.shape[1],
                f"x: expected K = {weight.shape[1]} columns (the weight is {list(weight.shape)}), "
                f"found shape {list(x.shape)}")


def _check_fp8_gemm(x_q: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor,
                    out: Tensor, block_n: int, block_k: int, bias: Optional[Tensor]) -> None:
    """What the shapes say. x_scale may have any strides: MN-major ones are read in place, others
    copied by the op (so the strides torch.compile gives a traced tensor never matter)."""
    _check(x_q, "x_q", (_E4M3, _U8), ndim=2)
    _check(x_scale, "x_scale", (_F32, torch.int32), ndim=2, contiguous=False)
    _check_device(x_scale, "x_scale", x_q.device)
    _check_weight(weight, weight_scale, block_n, block_k, bias, x_q.device)
    m, k = x_q.shape
    _check_size(k == weight.shape[1],
                f"x_q: expected K = {weight.shape[1]} columns (the weight is "
                f"{list(weight.shape)}), found shape {list(x_q.shape)}")
    groups = _ceil_div(k, block_k)
    if x_scale.dtype == torch.int32:
        want = (_ceil_div(groups, 4), _ceil_div(m, 4) * 4)
        what = f"packed UE8M0 int32 {list(want)} for {m}x{groups} scales"
    else:
        want = (m, groups)
        what = f"float32 {list(want)} (one per 1x{block_k} group of x_q)"
    for have, size in zip(x_scale.shape, want):
        _check_size(have == size, f"x_scale: expected {what}, found {list(x_scale.shape)}")
    _check_out(out, (m,), weight.shape[0], x_q.device)


# The weight as mxq's C++ op takes it (a BlockFp8Weight over the tensors' memory), made on a
# tensor's first use and reused while the tensors still describe the same memory: the DLPack
# export and the validation of a module's weight happen once, not on every forward. Keyed weakly
# by the weight tensor (the entry goes when the tensor does); the wrapper is a view that holds no
# reference to the tensors (no cycle), so it is only used while the caller passes them.
_WRAPPED_WEIGHTS = torch.utils.weak.WeakIdKeyDictionary()


def _weight_key(weight: Tensor, weight_scale: Tensor, block: Tuple[int, int]) -> Tuple[Any, ...]:
    return (weight.data_ptr(), weight.shape, weight.device, weight_scale.data_ptr(),
            weight_scale.shape, weight_scale.dtype, block)


def _wrapped_weight(weight: Tensor, weight_scale: Tensor, block_n: int, block_k: int) -> Any:
    key = _weight_key(weight, weight_scale, (block_n, block_k))
    entry = _WRAPPED_WEIGHTS.get(weight)
    if entry is not None and entry[0] == key:
        return entry[1]
    wrapped = _mxq.BlockFp8Weight.view(_codes(weight), weight_scale, (block_n, block_k))
    _WRAPPED_WEIGHTS[weight] = (key, wrapped)
    return wrapped


def _linear_tuning(device: torch.device, m: int, n: int, k: int, block: Tuple[int, int],
                   activation_scales: str, out_dtype: torch.dtype,
                   tactic: str) -> Tuple[Optional[Any], Optional[Any]]:
    """The current mxq.autotune() tuner and its problem when it serves this call (the problem
    tuned first in tune mode); (None, None) otherwise."""
    current = _tune.current()
    if current is None or tactic != "auto":
        return None, None
    found = current.linear_tuning(device.type, device.index or 0, n, k, block, activation_scales,
                                  "bf16" if out_dtype == _BF16 else "f32", m)
    return found if found is not None else (None, None)


def _run(x: Optional[Tensor], x_q: Optional[Tensor], x_scale: Optional[Tensor], weight: Tensor,
         weight_scale: Tensor, out: Tensor, block_n: int, block_k: int, bias: Optional[Tensor],
         activation_scales: str, tactic: str) -> None:
    """mxq::linear::linear_into on 2-D tensors: x (bf16) or (x_q, x_scale) into out."""
    rows = x if x is not None else x_q
    if rows.shape[0] == 0:
        return
    n, k = weight.shape
    w = _wrapped_weight(weight, weight_scale, block_n, block_k)
    tuner, problem = _linear_tuning(rows.device, rows.shape[0], n, k, (block_n, block_k),
                                    activation_scales, out.dtype, tactic)
    cuda = rows.device.type == "cuda"
    stream = _stream(rows) if cuda else 0
    workspace = functools.partial(torch.empty, dtype=_U8, device=rows.device)
    if x is not None:
        w.linear_into(x, out, workspace, bias, tactic, activation_scales, stream, tuner, problem)
    else:
        w.fp8_linear_into(_codes(x_q), x_scale, out, workspace, bias, tactic, activation_scales,
                          stream, tuner, problem)


@torch.library.custom_op("mxq::block_fp8_linear", mutates_args=(), device_types=("cpu", "cuda"))
def block_fp8_linear(x: Tensor, weight: Tensor, weight_scale: Tensor, block_n: int = 128,
                     block_k: int = 128, bias: Optional[Tensor] = None,
                     activation_scales: str = "fp32", out_dtype: torch.dtype = torch.bfloat16,
                     tactic: str = "auto") -> Tensor:
    """y [..., N] = x [..., K] W^T (+ bias), W block-FP8: E4M3 codes [N, K] with float32
    scales [ceil(N/bn), ceil(K/bk)] (or packed UE8M0 int32), x bfloat16 quantized per
    1 x block_k group inside the op. out_dtype torch.bfloat16 or torch.float32; the output comes
    from torch's allocator. The weight is read in place."""
    _check_linear(x, weight, weight_scale, block_n, block_k, bias)
    _check_out_dtype(out_dtype)
    n, k = weight.shape
    out = x.new_empty((*x.shape[:-1], n), dtype=out_dtype)
    _run(x.reshape(-1, k), None, None, weight, weight_scale, out.view(-1, n), block_n, block_k,
         bias, activation_scales, tactic)
    return out


@block_fp8_linear.register_fake
def _(x, weight, weight_scale, block_n=128, block_k=128, bias=None, activation_scales="fp32",
      out_dtype=torch.bfloat16, tactic="auto"):
    _check_linear(x, weight, weight_scale, block_n, block_k, bias)
    _check_out_dtype(out_dtype)
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=out_dtype)


@torch.library.custom_op("mxq::block_fp8_linear_out", mutates_args=("out",),
                         device_types=("cpu", "cuda"))
def block_fp8_linear_out(x: Tensor, weight: Tensor, weight_scale: Tensor, out: Tensor,
                         block_n: int = 128, block_k: int = 128, bias: Optional[Tensor] = None,
                         activation_scales: str = "fp32", tactic: str = "auto") -> None:
    """block_fp8_linear writing into the caller's ``out`` [..., N] (bfloat16 or float32,
    contiguous, x's leading dims; its dtype is the output's). Returns nothing: ``out`` holds the
    result. No gradient (an inference op)."""
    _check_linear(x, weight, weight_scale, block_n, block_k, bias)
    _check_out(out, x.shape[:-1], weight.shape[0], x.device)
    n, k = weight.shape
    _run(x.reshape(-1, k), None, None, weight, weight_scale, out.view(-1, n), block_n, block_k,
         bias, activation_scales, tactic)


@block_fp8_linear_out.register_fake
def _(x, weight, weight_scale, out, block_n=128, block_k=128, bias=None, activation_scales="fp32",
      tactic="auto"):
    _check_linear(x, weight, weight_scale, block_n, block_k, bias)
    _check_out(out, x.shape[:-1], weight.shape[0], x.device)


@torch.library.custom_op("mxq::fp8_gemm_nt", mutates_args=("out",), device_types=("cpu", "cuda"))
def fp8_gemm_nt(x_q: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor, out: Tensor,
                block_n: int = 128, block_k: int = 128, bias: Optional[Tensor] = None,
                tactic: str = "auto") -> None:
    """out [M, N] = (x_q, x_scale) (weight, weight_scale)^T (+ bias): DeepGEMM's
    ``fp8_gemm_nt((x_q, x_scale), (weight, weight_scale), out)`` on pre-quantized activations.
    x_q float8_e4m3fn (or uint8 codes) [M, K]; x_scale one scale per 1 x block_k group: float32
    [M, G] row-major (vLLM's per_token_group_quant_fp8) or MN-major (element (m, g) at
    m + g * ld, ld >= M a multiple of 4: DeepGEMM's TMA-aligned layout, read in place), or
    packed UE8M0 int32 [ceil(G/4), round_up(M, 4)]; out bfloat16 or float32 [M, N], contiguous.
    Returns nothing. No gradient (an inference op)."""
    _check_fp8_gemm(x_q, x_scale, weight, weight_scale, out, block_n, block_k, bias)
    _run(None, x_q, x_scale, weight, weight_scale, out, block_n, block_k, bias, "fp32", tactic)


@fp8_gemm_nt.register_fake
def _(x_q, x_scale, weight, weight_scale, out, block_n=128, block_k=128, bias=None,
      tactic="auto"):
    _check_fp8_gemm(x_q, x_scale, weight, weight_scale, out, block_n, block_k, bias)


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
    (autograd): for x (straight-through) and the bias; the weight and scales are frozen.

    ``forward(x, out=t)`` writes into ``t`` (``torch.ops.mxq.block_fp8_linear_out``; no
    gradient) and returns it. The op wraps the weight buffers for mxq once and reuses that while
    they stay the same tensors over the same memory (a device move makes new ones)."""

    def __init__(self, weight: Tensor, weight_scale: Tensor, block: Sequence[int] = (128, 128),
                 bias: Optional[Tensor] = None, activation_scales: str = "fp32",
                 out_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        _check_out_dtype(out_dtype)
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

    def forward(self, x: Tensor, out: Optional[Tensor] = None) -> Tensor:
        if out is not None:
            torch.ops.mxq.block_fp8_linear_out(x, self.weight, self.weight_scale, out,
                                               self.block_n, self.block_k, self.bias,
                                               self.activation_scales)
            return out
        return torch.ops.mxq.block_fp8_linear(x, self.weight, self.weight_scale, self.block_n,
                                              self.block_k, self.bias, self.activation_scales,
                                              self.out_dtype)

    def extra_repr(self) -> str:
        n, k = self.weight.shape
        return f"N={n}, K={k}, block={self.block_n}x{self.block_k}, out={self.out_dtype}"


