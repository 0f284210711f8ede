"""mxq inside Hugging Face transformers (docs/transformers.md).

Importing this package imports transformers (>= 5.17) and registers the "mxq" experts
implementation, so ``from_pretrained(..., experts_implementation="mxq")`` and
``model.set_experts_implementation("mxq")`` accept it; :func:`use_mxq_experts` then prepares a
loaded gpt-oss or DeepSeek-V4 model's MXFP4 experts, as stored in its checkpoint, and switches it
to mxq. ``mxq`` itself never imports transformers.

``python -m mxq.integrations.transformers.synth`` writes tiny checkpoints in the on-disk format
of gpt-oss and DeepSeek-V4.
"""

from __future__ import annotations

from .experts import MXQ, mxq_experts_forward, register, use_mxq_experts

register()

__all__ = ["MXQ", "mxq_experts_forward", "register", "use_mxq_experts"]
