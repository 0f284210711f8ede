"""The engine-facing MXFP4 MoE ops (mxq/moe/mxfp4_moe.h) and the Mxfp4MoE module.

``torch.ops.mxq.mxfp4_moe_prepare`` turns a checkpoint's expert tensors into one rank's prepared
tensors; ``torch.ops.mxq.mxfp4_moe`` runs one rank's forward on them and returns its partial;
``torch.ops.mxq.moe_route`` is the router alone. Every tensor is the caller's (torch allocates
what the ops return, on the inputs' device); CUDA work runs on torch's current stream with no
host synchronization, so the forward can be captured in a CUDA graph. docs/engines.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .. import _mxq
from .._errors import InvalidArgumentError
from ._common import (
    _BF16,
    _F32,
    _U8,
    _check,
    _check_device,
    _check_size,
    _codes,
    _from_numpy,
    _register_no_gradient,
    _stream,
)

_OUT_DTYPES = (_BF16, _F32)


def _layer(num_experts: int, hidden_size: int, intermediate_size: int, has_bias: bool):
    return (int(num_experts), int(hidden_size), int(intermediate_size), bool(has_bias))


def _rank(tp_rank: int, tp_size: int, ep_rank: int, ep_size: int, alignment: int,
          activation_quant: str):
    return (int(tp_rank), int(tp_size), int(ep_rank), int(ep_size), int(alignment),
            str(activation_quant))


def prepared_shapes(num_experts: int, hidden_size: int, intermediate_size: int,
                    has_bias: bool = True, tp_rank: int = 0, tp_size: int = 1, ep_rank: int = 0,
                    ep_size: int = 1, alignment: int = 128,
                    activation_quant: str = "bf16") -> Dict[str, Any]:
    """The shapes of one rank's prepared tensors (``w13``, ``w13_scale``, ``w13_bias``, ``w2``,
    ``w2_scale``, ``w2_bias``; uint8 / uint8 / bfloat16 / uint8 / uint8 / bfloat16) and its
    shards: ``intermediate_size_per_partition`` (unpadded), ``..._after_pad``,
    ``intermediate_valid``, ``first_local_expert``, ``experts_local``."""
    return _mxq.moe_prepared_shapes(_layer(num_experts, hidden_size, intermediate_size, has_bias),
                                    _rank(tp_rank, tp_size, ep_rank, ep_size, alignment,
                                          activation_quant))


_PREPARED = ("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias")
_PREPARED_DTYPES = (_U8, _U8, _BF16, _U8, _U8, _BF16)


def _empty_prepared(shapes: Dict[str, Any], has_bias: bool, device: torch.device) -> List[Tensor]:
    out = []
    for name, dtype in zip(_PREPARED, _PREPARED_DTYPES):
        shape = shapes[name] if has_bias or not name.endswith("bias") else (0,)
        out.append(torch.empty(shape, dtype=dtype, device=device))
    return out


# --- preparation --------------------------------------------------------------------------------

@torch.library.custom_op("mxq::mxfp4_moe_prepare", mutates_args=(), device_types=("cpu", "cuda"))
def mxfp4_moe_prepare(w13: Tensor, w13_scale: Tensor, w13_bias: Optional[Tensor], w2: Tensor,
                      w2_scale: Tensor, w2_bias: Optional[Tensor], num_experts: int,
                      intermediate_size: int, tp_rank: int = 0, tp_size: int = 1,
                      ep_rank: int = 0, ep_size: int = 1, alignment: int = 128,
                      activation_quant: str = "bf16", layout: str = "native") -> List[Tensor]:
    """One rank's prepared tensors [w13, w13_scale, w13_bias, w2, w2_scale, w2_bias] from a
    checkpoint's expert tensors, on their device: ``layout`` "gpt-oss" (``*_blocks`` /
    ``*_scales`` / ``*_bias``, gate and up rows interleaved) or "native" (w13 [E, 2I, H/2] with
    the gate rows then the up rows, as vLLM and SGLang hold them after loading), for every
    expert or only this rank's, over the whole intermediate size or only this rank's channels.
    Without biases (``w13_bias`` None) the bias outputs are empty. Scales may be uint8 or
    float8_e8m0fnu."""
    has_bias = w13_bias is not None
    hidden = w13.shape[2] * (2 if w13.dim() == 3 else 32)
    shapes = prepared_shapes(num_experts, hidden, intermediate_size, has_bias, tp_rank, tp_size,
                             ep_rank, ep_size, alignment, activation_quant)
    out = _empty_prepared(shapes, has_bias, w13.device)
    stream = _stream(w13) if w13.device.type == "cuda" else 0
    _mxq.moe_prepare(layout, w13, _codes(w13_scale), w13_bias, w2, _codes(w2_scale), w2_bias,
                     out[0], out[1], out[2] if has_bias else None, out[3], out[4],
                     out[5] if has_bias else None,
                     _layer(num_experts, hidden, intermediate_size, has_bias),
                     _rank(tp_rank, tp_size, ep_rank, ep_size, alignment, activation_quant),
                     stream)
    return out


@mxfp4_moe_prepare.register_fake
def _(w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, num_experts, intermediate_size,
      tp_rank=0, tp_size=1, ep_rank=0, ep_size=1, alignment=128, activation_quant="bf16",
      layout="native"):
    hidden = w13.shape[2] * (2 if w13.dim() == 3 else 32)
    shapes = prepared_shapes(num_experts, hidden, intermediate_size, w13_bias is not None,
                             tp_rank, tp_size, ep_rank, ep_size, alignment, activation_quant)
    return _empty_prepared(shapes, w13_bias is not None, w13.device)


# --- forward ------------------------------------------------------------------------------------

def _check_forward(x: Tensor, w13: Tensor, topk_ids: Optional[Tensor],
                   topk_weights: Optional[Tensor], router_weight: Optional[Tensor],
                   top_k: int, out_dtype: torch.dtype) -> None:
    _check(x, "x", (_BF16,) if x.device.type == "cuda" else (_F32, _BF16), ndim=2)
    _check_device(w13, "w13", x.device)
    hidden = w13.shape[2] * 2
    _check_size(x.shape[1] == hidden, f"x: expected [T, {hidden}] (the prepared w13's hidden "
                f"size), found {list(x.shape)}")
    if (topk_ids is None) == (router_weight is None):
        raise InvalidArgumentError("routing: give either topk_ids and topk_weights, or "
                                   "router_weight" + (" (found both)" if topk_ids is not None
                                                      else " (found neither)"))
    if topk_ids is not None:
        if topk_weights is None:
            raise InvalidArgumentError("topk_weights: expected a tensor with topk_ids, found None")
        for name, t, dtype in (("topk_ids", topk_ids, torch.int32),
                               ("topk_weights", topk_weights, _F32)):
            _check(t, name, (dtype,), ndim=2)
            _check_device(t, name, x.device)
            _check_size(t.shape[0] == x.shape[0] and t.shape[1] == top_k,
                        f"{name}: expected [T, top_k] = [{x.shape[0]}, {top_k}], found "
                        f"{list(t.shape)}")
    if out_dtype not in _OUT_DTYPES:
        raise InvalidArgumentError(f"out_dtype: expected torch.bfloat16 or torch.float32, found "
                                   f"{out_dtype}")


def _run(x: Tensor, prepared: Tuple[Any, ...], routing: Tuple[Any, ...], out: Tensor,
         workspace: Optional[Tensor], num_experts: int, intermediate_size: int, top_k: int,
         rank: Tuple[Any, ...], activation: str, swiglu_alpha: float, swiglu_limit: float,
         add_down_bias: bool, max_tokens: int, gemm: str) -> None:
    w13, w13_scale, w13_bias, w2, w2_scale, w2_bias = prepared
    layer = _layer(num_experts, x.shape[1], intermediate_size, w13_bias is not None)
    cuda = x.device.type == "cuda"
    if cuda and workspace is None:
        max_tokens = max(max_tokens, x.shape[0], 1)
        size = _mxq.moe_workspace_bytes(layer, rank, top_k, max_tokens, True)
        workspace = torch.zeros(size, dtype=_U8, device=x.device)
    _mxq.mxfp4_moe(x, w13, _codes(w13_scale), w13_bias, w2, _codes(w2_scale), w2_bias, *routing,
                   out, workspace if cuda else None, layer, rank, top_k, activation,
                   swiglu_alpha, swiglu_limit, add_down_bias, max_tokens, gemm,
                   _stream(x) if cuda else 0)


@torch.library.custom_op("mxq::mxfp4_moe", mutates_args=(), device_types=("cpu", "cuda"))
def mxfp4_moe(x: Tensor, w13: Tensor, w13_scale: Tensor, w13_bias: Optional[Tensor], w2: Tensor,
              w2_scale: Tensor, w2_bias: Optional[Tensor], topk_ids: Optional[Tensor],
              topk_weights: Optional[Tensor], router_weight: Optional[Tensor],
              router_bias: Optional[Tensor], num_experts: int, intermediate_size: int,
              top_k: int, tp_rank: int = 0, tp_size: int = 1, ep_rank: int = 0,
              ep_size: int = 1, alignment: int = 128, activation: str = "swiglu_oai",
              swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0,
              activation_quant: str = "bf16", add_down_bias: bool = True,
              out_dtype: torch.dtype = _BF16, gemm: str = "auto") -> Tensor:
    """One rank's MXFP4 MoE forward on x [T, H] (bfloat16; CPU: or float32 holding bf16 values)
    with its prepared tensors (``mxfp4_moe_prepare``): routing by the engine (``topk_ids`` int32
    global ids, -1 = dropped, ``topk_weights`` float32 [T, top_k]) or by the gpt-oss router
    (``router_weight`` bfloat16 [E, H], ``router_bias``); returns this rank's partial [T, H] in
    ``out_dtype`` (bfloat16 rounded once, or float32 for the engine's all-reduce). On CUDA its
    workspace comes zeroed from torch's allocator each call; ``mxfp4_moe_into`` takes the
    caller's output and workspace instead (nothing allocated)."""
    _check_forward(x, w13, topk_ids, topk_weights, router_weight, top_k, out_dtype)
    out = torch.empty((x.shape[0], x.shape[1]), dtype=out_dtype, device=x.device)
    _run(x, (w13, w13_scale, w13_bias, w2, w2_scale, w2_bias),
         (topk_ids, topk_weights, router_weight, router_bias), out, None, num_experts,
         intermediate_size, top_k,
         _rank(tp_rank, tp_size, ep_rank, ep_size, alignment, activation_quant), activation,
         swiglu_alpha, swiglu_limit, add_down_bias, 0, gemm)
    return out


@mxfp4_moe.register_fake
def _(x, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, topk_ids, topk_weights, router_weight,
      router_bias, num_experts, intermediate_size, top_k, tp_rank=0, tp_size=1, ep_rank=0,
      ep_size=1, alignment=128, activation="swiglu_oai", swiglu_alpha=1.702, swiglu_limit=7.0,
      activation_quant="bf16", add_down_bias=True, out_dtype=_BF16, gemm="auto"):
    _check_forward(x, w13, topk_ids, topk_weights, router_weight, top_k, out_dtype)
    return x.new_empty((x.shape[0], x.shape[1]), dtype=out_dtype)


_register_no_gradient(mxfp4_moe, "mxfp4_moe")


@torch.library.custom_op("mxq::mxfp4_moe_into", mutates_args=("out", "workspace"),
                         device_types=("cpu", "cuda"))
def mxfp4_moe_into(x: Tensor, w13: Tensor, w13_scale: Tensor, w13_bias: Optional[Tensor],
                   w2: Tensor, w2_scale: Tensor, w2_bias: Optional[Tensor],
                   topk_ids: Optional[Tensor], topk_weights: Optional[Tensor],
                   router_weight: Optional[Tensor], router_bias: Optional[Tensor], out: Tensor,
                   workspace: Tensor, num_experts: int, intermediate_size: int, top_k: int,
                   max_tokens: int, tp_rank: int = 0, tp_size: int = 1, ep_rank: int = 0,
                   ep_size: int = 1, alignment: int = 128, activation: str = "swiglu_oai",
                   swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0,
                   activation_quant: str = "bf16", add_down_bias: bool = True,
                   gemm: str = "auto") -> None:
    """``mxfp4_moe`` into the caller's ``out`` [T, H] (bfloat16 or float32) with the caller's
    ``workspace`` (uint8, ``mxfp4_moe_workspace_bytes`` for ``max_tokens``, zeroed once: every
    call leaves it zeroed; an empty tensor on the CPU): nothing allocated, nothing synchronized,
    capturable in a CUDA graph."""
    _check_forward(x, w13, topk_ids, topk_weights, router_weight, top_k, out.dtype)
    _run(x, (w13, w13_scale, w13_bias, w2, w2_scale, w2_bias),
         (topk_ids, topk_weights, router_weight, router_bias), out, workspace, num_experts,
         intermediate_size, top_k,
         _rank(tp_rank, tp_size, ep_rank, ep_size, alignment, activation_quant), activation,
         swiglu_alpha, swiglu_limit, add_down_bias, max_tokens, gemm)


@mxfp4_moe_into.register_fake
def _(x, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, topk_ids, topk_weights, router_weight,
      router_bias, out, workspace, num_experts, intermediate_size, top_k, max_tokens, tp_rank=0,
      tp_size=1, ep_rank=0, ep_size=1, alignment=128, activation="swiglu_oai",
      swiglu_alpha=1.702, swiglu_limit=7.0, activation_quant="bf16", add_down_bias=True,
      gemm="auto"):
    _check_forward(x, w13, topk_ids, topk_weights, router_weight, top_k, out.dtype)


def mxfp4_moe_workspace_bytes(num_experts: int, hidden_size: int, intermediate_size: int,
                              top_k: int, max_tokens: int, has_bias: bool = True,
                              tp_rank: int = 0, tp_size: int = 1, ep_rank: int = 0,
                              ep_size: int = 1, alignment: int = 128,
                              activation_quant: str = "bf16", cuda: bool = True) -> int:
    """Bytes of workspace a CUDA forward of up to ``max_tokens`` tokens needs (0 on the CPU)."""
    return _mxq.moe_workspace_bytes(_layer(num_experts, hidden_size, intermediate_size, has_bias),
                                    _rank(tp_rank, tp_size, ep_rank, ep_size, alignment,
                                          activation_quant), top_k, max_tokens, cuda)


# --- routing ------------------------------------------------------------------------------------

@torch.library.custom_op("mxq::moe_route", mutates_args=(), device_types=("cpu", "cuda"))
def moe_route(x: Tensor, router_weight: Tensor, router_bias: Optional[Tensor],
              top_k: int) -> Tuple[Tensor, Tensor]:
    """The gpt-oss router alone, as ``mxfp4_moe`` routes: (topk_ids int32 [T, top_k] global
    expert ids, topk_weights float32 [T, top_k] the softmax over the k largest logits)."""
    _check(x, "x", (_BF16,) if x.device.type == "cuda" else (_F32, _BF16), ndim=2)
    _check_device(router_weight, "router_weight", x.device)
    ids = torch.empty((x.shape[0], top_k), dtype=torch.int32, device=x.device)
    weights = torch.empty((x.shape[0], top_k), dtype=_F32, device=x.device)
    cuda = x.device.type == "cuda"
    workspace, tokens = None, 0
    if cuda:  # zeroed, from torch's allocator
        tokens = max(x.shape[0], 1)
        size = _mxq.moe_route_workspace_bytes(router_weight.shape[0], x.shape[1], top_k, tokens,
                                              True)
        workspace = torch.zeros(size, dtype=_U8, device=x.device)
    _mxq.moe_route(x, router_weight, router_bias, top_k, ids, weights, workspace, tokens,
                   _stream(x) if cuda else 0)
    return ids, weights


@moe_route.register_fake
def _(x, router_weight, router_bias, top_k):
    return (x.new_empty((x.shape[0], top_k), dtype=torch.int32),
            x.new_empty((x.shape[0], top_k), dtype=_F32))


_register_no_gradient(moe_route, "moe_route")


# --- module -------------------------------------------------------------------------------------

class Mxfp4MoE(torch.nn.Module):
    """One rank of an MXFP4 MoE layer as torch sees it: the prepared tensors are buffers
    (``state_dict``, ``.to()``, memory accounting see them; they have one layout on every device,
    so moving the module moves them as they are), the forward is ``torch.ops.mxq.mxfp4_moe``.

    Build it with the layer's shape and this rank's place, then fill it with
    :meth:`load_experts` (again after a weight update: the same storage is rewritten, so captured
    CUDA graphs stay valid), or with :meth:`from_experts`. ``forward(x)`` routes with the router
    buffers when the module has them (``router=True``), else takes the engine's ``topk_ids`` and
    ``topk_weights``. With ``max_tokens`` > 0 on CUDA the module keeps a workspace for up to that
    many tokens (a non-persistent buffer), so a forward allocates nothing."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, top_k: int, *,
                 has_bias: bool = True, router: bool = True, tp_rank: int = 0, tp_size: int = 1,
                 ep_rank: int = 0, ep_size: int = 1, alignment: int = 128,
                 activation: str = "swiglu_oai", swiglu_alpha: float = 1.702,
                 swiglu_limit: float = 7.0, activation_quant: str = "bf16",
                 out_dtype: torch.dtype = _BF16, max_tokens: int = 0,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.num_experts, self.hidden_size = int(num_experts), int(hidden_size)
        self.intermediate_size, self.top_k = int(intermediate_size), int(top_k)
        self.has_bias = bool(has_bias)
        self.tp_rank, self.tp_size, self.ep_rank, self.ep_size = tp_rank, tp_size, ep_rank, ep_size
        self.alignment, self.activation_quant = int(alignment), activation_quant
        self.activation, self.swiglu_alpha, self.swiglu_limit = (activation, float(swiglu_alpha),
                                                                 float(swiglu_limit))
        self.out_dtype, self.max_tokens = out_dtype, int(max_tokens)
        self.shapes = prepared_shapes(num_experts, hidden_size, intermediate_size, has_bias,
                                      tp_rank, tp_size, ep_rank, ep_size, alignment,
                                      activation_quant)
        for name, tensor in zip(_PREPARED, _empty_prepared(self.shapes, self.has_bias,
                                                           torch.device(device or "cpu"))):
            self.register_buffer(name, tensor if self.has_bias or "bias" not in name else None)
        self.register_buffer("router_weight", torch.zeros(num_experts, hidden_size, dtype=_BF16,
                                                          device=device) if router else None)
        self.register_buffer("router_bias", torch.zeros(num_experts, dtype=_BF16, device=device)
                             if router and has_bias else None)
        self.register_buffer("workspace", None, persistent=False)

    @property
    def intermediate_size_per_partition(self) -> int:
        return self.shapes["intermediate_size_per_partition"]

    @property
    def intermediate_size_per_partition_after_pad(self) -> int:
        return self.shapes["intermediate_size_per_partition_after_pad"]

    @torch.no_grad()
    def load_experts(self, w13: Tensor, w13_scale: Tensor, w13_bias: Optional[Tensor], w2: Tensor,
                     w2_scale: Tensor, w2_bias: Optional[Tensor], layout: str = "native",
                     router_weight: Optional[Tensor] = None,
                     router_bias: Optional[Tensor] = None) -> "Mxfp4MoE":
        """Prepares the checkpoint's expert tensors (see ``mxfp4_moe_prepare``) into this
        module's buffers, in place (moved to the buffers' device first when elsewhere)."""
        device = self.w13.device
        inputs = [t if t is None else t.to(device) for t in (w13, w13_scale, w13_bias, w2,
                                                             w2_scale, w2_bias)]
        stream = _stream(self.w13) if device.type == "cuda" else 0
        _mxq.moe_prepare(layout, inputs[0], _codes(inputs[1]), inputs[2], inputs[3],
                         _codes(inputs[4]), inputs[5], self.w13, self.w13_scale, self.w13_bias,
                         self.w2, self.w2_scale, self.w2_bias,
                         _layer(self.num_experts, self.hidden_size, self.intermediate_size,
                                self.has_bias),
                         _rank(self.tp_rank, self.tp_size, self.ep_rank, self.ep_size,
                               self.alignment, self.activation_quant), stream)
        if router_weight is not None:
            self.router_weight.copy_(router_weight)
        if router_bias is not None:
            self.router_bias.copy_(router_bias)
        return self

    @classmethod
    def from_experts(cls, w13: Tensor, w13_scale: Tensor, w13_bias: Optional[Tensor], w2: Tensor,
                     w2_scale: Tensor, w2_bias: Optional[Tensor], *, num_experts: int,
                     intermediate_size: int, top_k: int, layout: str = "native",
                     router_weight: Optional[Tensor] = None,
                     router_bias: Optional[Tensor] = None, **kwargs: Any) -> "Mxfp4MoE":
        """A module holding the prepared ``w13``... of these expert tensors (on their device)."""
        hidden = w13.shape[2] * (2 if w13.dim() == 3 else 32)
        module = cls(num_experts, hidden, intermediate_size, top_k, has_bias=w13_bias is not None,
                     router=router_weight is not None, device=w13.device, **kwargs)
        return module.load_experts(w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, layout,
                                   router_weight, router_bias)

    @classmethod
    def from_checkpoint(cls, path: str, layer: int = 0, *, top_k: Optional[int] = None,
                        device: Optional[torch.device] = None, **kwargs: Any) -> "Mxfp4MoE":
        """This rank's module for layer ``layer`` of a checkpoint (a directory or .safetensors
        file, either layout, read by mxq's own reader: no safetensors package needed): its shape,
        activation and swiglu parameters from config.json (``top_k`` required without one), the
        rank's place and the rest (``tp_rank``, ``tp_size``, ``ep_rank``, ``ep_size``,
        ``alignment``, ``activation_quant``, ``out_dtype``, ``max_tokens``) as keywords. The
        prepared tensors are made on ``device`` (default: the CPU)."""
        read = _mxq.moe_checkpoint_experts(str(path), int(layer),
                                           None if top_k is None else int(top_k))
        config = read["config"]
        kwargs.setdefault("activation", config["activation"])
        kwargs.setdefault("swiglu_alpha", config["swiglu_alpha"])
        kwargs.setdefault("swiglu_limit", config["swiglu_limit"])
        kwargs.setdefault("activation_quant", config["activation_quant"])
        target = torch.device(device or "cpu")
        tensors = {name: None if read[name] is None
                   else _from_numpy(read[name], _BF16 if "bias" in name or "router" in name
                                    else _U8).to(target)
                   for name in _PREPARED + ("router_weight", "router_bias")}
        module = cls(config["num_experts"], config["hidden_size"], config["intermediate_size"],
                     config["top_k"], has_bias=config["has_bias"],
                     router=tensors["router_weight"] is not None, device=target, **kwargs)
        return module.load_experts(*(tensors[name] for name in _PREPARED), read["layout"],
                                   tensors["router_weight"], tensors["router_bias"])

    def _apply(self, fn: Any, recurse: bool = True) -> "Mxfp4MoE":
        """Module.to() and friends, minus dtype changes: the prepared tensors are the op's
        layout (bf16 biases and router included), so ``model.float()`` / ``.half()`` of a model
        holding this module move them only where ``fn`` changes the device."""

        def keep_dtype(t: Tensor) -> Tensor:
            probe = fn(torch.empty(1, dtype=t.dtype, device=t.device))  # where fn sends t
            return fn(t) if probe.dtype == t.dtype else t.to(device=probe.device)

        return super()._apply(keep_dtype, recurse)

    def _workspace(self, x: Tensor) -> Optional[Tensor]:
        if x.device.type != "cuda" or self.max_tokens <= 0:
            return None
        if self.workspace is None or self.workspace.device != x.device:
            size = mxfp4_moe_workspace_bytes(self.num_experts, self.hidden_size,
                                             self.intermediate_size, self.top_k, self.max_tokens,
                                             self.has_bias, self.tp_rank, self.tp_size,
                                             self.ep_rank, self.ep_size, self.alignment,
                                             self.activation_quant)
            self.workspace = torch.zeros(size, dtype=_U8, device=x.device)
        return self.workspace

    def forward(self, x: Tensor, topk_ids: Optional[Tensor] = None,
                topk_weights: Optional[Tensor] = None) -> Tensor:
        router = self.router_weight if topk_ids is None else None
        router_bias = self.router_bias if router is not None else None
        prepared = (self.w13, self.w13_scale, self.w13_bias, self.w2, self.w2_scale, self.w2_bias)
        rank = (self.tp_rank, self.tp_size, self.ep_rank, self.ep_size, self.alignment)
        workspace = self._workspace(x)
        if workspace is None:
            return torch.ops.mxq.mxfp4_moe(
                x, *prepared, topk_ids, topk_weights, router, router_bias, self.num_experts,
                self.intermediate_size, self.top_k, *rank, self.activation, self.swiglu_alpha,
                self.swiglu_limit, self.activation_quant, True, self.out_dtype)
        out = torch.empty((x.shape[0], x.shape[1]), dtype=self.out_dtype, device=x.device)
        torch.ops.mxq.mxfp4_moe_into(
            x, *prepared, topk_ids, topk_weights, router, router_bias, out, workspace,
            self.num_experts, self.intermediate_size, self.top_k, self.max_tokens, *rank,
            self.activation, self.swiglu_alpha, self.swiglu_limit, self.activation_quant, True)
        return out

    def extra_repr(self) -> str:
        return (f"E={self.num_experts}, H={self.hidden_size}, I={self.intermediate_size}, "
                f"top_k={self.top_k}, tp={self.tp_rank}/{self.tp_size}, "
                f"ep={self.ep_rank}/{self.ep_size}, I_rank={self.intermediate_size_per_partition}"
                f" -> {self.intermediate_size_per_partition_after_pad}, {self.activation}, "
                f"{self.activation_quant}")
