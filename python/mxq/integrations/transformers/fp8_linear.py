"""mxq's block-FP8 linear inside Hugging Face transformers models (DeepSeek-V3 FP8 checkpoints).

* :func:`replace_fp8_linears` swaps the block-FP8 linears of a loaded model (transformers'
  ``FP8Linear``: an E4M3 ``weight`` [N, K] with float32 ``weight_scale_inv``
  [ceil(N/bn), ceil(K/bk)]) for :class:`MxqFp8Linear`, and its block-FP8 routed experts
  (``FP8Experts``) for :class:`MxqFp8Experts`; both run ``torch.ops.mxq.block_fp8_linear`` on
  the CPU or CUDA. The tensors are taken over, not copied.
* :func:`~.deepseek_v3_loader.load_deepseek_v3_fp8` (deepseek_v3_loader.py) builds a
  DeepSeek-V3 model with these modules from a checkpoint directory.

See docs/transformers.md ("DeepSeek-V3 block-FP8 linears").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ... import _mxq
from ... import torch_ops as _torch_ops  # noqa: F401  (registers torch.ops.mxq.*)
from ..._errors import DtypeError, Error, InvalidArgumentError

_E4M3 = torch.float8_e4m3fn
_E8M0 = getattr(torch, "float8_e8m0fnu", None)  # transformers' "ue8m0" scale_fmt

__all__ = ["MxqFp8Experts", "MxqFp8Linear", "replace_fp8_linears"]


class _KeepsDtypes(nn.Module):
    """Module.to() and friends minus dtype changes (as mxq.torch_ops.BlockFp8Linear): the op
    needs E4M3 codes, and rounding the scales would change the weight. ``fn`` applies to a
    tensor when it keeps the dtype, else only its device move does."""

    def _apply(self, fn: Any, recurse: bool = True) -> nn.Module:
        def keep_dtype(t: Tensor) -> Tensor:
            probe = fn(torch.empty(1, dtype=t.dtype, device=t.device))  # where fn sends t
            return fn(t) if probe.dtype == t.dtype else t.to(device=probe.device)

        return super()._apply(keep_dtype, recurse)


def _block_fp8(x: Tensor, weight: Tensor, scale: Tensor, block: Tuple[int, int],
               bias: Optional[Tensor] = None) -> Tensor:
    """x @ W^T (+ bias) by mxq's op, in x's dtype (the op takes bf16: others are rounded)."""
    out_dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16
    y = torch.ops.mxq.block_fp8_linear(x.to(torch.bfloat16), weight, scale, block[0], block[1],
                                       bias, "fp32", out_dtype)
    return y.to(x.dtype)


class MxqFp8Linear(_KeepsDtypes):
    """A block-FP8 linear of a transformers model, run by ``torch.ops.mxq.block_fp8_linear``.

    It holds what transformers' ``FP8Linear`` holds, under the same names, so ``state_dict``
    keys are the checkpoint's: ``weight`` E4M3 [N, K], ``weight_scale_inv`` float32
    [ceil(N/bn), ceil(K/bk)] (despite its name the dequantization scale: W = weight · scale),
    optional ``bias`` [N] (bfloat16 or float32). Activations are quantized to E4M3 per
    1 x bk group inside the op (DeepSeek-V3's dynamic scheme). The op takes bfloat16 inputs: other
    dtypes are rounded to bfloat16 first; the output has the input's dtype.

    Weight and scales are frozen parameters (the op's gradient covers x and the bias). Casting
    the model's dtype (``model.to(torch.float16)``, ``.half()``) leaves this module's tensors as
    they are, as the op needs E4M3 codes and rounding the scales would change the weight; device
    moves apply."""

    def __init__(self, weight: Tensor, weight_scale_inv: Tensor,
                 block_size: Sequence[int] = (128, 128), bias: Optional[Tensor] = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.block_size = (int(block_size[0]), int(block_size[1]))
        # New Parameter objects over the same storage: no copy of the weight.
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(weight_scale_inv, requires_grad=False)
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(bias, requires_grad=bias.requires_grad)

    def forward(self, x: Tensor) -> Tensor:
        return _block_fp8(x, self.weight, self.weight_scale_inv, self.block_size, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"block={self.block_size[0]}x{self.block_size[1]}, bias={self.bias is not None}")


class MxqFp8Experts(_KeepsDtypes):
    """A MoE layer's routed experts in block-FP8, each expert's projections run by
    ``torch.ops.mxq.block_fp8_linear``: a drop-in for DeepSeek-V3's experts module
    (``forward(hidden_states, top_k_index, top_k_weights)``; the model's router picks the
    experts) and for transformers' ``FP8Experts``, whose tensors and names it holds:
    ``gate_up_proj`` E4M3 [E, 2I, H] (gate rows then up rows), ``gate_up_proj_scale_inv``
    float32 [E, 2I/bn, ceil(H/bk)], ``down_proj`` E4M3 [E, H, I], ``down_proj_scale_inv``
    [E, ceil(H/bn), ceil(I/bk)]. I must be a multiple of bn, so that the gate and up rows of one
    expert never share a scale block (2048 and 128 in DeepSeek-V3).

    Expert by expert, as transformers' eager FP8 experts: x_e -> gate_up -> act(gate) * up ->
    down, times the routing weight, summed in float32. A reference implementation on mxq's op,
    not a grouped kernel: one op call per hit expert and projection."""

    def __init__(self, gate_up_proj: Tensor, gate_up_proj_scale_inv: Tensor, down_proj: Tensor,
                 down_proj_scale_inv: Tensor, block_size: Sequence[int], act_fn: Any) -> None:
        super().__init__()
        self.num_experts = gate_up_proj.shape[0]
        self.block_size = (int(block_size[0]), int(block_size[1]))
        self.act_fn = act_fn
        for name, t in (("gate_up_proj", gate_up_proj),
                        ("gate_up_proj_scale_inv", gate_up_proj_scale_inv),
                        ("down_proj", down_proj), ("down_proj_scale_inv", down_proj_scale_inv)):
            setattr(self, name, nn.Parameter(t, requires_grad=False))

    # A loop over the experts the batch hits (data-dependent): torch.compile runs it eagerly
    # rather than tracing it again for every set of hit experts.
    @torch.compiler.disable
    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        out = torch.zeros_like(hidden_states, dtype=torch.float32)
        with torch.no_grad():
            # num_experts + 1 classes: transformers marks a slot routed elsewhere with
            # num_experts (expert parallelism); that class is skipped.
            hits = torch.nn.functional.one_hot(top_k_index, self.num_experts + 1)
            hits = hits.permute(2, 1, 0)[: self.num_experts]
            experts = torch.greater(hits.sum(dim=(-1, -2)), 0).nonzero().view(-1).tolist()
        for e in experts:
            slot, token = torch.where(hits[e])
            gate, up = self.project(hidden_states[token], self.gate_up_proj[e],
                                    self.gate_up_proj_scale_inv[e]).chunk(2, dim=-1)
            y = self.project(self.act_fn(gate) * up, self.down_proj[e], self.down_proj_scale_inv[e])
            out.index_add_(0, token, (y * top_k_weights[token, slot, None].to(y.dtype)).float())
        return out.to(hidden_states.dtype)

    def project(self, x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
        """One expert's projection, x @ weight^T (a method: tests substitute a reference)."""
        return _block_fp8(x, weight, scale, self.block_size)

    def extra_repr(self) -> str:
        e, two_i, h = self.gate_up_proj.shape
        return (f"num_experts={e}, hidden={h}, intermediate={two_i // 2}, "
                f"block={self.block_size[0]}x{self.block_size[1]}")


# --- checks shared by the two entry points -------------------------------------------------

def _unsupported(message: str) -> Error:
    return Error(message, "unsupported")


def check_device(device: Union[str, torch.device]) -> torch.device:
    """The device as torch.device when mxq's op can run there; else an mxq.Error ("unsupported")
    naming everything that is missing."""
    device = torch.device(device)
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise _unsupported(f"device {device}: mxq's block-FP8 linear runs on cpu or cuda")
    missing = []
    if not _mxq.with_cuda:
        missing.append("this mxq was built without CUDA (mxq.with_cuda is False: build it with "
                       "the CUDA toolkit, MXQ_CUDA=ON)")
    if not torch.cuda.is_available():
        missing.append(f"torch sees no CUDA device (torch.cuda.is_available() is False; torch "
                       f"{torch.__version__}, CUDA {torch.version.cuda})")
    if missing:
        raise _unsupported(f"device {device}: " + "; ".join(missing))
    return device


def _check_servable(where: str, weight: Tensor, scale: Tensor, block: Optional[Sequence[int]],
                    device: torch.device) -> Tuple[int, int]:
    """The block (bn, bk) when mxq serves this weight and scale layout on ``device``; else the
    error saying what mxq cannot serve."""
    if weight.dtype != _E4M3:
        raise _unsupported(f"{where}: weight is {weight.dtype}; mxq serves float8_e4m3fn weights "
                           f"with block scales (not FP4-packed or other formats)")
    if block is None or scale.ndim != 2:
        raise _unsupported(f"{where}: per-tensor FP8 (block_size {block}, weight_scale_inv of "
                           f"shape {list(scale.shape)}); mxq serves block scales "
                           f"[ceil(N/bn), ceil(K/bk)]")
    if len(block) != 2 or min(int(v) for v in block) < 1:
        raise InvalidArgumentError(f"{where}: block size {list(block)}; expected two positive "
                                   f"extents [bn, bk]")
    bn, bk = (int(v) for v in block)
    n, k = weight.shape
    want = [-(-n // bn), -(-k // bk)]
    if list(scale.shape) != want:
        raise InvalidArgumentError(f"{where}: weight_scale_inv is {list(scale.shape)}; expected "
                                   f"{want} for a {n}x{k} weight in {bn}x{bk} blocks")
    if scale.dtype not in (torch.float32, _E8M0):
        raise DtypeError(f"{where}: weight_scale_inv is {scale.dtype}; mxq serves float32 scales "
                         f"(or float8_e8m0fnu ones, widened to float32)")
    if device.type == "cuda" and (bn % 16 or bk % 16):
        raise _unsupported(f"{where}: block {bn}x{bk} on CUDA; mxq's CUDA tactics need block "
                           f"extents that are multiples of 16 (docs/linear.md), the CPU serves any")
    return bn, bk


def _check_experts_servable(where: str, gate_up: Tensor, gate_up_scale: Tensor, down: Tensor,
                            down_scale: Tensor, block: Optional[Sequence[int]],
                            device: torch.device) -> Tuple[int, int]:
    """As _check_servable for MxqFp8Experts' four tensors (one expert's slice stands for all)."""
    for name, w, s in (("gate_up_proj", gate_up, gate_up_scale), ("down_proj", down, down_scale)):
        if w.ndim != 3 or s.ndim != 3 or s.shape[0] != w.shape[0]:
            raise InvalidArgumentError(f"{where}: {name} {list(w.shape)} with scales "
                                       f"{list(s.shape)}; expected [E, N, K] and "
                                       f"[E, ceil(N/bn), ceil(K/bk)]")
        block = _check_servable(f"{where} {name}", w[0], s[0], block, device)
    e, two_i, h = gate_up.shape
    if list(down.shape) != [e, h, two_i // 2] or two_i % 2:
        raise InvalidArgumentError(f"{where}: down_proj {list(down.shape)} does not match "
                                   f"gate_up_proj {list(gate_up.shape)}; expected "
                                   f"[{e}, {h}, {two_i // 2}]")
    if (two_i // 2) % block[0]:
        raise _unsupported(f"{where}: intermediate size {two_i // 2} is not a multiple of the "
                           f"block's {block[0]} rows (an expert's gate and up rows would share "
                           f"scale blocks)")
    return block


def _servable_scale(scale: Tensor) -> Tensor:
    # E8M0 scales are powers of two: widening to float32 is exact (a copy, the size of the scales).
    return scale if scale.dtype == torch.float32 else scale.float()


def _servable_bias(bias: Optional[Tensor]) -> Optional[Tensor]:
    if bias is None or bias.dtype in (torch.bfloat16, torch.float32):
        return bias
    return bias.float()  # the op takes a bf16 or f32 bias; fp16 widens exactly


# --- replace_fp8_linears -------------------------------------------------------------------

def _is_block_fp8_linear(module: nn.Module) -> bool:
    """A module that holds a 2-D weight with ``weight_scale_inv`` (transformers' FP8Linear and
    modules like it); not one of mxq's, not experts (3-D weights under other names)."""
    weight = getattr(module, "weight", None)
    return (not isinstance(module, MxqFp8Linear) and isinstance(weight, Tensor)
            and weight.ndim == 2 and isinstance(getattr(module, "weight_scale_inv", None), Tensor))


def _is_block_fp8_experts(module: nn.Module) -> bool:
    """transformers' FP8Experts (3-D E4M3 gate_up_proj / down_proj with *_scale_inv) and
    modules like it; not one of mxq's."""
    weight = getattr(module, "gate_up_proj", None)
    return (not isinstance(module, MxqFp8Experts) and isinstance(weight, Tensor)
            and weight.ndim == 3 and weight.dtype == _E4M3
            and isinstance(getattr(module, "gate_up_proj_scale_inv", None), Tensor))


def _config_block_size(model: nn.Module) -> Optional[Sequence[int]]:
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    if isinstance(qc, dict):
        return qc.get("weight_block_size")
    return getattr(qc, "weight_block_size", None)


@dataclass
class _Swap:
    name: str
    weight: Tensor
    scale: Tensor
    block: Tuple[int, int]
    bias: Optional[Tensor]


def _plan_swap(name: str, module: nn.Module, default_block: Optional[Sequence[int]],
               device: torch.device) -> _Swap:
    where = f"{name} ({type(module).__name__})"
    if getattr(module, "n_groups", None) is not None:
        raise _unsupported(f"{where}: a grouped linear ({module.n_groups} groups); mxq serves "
                           f"plain linears")
    if getattr(module, "activation_scale", None) is not None:
        raise _unsupported(f"{where}: a static activation scale; mxq quantizes activations "
                           f"dynamically, per 1 x bk group")
    weight, scale = module.weight, module.weight_scale_inv
    if weight.device.type == "meta" or scale.device.type == "meta":
        raise InvalidArgumentError(f"{where}: its weight is on the meta device (not loaded)")
    block = module.block_size if hasattr(module, "block_size") else default_block
    block = _check_servable(where, weight, scale, block, device)
    return _Swap(name, weight, _servable_scale(scale), block,
                 _servable_bias(getattr(module, "bias", None)))


def _plan_experts_swap(name: str, module: nn.Module, default_block: Optional[Sequence[int]],
                       device: torch.device) -> Tuple[str, MxqFp8Experts]:
    where = f"{name} ({type(module).__name__})"
    # What transformers' FP8Experts can do beyond DeepSeek-V3's plain SwiGLU experts.
    for attr, what in (("gate_up_proj_activation_scale", "static activation scales"),
                       ("gate_up_proj_bias", "biases"), ("limit", "a clamped SwiGLU"),
                       ("swiglu_alpha", "gpt-oss's SwiGLU"), ("gate_softcap", "softcapping")):
        if getattr(module, attr, None) is not None:
            raise _unsupported(f"{where}: {what}; mxq's block-FP8 experts serve DeepSeek-V3's "
                               f"act(gate) * up experts")
    tensors = [getattr(module, n) for n in ("gate_up_proj", "gate_up_proj_scale_inv",
                                            "down_proj", "down_proj_scale_inv")]
    if any(t.device.type == "meta" for t in tensors):
        raise InvalidArgumentError(f"{where}: its weights are on the meta device (not loaded)")
    block = module.block_size if hasattr(module, "block_size") else default_block
    block = _check_experts_servable(where, *tensors, block, device)
    gate_up, gate_up_scale, down, down_scale = tensors
    # Built now, used only once every module passed its checks.
    return name, MxqFp8Experts(gate_up, _servable_scale(gate_up_scale), down,
                               _servable_scale(down_scale), block, module.act_fn)


def replace_fp8_linears(model: nn.Module, *, device: Optional[Union[str, torch.device]] = None,
                        block_size: Optional[Sequence[int]] = None,
                        experts: bool = True) -> nn.Module:
    """Replaces every block-FP8 linear of ``model`` (a module with a 2-D E4M3 ``weight`` and a
    ``weight_scale_inv``: transformers' ``FP8Linear`` after loading a DeepSeek-V3 FP8
    checkpoint) with :class:`MxqFp8Linear` over the same tensors (float32 scales and bf16/f32
    biases are taken over without a copy), and returns ``model``. With ``experts`` (default),
    transformers' block-FP8 routed experts (``FP8Experts``) become :class:`MxqFp8Experts` too.

    ``block_size`` [bn, bk]: for modules that do not say theirs (FP8Linear does); default the
    model's ``config.quantization_config.weight_block_size``. ``device``: where the model will
    run; checked before anything changes, then the model is moved there (``model.to(device)``).
    Without it, the weights' own devices are checked.

    Errors (:class:`mxq.Error`; nothing is replaced when one is raised): no block-FP8 linear or
    experts in the model; a layout mxq cannot serve (per-tensor scales, static activation
    scales, non-E4M3 weights, a scale grid that does not match the block size, on CUDA a block
    extent that is not a multiple of 16; experts whose intermediate size is not a multiple of
    bn, or with more than act(gate) * up); a device mxq cannot run on (CUDA asked where this mxq
    or torch has none)."""
    found = [(name, m) for name, m in model.named_modules() if _is_block_fp8_linear(m)]
    found_experts = [(name, m) for name, m in model.named_modules()
                     if experts and _is_block_fp8_experts(m)]
    if not found and not found_experts:
        qc = getattr(getattr(model, "config", None), "quantization_config", None)
        dequantized = (qc.get("dequantize") if isinstance(qc, dict)
                       else getattr(qc, "dequantize", False))
        hint = (" transformers dequantized this model while loading it (FineGrainedFP8 does so "
                "without a GPU):" if dequantized else "")
        raise InvalidArgumentError(
            f"model ({type(model).__name__}): no block-FP8 linear (a module with a 2-D "
            f"float8_e4m3fn weight and weight_scale_inv) to replace.{hint} load the FP8 "
            f"checkpoint with mxq.integrations.transformers.load_deepseek_v3_fp8, or with "
            f"transformers on a GPU")
    if device is not None:
        targets = [check_device(device)]
    else:
        targets = sorted({m.weight.device for _, m in found}
                         | {m.gate_up_proj.device for _, m in found_experts}, key=str)
        for d in targets:
            check_device(d)
    default_block = block_size if block_size is not None else _config_block_size(model)
    # Every check before the first swap: an error leaves the model as it was.
    swaps = [_plan_swap(name, m, default_block, targets[0] if device is not None
                        else m.weight.device) for name, m in found]
    expert_swaps = [_plan_experts_swap(name, m, default_block, targets[0] if device is not None
                                       else m.gate_up_proj.device) for name, m in found_experts]
    for s in swaps:
        model.set_submodule(s.name, MxqFp8Linear(s.weight, s.scale, s.block, s.bias))
    for name, module in expert_swaps:
        model.set_submodule(name, module)
    if device is not None:
        model.to(targets[0])
    return model
