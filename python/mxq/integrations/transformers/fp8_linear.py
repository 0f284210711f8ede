"""mxq's block-FP8 linear inside Hugging Face transformers models (DeepSeek-V3 FP8 checkpoints).

* :func:`replace_fp8_linears` swaps the block-FP8 linears of a loaded model (transformers'
  ``FP8Linear``: an E4M3 ``weight`` [N, K] with float32 ``weight_scale_inv``
  [ceil(N/bn), ceil(K/bk)]) for :class:`MxqFp8Linear`, which runs
  ``torch.ops.mxq.block_fp8_linear`` on the CPU or CUDA. The tensors are taken over, not copied.
* :func:`load_deepseek_v3_fp8` builds ``DeepseekV3ForCausalLM`` from a DeepSeek-V3 FP8 checkpoint
  directory with mxq's linears, reading the files with safetensors. It does not go through
  transformers' FP8 quantizer: without a GPU that dequantizes every weight to bf16 (and needs
  accelerate), and on a GPU its ``FP8Linear`` fetches its kernels from the Hub at run time.

See docs/transformers-fp8.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ... import _mxq
from ... import torch_ops as _torch_ops  # noqa: F401  (registers torch.ops.mxq.*)
from ..._errors import DtypeError, Error, InvalidArgumentError
from ...torch_ops.linear_ops import _dequantized_weight

_E4M3 = torch.float8_e4m3fn
_E8M0 = getattr(torch, "float8_e8m0fnu", None)  # transformers' "ue8m0" scale_fmt

__all__ = ["MxqFp8Linear", "load_deepseek_v3_fp8", "replace_fp8_linears"]


class MxqFp8Linear(nn.Module):
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

    def _apply(self, fn: Any, recurse: bool = True) -> "MxqFp8Linear":
        """Module.to() and friends minus dtype changes (as mxq.torch_ops.BlockFp8Linear): ``fn``
        applies to a tensor when it keeps the dtype, else only its device move does."""

        def keep_dtype(t: Tensor) -> Tensor:
            probe = fn(torch.empty(1, dtype=t.dtype, device=t.device))  # where fn sends t
            return fn(t) if probe.dtype == t.dtype else t.to(device=probe.device)

        return super()._apply(keep_dtype, recurse)

    def forward(self, x: Tensor) -> Tensor:
        out_dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16
        y = torch.ops.mxq.block_fp8_linear(x.to(torch.bfloat16), self.weight,
                                           self.weight_scale_inv, self.block_size[0],
                                           self.block_size[1], self.bias, "fp32", out_dtype)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"block={self.block_size[0]}x{self.block_size[1]}, bias={self.bias is not None}")


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


def replace_fp8_linears(model: nn.Module, *, device: Optional[Union[str, torch.device]] = None,
                        block_size: Optional[Sequence[int]] = None) -> nn.Module:
    """Replaces every block-FP8 linear of ``model`` (a module with a 2-D E4M3 ``weight`` and a
    ``weight_scale_inv``: transformers' ``FP8Linear`` after loading a DeepSeek-V3 FP8
    checkpoint) with :class:`MxqFp8Linear` over the same tensors (float32 scales and bf16/f32
    biases are taken over without a copy), and returns ``model``.

    ``block_size`` [bn, bk]: for modules that do not say theirs (FP8Linear does); default the
    model's ``config.quantization_config.weight_block_size``. ``device``: where the model will
    run; checked before anything changes, then the model is moved there (``model.to(device)``).
    Without it, the weights' own devices are checked.

    Errors (:class:`mxq.Error`; nothing is replaced when one is raised): no block-FP8 linear in
    the model; a layout mxq cannot serve (per-tensor scales, static activation scales, non-E4M3
    weights, a scale grid that does not match the block size, on CUDA a block extent that is not a
    multiple of 16); a device mxq cannot run on (CUDA asked where this mxq or torch has none)."""
    found = [(name, m) for name, m in model.named_modules() if _is_block_fp8_linear(m)]
    if not found:
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
        targets = sorted({m.weight.device for _, m in found}, key=str)
        for d in targets:
            check_device(d)
    default_block = block_size if block_size is not None else _config_block_size(model)
    # Every check before the first swap: an error leaves the model as it was.
    swaps = [_plan_swap(name, m, default_block, targets[0] if device is not None
                        else m.weight.device) for name, m in found]
    for s in swaps:
        model.set_submodule(s.name, MxqFp8Linear(s.weight, s.scale, s.block, s.bias))
    if device is not None:
        model.to(targets[0])
    return model


# --- load_deepseek_v3_fp8 ------------------------------------------------------------------

_LINEAR_KINDS = ("mxq", "fp8", "dequantized")


def _deepseek_v3_classes() -> Tuple[Any, Any]:
    try:
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    except ImportError as e:
        raise _unsupported(f"load_deepseek_v3_fp8 needs Hugging Face transformers with "
                           f"DeepSeek-V3 (DeepseekV3Config, DeepseekV3ForCausalLM; transformers "
                           f">= 5.17): {e}") from e
    return DeepseekV3Config, DeepseekV3ForCausalLM


def _fp8_quantization(path: Path, config: Dict[str, Any]) -> Tuple[int, int]:
    """The weight block size of a DeepSeek-V3 FP8 config.json; an error for anything else."""
    where = f"{path / 'config.json'}"
    if config.get("model_type") != "deepseek_v3":
        raise _unsupported(f"{where}: model_type {config.get('model_type')!r}; "
                           f"load_deepseek_v3_fp8 reads 'deepseek_v3' checkpoints")
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") != "fp8":
        raise _unsupported(f"{where}: quantization_config.quant_method is "
                           f"{qc.get('quant_method')!r}; expected 'fp8' (block-FP8)")
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        raise _unsupported(f"{where}: activation_scheme {qc['activation_scheme']!r}; mxq "
                           f"quantizes activations dynamically")
    if qc.get("fmt", "e4m3") != "e4m3":
        raise _unsupported(f"{where}: fmt {qc['fmt']!r}; mxq serves e4m3 weights")
    block = qc.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(v, int) and v > 0
                                                                  for v in block)):
        raise _unsupported(f"{where}: weight_block_size {block!r}; mxq serves block scales "
                           f"[bn, bk] (per-tensor FP8 is not served)")
    return block[0], block[1]


def _read_safetensors(path: Path, device: torch.device) -> Dict[str, Tensor]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise Error(f"{path}: no *.safetensors file", "io")
    tensors: Dict[str, Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device=str(device)) as reader:
            for key in reader.keys():
                tensors[key] = reader.get_tensor(key)
    return tensors


def _make_linear(kind: str, weight: Tensor, scale: Tensor, block: Tuple[int, int],
                 bias: Optional[Tensor], dtype: torch.dtype) -> nn.Module:
    if kind == "mxq":
        return MxqFp8Linear(weight, scale, block, bias)
    n, k = weight.shape
    if kind == "dequantized":  # transformers' own layer with the weight q · scale
        with torch.device("meta"):
            linear = nn.Linear(k, n, bias=bias is not None)
        linear.weight = nn.Parameter(_dequantized_weight(weight, scale, *block).to(dtype),
                                     requires_grad=False)
    else:  # "fp8": transformers' FP8Linear as from_pretrained leaves it on a GPU
        try:
            from transformers.integrations.finegrained_fp8 import FP8Linear
        except ImportError as e:
            raise _unsupported(f"linears='fp8' needs transformers' FP8Linear "
                               f"(transformers.integrations.finegrained_fp8): {e}") from e
        with torch.device("meta"):
            linear = FP8Linear(in_features=k, out_features=n, block_size=tuple(block))
        linear.weight = nn.Parameter(weight, requires_grad=False)
        linear.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
    if bias is None:
        linear.register_parameter("bias", None)
    else:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def _take_dequantized(tensors: Dict[str, Tensor], prefix: str, block: Tuple[int, int],
                      dtype: torch.dtype) -> Tensor:
    weight = tensors.pop(prefix + "weight")
    scale = tensors.pop(prefix + "weight_scale_inv", None)
    if scale is None:
        return weight.to(dtype)
    return _dequantized_weight(weight, _servable_scale(scale), *block).to(dtype)


def _load_fused_experts(model: nn.Module, tensors: Dict[str, Tensor], block: Tuple[int, int],
                        dtype: torch.dtype) -> None:
    """transformers >= 5 holds a layer's routed experts as two 3-D tensors (gate rows then up
    rows in ``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]); the checkpoint has one
    block-FP8 linear per expert. They are dequantized here (mxq's linear does not serve them)."""
    for name, module in model.named_modules():
        gate_up = getattr(module, "gate_up_proj", None)
        if not (isinstance(gate_up, Tensor) and gate_up.ndim == 3):
            continue
        gu, down = [], []
        for e in range(gate_up.shape[0]):
            p = f"{name}.{e}."
            gu.append(torch.cat([_take_dequantized(tensors, p + "gate_proj.", block, dtype),
                                 _take_dequantized(tensors, p + "up_proj.", block, dtype)]))
            down.append(_take_dequantized(tensors, p + "down_proj.", block, dtype))
        module.gate_up_proj = nn.Parameter(torch.stack(gu), requires_grad=False)
        module.down_proj = nn.Parameter(torch.stack(down), requires_grad=False)


def load_deepseek_v3_fp8(path: Union[str, Path], *, device: Union[str, torch.device] = "cpu",
                         linears: str = "mxq") -> nn.Module:
    """``DeepseekV3ForCausalLM`` (eval mode) from a DeepSeek-V3 FP8 checkpoint directory:
    ``config.json`` with ``quantization_config`` {quant_method "fp8", weight_block_size [bn, bk],
    activation_scheme "dynamic"} and ``*.safetensors`` with E4M3 ``*.weight`` and float32
    ``*.weight_scale_inv`` for the quantized linears, bf16 (fp32 router bias) for the rest.

    The tensors are read with safetensors straight onto ``device`` and kept in the file's dtypes.
    ``linears`` says what the quantized linears become:

    * ``"mxq"``: :class:`MxqFp8Linear` over the file's tensors;
    * ``"fp8"``: transformers' ``FP8Linear`` over them, as ``from_pretrained`` leaves them on a
      GPU (to try :func:`replace_fp8_linears`; its own forward needs transformers' Hub kernels);
    * ``"dequantized"``: ``nn.Linear`` with weight q · scale in bf16: transformers' eager path
      with the same weights, the reference mxq is compared with.

    The routed experts (3-D in transformers >= 5) are dequantized to bf16 in every mode. The
    multi-token-prediction layer of the published checkpoint (``model.layers.<num_hidden_layers>``)
    is skipped, as transformers does. The model is built on the meta device and takes the
    file's tensors (no bf16 copy of the FP8 weights is ever made in ``"mxq"`` mode)."""
    if linears not in _LINEAR_KINDS:
        raise InvalidArgumentError(f"linears: expected one of {_LINEAR_KINDS}, found {linears!r}")
    path = Path(path)
    try:
        config_dict = json.loads((path / "config.json").read_text())
    except OSError as e:
        raise Error(f"{path}: cannot read config.json: {e}", "io") from e
    block = _fp8_quantization(path, config_dict)
    device = check_device(device)
    config_cls, model_cls = _deepseek_v3_classes()
    config = config_cls.from_dict({k: v for k, v in config_dict.items()
                                   if k != "quantization_config"})
    dtype = torch.bfloat16
    tensors = _read_safetensors(path, device)
    layer = re.compile(r"^model\.layers\.(\d+)\.")
    for key in [k for k in tensors if (m := layer.match(k))
                and int(m.group(1)) >= config.num_hidden_layers]:
        del tensors[key]  # the MTP layer(s): not part of DeepseekV3ForCausalLM

    with torch.device("meta"):
        model = model_cls(config)
    for key in [k for k in tensors if k.endswith(".weight_scale_inv")]:
        name = key[: -len(".weight_scale_inv")]
        try:
            target = model.get_submodule(name)
        except AttributeError:
            continue  # a fused expert's piece: _load_fused_experts takes it
        if not isinstance(target, nn.Linear):
            raise _unsupported(f"{path}: {key} scales {name}, a {type(target).__name__}; mxq "
                               f"serves linears")
        weight, scale = tensors.pop(name + ".weight"), tensors.pop(key)
        _check_servable(name, weight, scale, block, device)
        model.set_submodule(name, _make_linear(linears, weight, _servable_scale(scale), block,
                                               _servable_bias(tensors.pop(name + ".bias", None)),
                                               dtype))
    _load_fused_experts(model, tensors, block, dtype)
    unexpected = model.load_state_dict(tensors, strict=False, assign=True).unexpected_keys
    if unexpected:
        raise Error(f"{path}: tensors the model has no place for: {sorted(unexpected)[:8]}",
                    "format")
    # The rotary embedding's inverse frequencies are computed, not loaded (non-persistent).
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config).to(device)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise Error(f"{path}: no tensor in the checkpoint for {left[:8]}", "format")
    return model.eval()
