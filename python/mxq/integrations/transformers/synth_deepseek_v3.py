"""Writes a tiny DeepSeek-V3 FP8 checkpoint in the published on-disk format.

    python -m mxq.integrations.transformers.synth_deepseek_v3 DIR [--seed N]

``DIR/config.json``: transformers' DeepseekV3Config with the ``quantization_config`` that
deepseek-ai/DeepSeek-V3 publishes ({"activation_scheme": "dynamic", "fmt": "e4m3",
"quant_method": "fp8", "weight_block_size": [128, 128]}). ``DIR/model.safetensors``: the
published tensor names and dtypes: every attention and MLP linear (dense, shared and each routed
expert) as E4M3 ``*.weight`` + float32 ``*.weight_scale_inv`` [ceil(N/128), ceil(K/128)],
quantized from random weights by mxq's block-FP8 quantizer; embeddings, norms, the router
weight and ``lm_head`` in bf16, the router's ``e_score_correction_bias`` in float32.

Two layers: layer 0 dense, layer 1 MoE (4 routed experts, top-2, one shared expert). Hidden sizes
are multiples of 128 except where DeepSeek-V3's own shapes are not (``kv_a_proj_with_mqa`` has
kv_lora_rank + qk_rope_head_dim rows, 576 in DeepSeek-V3): here 160 rows, and 192-column
``o_proj`` and 320-row ``kv_b_proj``, so the last scale block is partial.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

from ... import torch_ops as _torch_ops  # noqa: F401  (registers torch.ops.mxq.*)

# The quantization_config of deepseek-ai/DeepSeek-V3's config.json, verbatim.
QUANTIZATION_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}

# The std of o_proj and down_proj weights relative to 1/sqrt(K).
OUTPUT_SCALE = 0.25

TINY = dict(
    vocab_size=512, hidden_size=256, intermediate_size=384, moe_intermediate_size=128,
    num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2,
    q_lora_rank=128, kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=96,
    n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=256,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, num_nextn_predict_layers=0,
)


def tiny_config(**overrides):
    """transformers' DeepseekV3Config of the tiny model."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(**{**TINY, **overrides})


def _linear_shapes(config) -> Dict[str, Sequence[int]]:
    """Name -> [N, K] of every linear the published checkpoint stores in block-FP8."""
    h, heads = config.hidden_size, config.num_attention_heads
    shapes = {}
    for i in range(config.num_hidden_layers):
        a = f"model.layers.{i}.self_attn."
        shapes[a + "q_a_proj"] = (config.q_lora_rank, h)
        shapes[a + "q_b_proj"] = (heads * (config.qk_nope_head_dim + config.qk_rope_head_dim),
                                  config.q_lora_rank)
        shapes[a + "kv_a_proj_with_mqa"] = (config.kv_lora_rank + config.qk_rope_head_dim, h)
        shapes[a + "kv_b_proj"] = (heads * (config.qk_nope_head_dim + config.v_head_dim),
                                   config.kv_lora_rank)
        shapes[a + "o_proj"] = (h, heads * config.v_head_dim)
        mlp = f"model.layers.{i}.mlp."
        if i < config.first_k_dense_replace:
            mlps = {mlp: config.intermediate_size}
        else:
            mlps = {f"{mlp}experts.{e}.": config.moe_intermediate_size
                    for e in range(config.n_routed_experts)}
            mlps[mlp + "shared_experts."] = config.moe_intermediate_size * config.n_shared_experts
        for prefix, inter in mlps.items():
            shapes[prefix + "gate_proj"] = (inter, h)
            shapes[prefix + "up_proj"] = (inter, h)
            shapes[prefix + "down_proj"] = (h, inter)
    return shapes


def synthesize(directory: Path, seed: int = 0, config=None) -> Path:
    """Writes config.json and model.safetensors into ``directory`` (created); returns it."""
    from safetensors.torch import save_file

    config = config if config is not None else tiny_config()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    bn, bk = QUANTIZATION_CONFIG["weight_block_size"]
    tensors = {}
    for name, (n, k) in _linear_shapes(config).items():
        # 1/sqrt(K): activations of order one inside a layer. The layers' outputs into the
        # residual stream (o_proj, down_proj) are smaller, as in a trained deep model, so the
        # E4M3 rounding of activations moves the logits by a few percent, not tens.
        std = (OUTPUT_SCALE if name.endswith(("o_proj", "down_proj")) else 1) / math.sqrt(k)
        q, scale = torch.ops.mxq.quantize_fp8_block(normal(n, k, std=std), bn, bk)
        tensors[name + ".weight"] = q
        tensors[name + ".weight_scale_inv"] = scale
    h = config.hidden_size
    bf16 = torch.bfloat16
    tensors["model.embed_tokens.weight"] = normal(config.vocab_size, h, std=1.0).to(bf16)
    tensors["lm_head.weight"] = normal(config.vocab_size, h, std=1 / math.sqrt(h)).to(bf16)
    tensors["model.norm.weight"] = torch.ones(h, dtype=bf16)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for norm, size in (("input_layernorm", h), ("post_attention_layernorm", h),
                           ("self_attn.q_a_layernorm", config.q_lora_rank),
                           ("self_attn.kv_a_layernorm", config.kv_lora_rank)):
            tensors[p + norm + ".weight"] = (1 + normal(size, std=0.1)).to(bf16)
        if i >= config.first_k_dense_replace:
            e = config.n_routed_experts
            tensors[p + "mlp.gate.weight"] = normal(e, h, std=1 / math.sqrt(h)).to(bf16)
            tensors[p + "mlp.gate.e_score_correction_bias"] = normal(e, std=0.01)
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())},
              str(directory / "model.safetensors"), metadata={"format": "pt"})

    config_dict = config.to_dict()
    config_dict["architectures"] = ["DeepseekV3ForCausalLM"]
    config_dict.pop("dtype", None)  # transformers 5 names it so; the published file torch_dtype
    config_dict["torch_dtype"] = "bfloat16"
    config_dict["quantization_config"] = dict(QUANTIZATION_CONFIG)
    (directory / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True)
                                           + "\n")
    return directory


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mxq.integrations.transformers.synth_deepseek_v3",
        description="Write a tiny DeepSeek-V3 FP8 checkpoint (config.json + model.safetensors, "
                    "the published format: E4M3 weights with float32 weight_scale_inv in 128x128 "
                    "blocks) with random weights quantized by mxq.")
    parser.add_argument("directory", type=Path, help="output folder (created)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    synthesize(args.directory, args.seed)
    print(f"wrote {args.directory / 'config.json'} and {args.directory / 'model.safetensors'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
