"""A DeepSeek-V3 FP8 checkpoint loaded into transformers' ``DeepseekV3ForCausalLM`` with mxq's
block-FP8 modules (fp8_linear.py), on any device.

:func:`load_deepseek_v3_fp8` builds the model skeleton on the meta device and reads the
checkpoint's safetensors files straight onto the target device. It does not go through
transformers' FP8 quantizer: without a GPU that dequantizes every weight to bf16 (and needs
accelerate; it also mis-sizes partial scale blocks), and on a GPU its ``FP8Linear`` fetches its
kernels from the Hub at run time.

See docs/transformers.md ("DeepSeek-V3 block-FP8 linears").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ..._errors import Error, InvalidArgumentError
from ...torch_ops.linear_ops import _dequantized_weight
from .fp8_linear import (MxqFp8Experts, MxqFp8Linear, _check_experts_servable, _check_servable,
                         _servable_bias, _servable_scale, _unsupported, check_device)
from .meta_model import indexed_device, take_checkpoint_tensors

__all__ = ["load_deepseek_v3_fp8"]


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


def _take_expert(tensors: Dict[str, Tensor], prefix: str) -> Tuple[Tensor, Tensor]:
    try:
        return tensors.pop(prefix + "weight"), tensors.pop(prefix + "weight_scale_inv")
    except KeyError as e:
        raise Error(f"no tensor {e} in the checkpoint (a block-FP8 expert projection)",
                    "format") from None


def _fp8_experts(config: Any, tensors: Sequence[Tensor], block: Tuple[int, int],
                 act_fn: Any) -> nn.Module:
    """transformers' FP8Experts over the tensors, as from_pretrained leaves it on a GPU."""
    try:
        from transformers.integrations.finegrained_fp8 import FP8Experts
    except ImportError as e:
        raise _unsupported(f"experts='fp8' needs transformers' FP8Experts "
                           f"(transformers.integrations.finegrained_fp8): {e}") from e
    with torch.device("meta"):
        module = FP8Experts(config, block_size=tuple(block))
    for name, t in zip(("gate_up_proj", "gate_up_proj_scale_inv", "down_proj",
                        "down_proj_scale_inv"), tensors):
        setattr(module, name, nn.Parameter(t, requires_grad=False))
    module.act_fn = act_fn
    return module


def _load_fused_experts(model: nn.Module, tensors: Dict[str, Tensor], block: Tuple[int, int],
                        dtype: torch.dtype, kind: str, device: torch.device) -> None:
    """transformers >= 5 holds a layer's routed experts as 3-D tensors (gate rows then up rows
    in ``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]); the checkpoint has one block-FP8
    linear per expert. Stacking them is the one copy of the expert weights the loader makes
    (the per-expert tensors go right after). ``kind``: "mxq" MxqFp8Experts, "fp8" transformers'
    FP8Experts, "dequantized" the model's own experts module with bf16 q·scale."""
    for name, module in list(model.named_modules()):
        gate_up = getattr(module, "gate_up_proj", None)
        if not (isinstance(gate_up, Tensor) and gate_up.ndim == 3):
            continue
        where = f"{name} ({type(module).__name__})"
        num_experts = gate_up.shape[0]
        if kind == "dequantized":
            gu, down = [], []
            for e in range(num_experts):
                p = f"{name}.{e}."
                gu.append(torch.cat([_take_dequantized(tensors, p + "gate_proj.", block, dtype),
                                     _take_dequantized(tensors, p + "up_proj.", block, dtype)]))
                down.append(_take_dequantized(tensors, p + "down_proj.", block, dtype))
            module.gate_up_proj = nn.Parameter(torch.stack(gu), requires_grad=False)
            module.down_proj = nn.Parameter(torch.stack(down), requires_grad=False)
            continue
        parts = {proj: [_take_expert(tensors, f"{name}.{e}.{proj}.") for e in range(num_experts)]
                 for proj in ("gate_proj", "up_proj", "down_proj")}
        stacked = [torch.stack([torch.cat([g[i], u[i]]) for g, u in zip(parts["gate_proj"],
                                                                          parts["up_proj"])])
                   for i in (0, 1)]
        stacked += [torch.stack([d[i] for d in parts["down_proj"]]) for i in (0, 1)]
        del parts
        # Concatenating gate and up scale grids is exact only when I is a multiple of bn: checked.
        _check_experts_servable(where, *stacked, block, device)
        stacked[1], stacked[3] = _servable_scale(stacked[1]), _servable_scale(stacked[3])
        if kind == "mxq":
            new = MxqFp8Experts(*stacked, block, module.act_fn)
        else:
            new = _fp8_experts(getattr(module, "config", model.config), stacked, block,
                               module.act_fn)
        model.set_submodule(name, new)


def load_deepseek_v3_fp8(path: Union[str, Path], *, device: Union[str, torch.device] = "cpu",
                         linears: str = "mxq", experts: Optional[str] = None) -> nn.Module:
    """``DeepseekV3ForCausalLM`` (eval mode) from a DeepSeek-V3 FP8 checkpoint directory:
    ``config.json`` with ``quantization_config`` {quant_method "fp8", weight_block_size [bn, bk],
    activation_scheme "dynamic"} and ``*.safetensors`` with E4M3 ``*.weight`` and float32
    ``*.weight_scale_inv`` for the quantized linears, bf16 (fp32 router bias) for the rest.

    The tensors are read with safetensors straight onto ``device`` and kept in the file's dtypes.
    ``linears`` says what the quantized linears become:

    * ``"mxq"``: :class:`MxqFp8Linear` over the file's tensors;
    * ``"fp8"``: transformers' ``FP8Linear`` over them, as ``from_pretrained`` leaves them on a
      GPU (to try :func:`~.fp8_linear.replace_fp8_linears`; its own forward needs transformers' Hub kernels);
    * ``"dequantized"``: ``nn.Linear`` with weight q · scale in bf16: transformers' eager path
      with the same weights, the reference mxq is compared with.

    ``experts`` says what the routed experts become (3-D tensors in transformers >= 5), by
    default as ``linears``: ``"mxq"`` :class:`MxqFp8Experts`, ``"fp8"`` transformers'
    ``FP8Experts``, ``"dequantized"`` the model's own experts module in bf16. The
    multi-token-prediction layer of the published checkpoint (``model.layers.<num_hidden_layers>``)
    is skipped, as transformers does. The model is built on the meta device and takes the
    file's tensors: in ``"mxq"`` mode no bf16 copy of an FP8 weight is made, and the only copy
    is the stacking of the per-expert tensors."""
    experts = linears if experts is None else experts
    for arg, value in (("linears", linears), ("experts", experts)):
        if value not in _LINEAR_KINDS:
            raise InvalidArgumentError(f"{arg}: expected one of {_LINEAR_KINDS}, found {value!r}")
    path = Path(path)
    try:
        config_dict = json.loads((path / "config.json").read_text())
    except OSError as e:
        raise Error(f"{path}: cannot read config.json: {e}", "io") from e
    block = _fp8_quantization(path, config_dict)
    device = indexed_device(check_device(device))
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
    _load_fused_experts(model, tensors, block, dtype, experts, device)
    return take_checkpoint_tensors(model, tensors, path, config, device)
