"""A gpt-oss checkpoint loaded into transformers' ``GptOssForCausalLM`` with mxq's experts only.

``from_pretrained`` followed by :func:`~.experts.use_mxq_experts` keeps transformers'
dequantized bf16 experts next to mxq's MXFP4 ones (they are what "eager" and "grouped_mm" run):
four times the MXFP4 bytes, which for gpt-oss-120b (117 B expert parameters, 234 GB in bf16)
fits on no single GPU. :func:`load_gpt_oss` builds the model skeleton on the meta device, reads
the checkpoint's other tensors (attention, router, norms, embeddings; bf16 as stored) straight
onto the target device, and gives each experts module only mxq's prepared MXFP4 tensors: the
experts' own floating parameters are never made.

See docs/transformers.md ("Loading gpt-oss with mxq's experts only").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Union

import torch
from torch import Tensor, nn

from ..._errors import Error
from ...torch_ops import Mxfp4MoE
from .experts import (_CHILD, MXQ, _Checkpoint, _check_device, _experts_classes,
                      _find_experts, _gpt_oss_from_checkpoint, _import_transformers,
                      _set_implementation, _spec, _unsupported, register)
from .meta_model import indexed_device, take_checkpoint_tensors

__all__ = ["load_gpt_oss"]

# The experts' floating parameters of transformers' GptOssExperts (not made: mxq's prepared
# tensors replace them) and the checkpoint's names of what mxq reads instead.
_EXPERT_PARAMETERS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
_EXPERT_SUFFIXES = tuple(f"{p}_{part}" for p in ("gate_up_proj", "down_proj")
                         for part in ("blocks", "scales", "bias"))


def _gpt_oss_config(path: Path):
    try:
        config_dict = json.loads((path / "config.json").read_text())
    except OSError as e:
        raise Error(f"{path}: cannot read config.json: {e}", "io") from e
    if config_dict.get("model_type") != "gpt_oss":
        raise _unsupported(f"{path}: model_type {config_dict.get('model_type')!r}: load_gpt_oss "
                           "loads gpt-oss checkpoints (model_type \"gpt_oss\")")
    quant = config_dict.get("quantization_config") or {}
    if quant.get("quant_method") != "mxfp4":
        raise _unsupported(f"{path}: quantization_config quant_method "
                           f"{quant.get('quant_method')!r}: load_gpt_oss reads MXFP4 experts "
                           "(\"mxfp4\"); load other checkpoints with from_pretrained")
    from transformers import GptOssConfig

    return GptOssConfig.from_dict({k: v for k, v in config_dict.items()
                                   if k != "quantization_config"})


def load_gpt_oss(path: Union[str, Path], *, device: Union[str, torch.device] = "cpu",
                 alignment: int = 128) -> nn.Module:
    """``GptOssForCausalLM`` (eval mode, experts implementation "mxq") from a gpt-oss checkpoint
    directory (config.json with ``quant_method`` "mxfp4", the experts as ``*_blocks`` /
    ``*_scales`` / ``*_bias``), on ``device`` ("cpu" or a CUDA device).

    Every tensor but the experts' is read as stored (bf16) onto ``device``; each experts module
    gets an ``Mxfp4MoE`` child holding its prepared MXFP4 weights (read as stored, prepared on
    ``device``) and no floating weights of its own, so "eager" and "grouped_mm" cannot run on
    this model (load with ``from_pretrained`` and :func:`~.experts.use_mxq_experts` for those).
    Raises :class:`mxq.Error` for another model, another quantization, CUDA without CUDA, a
    tensor missing from the checkpoint or one the model has no place for."""
    transformers = _import_transformers()
    register()
    path = Path(path)
    config = _gpt_oss_config(path)
    device = torch.device(device)
    _check_device(device, "load_gpt_oss")
    device = indexed_device(device)
    ckpt = _Checkpoint(path)

    with torch.device("meta"):
        model = transformers.GptOssForCausalLM(config)
    experts = _find_experts(model)
    classes = _experts_classes()
    top_k = int(config.num_experts_per_tok)
    prepared: Dict[str, Mxfp4MoE] = {}
    for name, module in experts.items():
        spec = _spec(name, module, "gpt_oss", classes)
        *weights, layout = _gpt_oss_from_checkpoint(ckpt, name, spec)
        moe = Mxfp4MoE(spec.num_experts, spec.hidden_size, spec.intermediate_size, top_k,
                       has_bias=True, router=False, alignment=alignment,
                       activation=spec.activation, swiglu_alpha=spec.swiglu_alpha,
                       swiglu_limit=spec.swiglu_limit, device=device)
        prepared[name] = moe.load_experts(*weights, layout=layout)

    tensors: Dict[str, Tensor] = {}
    for key in ckpt.names():
        if ".experts." in key and key.endswith(_EXPERT_SUFFIXES):
            continue  # read above, as stored
        tensors[key] = ckpt.get(key).to(device)
    for name, module in experts.items():
        for parameter in _EXPERT_PARAMETERS:
            if hasattr(module, parameter):
                delattr(module, parameter)  # never made: the mxq child replaces them
        module.add_module(_CHILD, prepared[name])
    _set_implementation(model, MXQ)
    return take_checkpoint_tensors(model, tensors, path, config, device)
