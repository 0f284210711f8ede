"""mxq inside Hugging Face transformers (docs/transformers.md).

Importing this package imports transformers (>= 5.17) and registers the "mxq" experts
implementation, so ``from_pretrained(..., experts_implementation="mxq")`` and
``model.set_experts_implementation("mxq")`` accept it; :func:`use_mxq_experts` then prepares a
loaded gpt-oss or DeepSeek-V4 model's MXFP4 experts, as stored in its checkpoint, and switches it
to mxq; :func:`load_gpt_oss` loads a gpt-oss checkpoint with mxq's experts only (no bf16
copy of them). :func:`replace_fp8_linears` puts mxq's block-FP8 linear (and experts) in place of a
DeepSeek-V3 model's FP8 ones; :func:`load_deepseek_v3_fp8` loads such a checkpoint with them.
``mxq`` itself never imports transformers.

``python -m mxq.integrations.transformers.synth`` writes tiny checkpoints in the on-disk format
of gpt-oss and DeepSeek-V4, ``python -m mxq.integrations.transformers.synth_deepseek_v3`` of
DeepSeek-V3 (FP8).
"""

from __future__ import annotations

from .experts import MXQ, mxq_experts_forward, register, use_mxq_experts
from .deepseek_v3_loader import load_deepseek_v3_fp8
from .fp8_linear import MxqFp8Experts, MxqFp8Linear, replace_fp8_linears
from .gpt_oss_loader import load_gpt_oss

register()

__all__ = ["MXQ", "MxqFp8Experts", "MxqFp8Linear", "load_deepseek_v3_fp8", "load_gpt_oss",
           "mxq_experts_forward", "register", "replace_fp8_linears", "use_mxq_experts"]
