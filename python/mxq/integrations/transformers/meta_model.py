"""What the checkpoint loaders (deepseek_v3_loader.py, gpt_oss_loader.py) share: a transformers
model built on the meta device takes the checkpoint's tensors without a copy, and nothing of it
may be left on the meta device."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import torch
from torch import Tensor, nn

from ..._errors import Error

__all__ = ["indexed_device", "take_checkpoint_tensors"]


def indexed_device(device: torch.device) -> torch.device:
    """``device`` with its index: safetensors and the prepared tensors need a concrete GPU."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def take_checkpoint_tensors(model: nn.Module, tensors: Dict[str, Tensor], path: Path,
                            config: Any, device: torch.device) -> nn.Module:
    """Assigns ``tensors`` (already on ``device``) to ``model``'s parameters and buffers of the
    same names, computes the rotary embedding on ``device`` (its inverse frequencies are not in
    a checkpoint), and returns the model in eval mode. Raises mxq.Error ("format") for a tensor
    the model has no place for, or a parameter or buffer left on the meta device."""
    unexpected = model.load_state_dict(tensors, strict=False, assign=True).unexpected_keys
    if unexpected:
        raise Error(f"{path}: tensors the model has no place for: {sorted(unexpected)[:8]}",
                    "format")
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config).to(device)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise Error(f"{path}: no tensor in the checkpoint for {left[:8]}", "format")
    return model.eval()
