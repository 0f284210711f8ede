"""PyTorch custom ops ``torch.ops.mxq.*`` over mxq (``import mxq.torch_ops`` registers them).

mxq itself never imports torch; this module does, and registers with ``torch.library``:

========================================  =========  =====  ===================================
op                                        CPU        CUDA   result
========================================  =========  =====  ===================================
``moe_forward(x, layer, ids?, weights?)``  yes        yes    [T, H] in x's dtype (CUDA: bf16)
``block_fp8_linear(x, w, w_scale, ...)``   yes        yes    [..., N] bf16 or float32
``quantize_fp8_groups(x, group_k, mode)``  yes        yes    (e4m3 [M, K], float32 [M, G])
``quantize_mxfp4`` / ``dequantize_mxfp4``  yes        no     (uint8 [..., G, 16], e8m0 [..., G])
``e4m3_encode`` / ``e4m3_decode``          yes        no     float8_e4m3fn / float32
``quantize_fp8_block`` / ``dequantize_…``  yes        no     (e4m3 [N, K], float32 blocks)
========================================  =========  =====  ===================================

Each op has a fake (shape-only) implementation, so ``torch.compile(fullgraph=True)`` traces
modules calling them (dynamic shapes included); ``torch.library.opcheck`` passes for the ops
without float8 inputs.

* **Autograd.** ``block_fp8_linear`` has a gradient for x and the bias: the straight-through
  estimate grad_x = grad_y W, W dequantized (E4M3 codes times block scales, float32) with torch
  ops on the weight's device (the activation quantization inside the op counts as the
  identity; the weight and scales are frozen, no gradient: LoRA on an FP8 model), and
  grad_bias = grad_y summed over the leading dims. Every other op taking a floating tensor has
  a formula that fails when a backward reaches it (``mxq.Error``, code "unsupported": "mxq.OP
  has no gradient (...)"), so with inputs that require grad their forward runs and compiles
  (``fullgraph=True``); only the backward raises, eager and compiled alike.
* **Tensors in** are read in place through DLPack (no copy); float8 tensors travel as uint8
  views of the same bytes. **Results** on the CPU are NumPy arrays owned by mxq, wrapped by
  ``torch.from_numpy`` (no copy). On CUDA the work is queued on torch's *current stream* of the
  input's device (``torch.cuda.current_stream(x.device).cuda_stream`` goes to the C++ op as its
  ``cudaStream_t``) and nothing synchronizes the host. ``moe_forward`` writes into an output
  that torch allocates; ``block_fp8_linear`` and ``quantize_fp8_groups`` return memory that
  mxq's C++ op allocated (cudaMalloc, handed over through DLPack; freeing it waits for the
  device) until the C++ linear op takes an output buffer.
* **Bad arguments** raise :class:`mxq.DtypeError` (a ``TypeError``; code "dtype_mismatch")
  or :class:`mxq.InvalidArgumentError` (a ``ValueError``; code "shape_mismatch",
  "device_mismatch" or "invalid_argument") naming the argument, in the real and in the fake
  implementation, as mxq's C++ core would.
* **BlockFp8Linear** keeps its buffers' dtypes under ``model.half()`` / ``.to(dtype)``; device
  moves apply.
* **The MoE layer** is not a tensor: its weights live in an :class:`mxq.MoELayer` (every
  simulated rank, plus a copy per CUDA device made on first use, see ``MoELayer.cuda``). The
  op takes the layer's integer ``handle`` (``layer.handle``) — a plain int in the graph, so
  tracing, opcheck and CUDA graphs see only tensors and constants; the registry holds layers
  weakly and never reuses a handle, so a freed layer's handle fails clearly. (A
  ``torch.classes`` custom class would make the layer a graph input but needs a C++ torch
  extension; a handle keeps mxq free of a libtorch build dependency.) :class:`MoE` wraps it.
* Inside :func:`mxq.autotune`, ``block_fp8_linear(..., tactic="auto")`` and ``moe_forward``
  on the tuner's device run the tuner's decisions (tuning the problem first in tune mode; on
  the CPU, ``moe_forward`` tunes each rank's expert tiling as ``MoELayer.forward`` does).
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from . import _mxq
from . import tune as _tune
from ._errors import DtypeError, Error, InvalidArgumentError
from .moe import MoELayer, layer_from_handle

__all__ = [
    "BlockFp8Linear",
    "MoE",
    "block_fp8_linear",
    "dequantize_fp8_block",
    "dequantize_mxfp4",
    "e4m3_decode",
    "e4m3_encode",
    "moe_forward",
    "quantize_fp8_block",
    "quantize_fp8_groups",
    "quantize_mxfp4",
]

_F32, _BF16, _U8 = torch.float32, torch.bfloat16, torch.uint8
_E4M3 = torch.float8_e4m3fn
_E8M0 = getattr(torch, "float8_e8m0fnu", None)  # torch >= 2.7
_OUT_DTYPES = {"bf16": _BF16, "f32": _F32}


# --- argument checks (shared by the real and the fake implementations) ---------------------

def _names(dtypes: Sequence[torch.dtype]) -> str:
    names = [str(d).replace("torch.", "") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _check(t: Any, name: str, dtypes: Sequence[Optional[torch.dtype]], ndim: Optional[int] = None,
           min_ndim: int = 0) -> Tensor:
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
    if not t.is_contiguous():
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


_no_scope = contextlib.nullcontext


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
        from . import formats

        q, scale = formats.quantize_fp8_groups(x, group_k, scale_mode)
        return _from_numpy(q, _E4M3), _from_numpy(scale, _F32)
    with torch.cuda.device(x.device):
        q, scale = _mxq.quantize_activations(x, group_k, scale_mode, _stream(x))
        return _from_device(q, _E4M3), _from_device(scale, _F32)


@quantize_fp8_groups.register_fake
def _(x, group_k=128, scale_mode="fp32"):
    _check_quantize_fp8_groups(x, group_k)
    m, k = x.shape
    return x.new_empty((m, k), dtype=_E4M3), x.new_empty((m, _ceil_div(k, group_k)), dtype=_F32)


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


# --- MoE --------------------------------------------------------------------------------------

def _check_moe(x: Tensor, layer: int, expert_ids: Optional[Tensor],
               expert_weights: Optional[Tensor]) -> MoELayer:
    moe = layer_from_handle(layer)
    config = moe.config
    _check(x, "x", (_BF16,) if x.device.type == "cuda" else (_F32, _BF16), ndim=2)
    _check_size(x.shape[1] == config["hidden_size"],
                f"x: expected [T, {config['hidden_size']}] (the layer's hidden size), "
                f"found {list(x.shape)}")
    if (expert_ids is None) != (expert_weights is None):
        raise InvalidArgumentError("expert_ids and expert_weights: give both or neither (found "
                                   "only one)")
    if expert_ids is not None:
        _check(expert_ids, "expert_ids", (torch.int32,), ndim=2)
        _check(expert_weights, "expert_weights", (_F32,), ndim=2)
        _check_device(expert_ids, "expert_ids", x.device)
        _check_device(expert_weights, "expert_weights", x.device)
        for name, t in (("expert_ids", expert_ids), ("expert_weights", expert_weights)):
            for dim, want in ((0, x.shape[0]), (1, config["top_k"])):
                _check_size(t.shape[dim] == want,
                            f"{name}: expected [T, top_k] = [{x.shape[0]}, {config['top_k']}], "
                            f"found {list(t.shape)}")
    return moe


@torch.library.custom_op("mxq::moe_forward", mutates_args=(), device_types=("cpu", "cuda"))
def moe_forward(x: Tensor, layer: int, expert_ids: Optional[Tensor] = None,
                expert_weights: Optional[Tensor] = None) -> Tensor:
    """The MXFP4 MoE layer ``layer`` (an :attr:`mxq.MoELayer.handle`) on x [T, H]: router (or
    the given expert_ids int32 / expert_weights float32 [T, top_k]), experts, combine, summed
    over the simulated ranks and rounded once to bf16. Returns [T, H] in x's dtype (CPU: float32
    or bfloat16; CUDA: bfloat16). On CUDA, runs the layer's copy on x's device on torch's
    current stream, writing into a tensor from torch's allocator."""
    moe = _check_moe(x, layer, expert_ids, expert_weights)
    if x.device.type == "cuda":
        out = torch.empty_like(x)
        if x.shape[0] > 0:
            moe.forward_cuda(x, out, expert_ids, expert_weights, _stream(x))
        return out
    if x.shape[0] == 0:
        return torch.empty_like(x)
    # Inside mxq.autotune(device="cpu"), the tuner picks each rank's expert tiling (as in
    # MoELayer.forward).
    result = moe._core.forward(x, expert_ids, expert_weights, moe._cpu_tuner(x))
    y = _from_numpy(result["output"], _F32)
    return y if x.dtype == _F32 else y.to(x.dtype)  # exact: every value is a bf16


@moe_forward.register_fake
def _(x, layer, expert_ids=None, expert_weights=None):
    _check_moe(x, layer, expert_ids, expert_weights)
    return torch.empty_like(x)


# --- host-only ops: CUDA tensors are refused naming the argument ------------------------------

_register_cpu_only(quantize_mxfp4, "quantize_mxfp4", ("x",))
_register_cpu_only(dequantize_mxfp4, "dequantize_mxfp4", ("blocks", "scales"))
_register_cpu_only(e4m3_encode, "e4m3_encode", ("x",))
_register_cpu_only(e4m3_decode, "e4m3_decode", ("codes",))
_register_cpu_only(quantize_fp8_block, "quantize_fp8_block", ("x",))
_register_cpu_only(dequantize_fp8_block, "dequantize_fp8_block", ("q", "scale"))


# --- autograd -------------------------------------------------------------------------------
#
# Every op with a floating input has a formula: without one, autograd lets a requires-grad
# input give requires-grad outputs (float8 and e8m0 ones too) and torch.compile fails while
# tracing the backward. block_fp8_linear has a gradient; the others fail clearly when a backward
# reaches them, so their forward still runs and compiles with requires-grad inputs.

_QUANTIZE = "quantization is piecewise constant; detach the input or run it under torch.no_grad()"
_DEQUANTIZE = ("mxq's dequantization is for inference; detach the codes and scales or run it under "
               "torch.no_grad()")
_NO_GRADIENT_REASONS = {
    "moe_forward": "mxq's MoE op is for inference; run it under torch.no_grad()",
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


_register_no_gradient(moe_forward, "moe_forward")
_register_no_gradient(quantize_mxfp4, "quantize_mxfp4")
_register_no_gradient(quantize_fp8_block, "quantize_fp8_block")
_register_no_gradient(quantize_fp8_groups, "quantize_fp8_groups")
_register_no_gradient(e4m3_encode, "e4m3_encode")
_register_no_gradient(dequantize_mxfp4, "dequantize_mxfp4")
_register_no_gradient(dequantize_fp8_block, "dequantize_fp8_block")
_register_no_gradient(e4m3_decode, "e4m3_decode")


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


class MoE(torch.nn.Module):
    """``torch.ops.mxq.moe_forward`` over an :class:`mxq.MoELayer` (held here, so the handle
    stays valid while the module lives). The weights are not buffers: on CUDA the layer uploads
    a copy to the input's device on first use (``layer.cuda(device, max_tokens)`` does it
    ahead of time)."""

    def __init__(self, layer: MoELayer) -> None:
        super().__init__()
        self.layer = layer
        self.handle = layer.handle  # a plain int: a constant in traced graphs

    def forward(self, x: Tensor, expert_ids: Optional[Tensor] = None,
                expert_weights: Optional[Tensor] = None) -> Tensor:
        return torch.ops.mxq.moe_forward(x, self.handle, expert_ids, expert_weights)

    def extra_repr(self) -> str:
        return f"{self.layer!r}, handle={self.handle}"
