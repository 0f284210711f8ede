"""The MXFP4 MoE op over an mxq.MoELayer handle, and the MoE module."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._errors import InvalidArgumentError
from ..moe import MoELayer, layer_from_handle
from ._common import (
    _BF16,
    _F32,
    _check,
    _check_device,
    _check_size,
    _from_numpy,
    _register_no_gradient,
    _stream,
)


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



_register_no_gradient(moe_forward, "moe_forward")


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

