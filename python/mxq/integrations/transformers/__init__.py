"""mxq's layers inside Hugging Face transformers models (docs/transformers.md)."""

from .fp8_linear import MxqFp8Experts, MxqFp8Linear, load_deepseek_v3_fp8, replace_fp8_linears

__all__ = ["MxqFp8Experts", "MxqFp8Linear", "load_deepseek_v3_fp8", "replace_fp8_linears"]
