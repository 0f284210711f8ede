"""Integrations of mxq's ops into other frameworks (each imported on its own, never by ``mxq``).

``mxq.integrations.transformers``: mxq's MXFP4 MoE as a Hugging Face transformers experts
implementation, and its block-FP8 linear in DeepSeek-V3 models (docs/transformers.md).
"""
