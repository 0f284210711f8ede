"""Tiny checkpoints in the on-disk format of gpt-oss and DeepSeek-V4, for tests and examples.

    python -m mxq.integrations.transformers.synth gpt-oss DIR --layers 2 --experts 8
    python -m mxq.integrations.transformers.synth deepseek-v4 DIR --intermediate 160

The model is built from transformers' own config class with random weights (seeded); its
routed experts are quantized by mxq's MXFP4 quantizer (scale rule "floor") and written as the
published checkpoints hold them, next to a config.json of the same form:

* gpt-oss: ``model.layers.L.mlp.experts.{gate_up,down}_proj_{blocks,scales,bias}`` (uint8
  blocks [E, rows, K/32, 16], uint8 E8M0 scales, bf16 biases; gate/up rows interleaved),
  everything else bf16, ``quantization_config`` {"quant_method": "mxfp4", ...};
* DeepSeek-V4: DeepSeek's own names (``layers.L.ffn.experts.e.w1.weight`` int8 [I, H/2] +
  ``.scale`` float8_e8m0fnu [I, H/32], ``layers.L.attn.wq_a.weight`` ...), linears in FP8 E4M3
  with 128x128 UE8M0 block scales except those the published model keeps in bf16 / fp32,
  ``quantization_config`` {"quant_method": "fp8", "scale_fmt": "ue8m0", ...} and
  ``expert_dtype`` "fp4".

An intermediate size that is not a multiple of 128 (160 for gpt-oss, 96 for DeepSeek-V4 by
default) exercises mxq's padding of the per-rank intermediate size to the kernels' 128.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

import mxq.torch_ops  # noqa: F401  (torch.ops.mxq.quantize_mxfp4 / quantize_fp8_block)

__all__ = ["gpt_oss_config", "deepseek_v4_config", "write_gpt_oss", "write_deepseek_v4", "main"]

_E8M0 = getattr(torch, "float8_e8m0fnu", None)


def gpt_oss_config(layers: int = 2, experts: int = 8, top_k: int = 2, hidden: int = 128,
                   intermediate: int = 160, vocab: int = 256, init_std: float = 0.05,
                   swiglu_limit: float = 7.0, heads: int = 4, kv_heads: int = 2,
                   head_dim: Optional[int] = None, sliding_window: int = 8):
    from transformers import GptOssConfig

    return GptOssConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                        num_hidden_layers=layers, num_attention_heads=heads,
                        num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads,
                        num_local_experts=experts, num_experts_per_tok=top_k,
                        sliding_window=sliding_window, initializer_range=init_std,
                        swiglu_limit=swiglu_limit,
                        tie_word_embeddings=False, eos_token_id=vocab - 1,
                        pad_token_id=vocab - 2)


def deepseek_v4_config(layers: int = 2, experts: int = 8, top_k: int = 2, hidden: int = 128,
                       intermediate: int = 96, vocab: int = 256, init_std: float = 0.05,
                       swiglu_limit: float = 10.0):
    from transformers import DeepseekV4Config

    # Layer 0 routes by hash, the others by the learned router; attention alternates the
    # sliding window and the compressed sparse attention (its compressor and indexer).
    return DeepseekV4Config(
        vocab_size=vocab, hidden_size=hidden, moe_intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
        q_lora_rank=64, num_experts_per_tok=top_k, n_routed_experts=experts, o_groups=2,
        o_lora_rank=32, index_n_heads=2, index_head_dim=32, index_topk=4, sliding_window=8,
        hc_mult=2, mlp_layer_types=["hash_moe"] + ["moe"] * (layers - 1),
        layer_types=[("sliding_attention", "compressed_sparse_attention")[i % 2]
                     for i in range(layers)],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        max_position_embeddings=1024, initializer_range=init_std, swiglu_limit=swiglu_limit,
        eos_token_id=vocab - 1, bos_token_id=0)


def _mxfp4(w: Tensor) -> Tuple[Tensor, Tensor]:
    """MXFP4 of w [..., K] along K: uint8 blocks [..., K/32, 16], E8M0 scales [..., K/32]."""
    blocks, scales = torch.ops.mxq.quantize_mxfp4(w.detach().float().contiguous())
    return blocks, scales


def _random_model(config, seed: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _save(out_dir: Path, config_dict: Dict, tensors: Dict[str, Tensor]) -> Path:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    return out_dir


def write_gpt_oss(out_dir, *, seed: int = 0, **shape) -> Path:
    """A gpt-oss checkpoint (config.json + model.safetensors) in ``out_dir``; ``shape``:
    ``gpt_oss_config``'s keywords."""
    config = gpt_oss_config(**shape)
    model = _random_model(config, seed)
    tensors: Dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            # transformers holds [E, K, N] (x @ W); the checkpoint holds rows [E, N, K/32, 16].
            blocks, scales = _mxfp4(t.transpose(1, 2))
            tensors[name + "_blocks"] = blocks
            tensors[name + "_scales"] = scales.view(torch.uint8) if _E8M0 else scales
        else:
            tensors[name] = t.to(torch.bfloat16)
    config_dict = config.to_dict()
    config_dict.update(
        dtype="bfloat16", experts_per_token=config.num_experts_per_tok,
        quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"]})
    return _save(Path(out_dir), config_dict, tensors)


# transformers' names of a DeepSeek-V4 model -> DeepSeek's checkpoint names (the inverse of
# transformers' conversion mapping for "deepseek_v4"; applied in order).
_V4_NAMES = [
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^lm_head\.weight$", "head.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"^model\.", ""),
    (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),
    (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"),
    (r"\.self_attn\.sinks$", ".self_attn.attn_sink"),
    (r"\.compressor\.indexer\.scorer\.weights_proj\.", ".indexer.weights_proj."),
    (r"\.compressor\.indexer\.q_b_proj\.", ".indexer.wq_b."),
    (r"\.compressor\.indexer\.", ".indexer.compressor."),
    (r"\.q_a_proj\.", ".wq_a."),
    (r"\.q_a_norm\.", ".q_norm."),
    (r"\.self_attn\.q_b_proj\.", ".self_attn.wq_b."),
    (r"\.kv_proj\.", ".wkv."),
    (r"\.kv_norm\.", ".norm."),
    (r"\.o_a_proj\.", ".wo_a."),
    (r"\.o_b_proj\.", ".wo_b."),
    (r"\.compressor\.gate_proj\.", ".compressor.wgate."),
    (r"\.position_bias$", ".ape"),
    (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.gate.bias"),
    (r"\.shared_experts\.gate_proj\.", ".shared_experts.w1."),
    (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),
    (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."),
    (r"\.self_attn\.", ".attn."),
    (r"\.mlp\.", ".ffn."),
]


def deepseek_v4_name(name: str) -> str:
    """DeepSeek's checkpoint name of transformers' parameter ``name``."""
    for pattern, replacement in _V4_NAMES:
        name = re.sub(pattern, replacement, name)
    return name


def _fp8_linears(model) -> set:
    """The linears DeepSeek-V4 checkpoints hold in FP8: every nn.Linear but the output head and
    those transformers keeps in higher precision (the checkpoint's bf16 / fp32 tensors)."""
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or []) + \
        list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
    out = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head" and not any(
                re.search(r"(^|\.)" + re.escape(k) + r"$", name) for k in keep):
            out.add(name)
    return out


def _fp32_names(model) -> Sequence[str]:
    return list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])


def write_deepseek_v4(out_dir, *, seed: int = 0, **shape) -> Path:
    """A DeepSeek-V4 checkpoint (config.json + model.safetensors) in ``out_dir``; ``shape``:
    ``deepseek_v4_config``'s keywords."""
    if _E8M0 is None:
        raise RuntimeError("DeepSeek-V4 checkpoints hold float8_e8m0fnu scales: torch >= 2.7")
    config = deepseek_v4_config(**shape)
    model = _random_model(config, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    fp8, fp32 = _fp8_linears(model), _fp32_names(model)
    tensors: Dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        if name.endswith(".mlp.experts.gate_up_proj") or name.endswith(".mlp.experts.down_proj"):
            stem = deepseek_v4_name(module)
            halves = t.chunk(2, dim=1) if leaf == "gate_up_proj" else (t,)
            for w, matrices in zip(("w1", "w3") if len(halves) == 2 else ("w2",), halves):
                blocks, scales = _mxfp4(matrices)  # [E, N, K/32, 16]
                for e in range(t.shape[0]):
                    tensors[f"{stem}.{e}.{w}.weight"] = blocks[e].reshape(
                        blocks.shape[1], -1).view(torch.int8)
                    tensors[f"{stem}.{e}.{w}.scale"] = scales[e]
        elif leaf == "tid2eid":  # a random expert set per token (zeros would route to expert 0)
            tensors[deepseek_v4_name(name)] = torch.stack(
                [torch.randperm(config.n_routed_experts, generator=generator)[:t.shape[1]]
                 for _ in range(t.shape[0])]).to(t.dtype)
        elif module in fp8 and leaf == "weight":
            q, scale = torch.ops.mxq.quantize_fp8_block(t.float().contiguous(), 128, 128,
                                                        "ue8m0")
            stem = deepseek_v4_name(name)[:-len(".weight")]
            tensors[stem + ".weight"] = q
            tensors[stem + ".scale"] = scale.to(_E8M0)
        elif any(re.search(r"(^|\.)" + re.escape(k) + r"(\.|$)", name) for k in fp32):
            tensors[deepseek_v4_name(name)] = t.float()
        else:
            tensors[deepseek_v4_name(name)] = t.to(torch.bfloat16) if t.is_floating_point() else t
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.update(dtype="bfloat16", expert_dtype="fp4", quantization_config={
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "scale_fmt": "ue8m0", "weight_block_size": [128, 128]})
    return _save(Path(out_dir), config_dict, tensors)


_WRITERS = {"gpt-oss": write_gpt_oss, "deepseek-v4": write_deepseek_v4}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mxq.integrations.transformers.synth",
        description="Write a tiny checkpoint (config.json + model.safetensors) in the on-disk "
                    "format of gpt-oss or DeepSeek-V4: random weights from transformers' config "
                    "class, routed experts quantized by mxq's MXFP4 quantizer.")
    parser.add_argument("model", choices=sorted(_WRITERS), help="the checkpoint format")
    parser.add_argument("out_dir", help="the directory to write (created)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--experts", type=int, default=8, help="routed experts (default 8)")
    parser.add_argument("--top-k", type=int, default=2, help="experts per token (default 2)")
    parser.add_argument("--hidden", type=int, default=128,
                        help="hidden size, a multiple of 32 (default 128)")
    parser.add_argument("--intermediate", type=int, default=None,
                        help="intermediate size per expert, a multiple of 32; not a multiple "
                             "of 128 to exercise padding (default 160 for gpt-oss, 96 for "
                             "DeepSeek-V4, whose FP8 shared expert has it too: keep it below 128 "
                             "or a multiple of 128, as transformers' FP8 dequantization assumes)")
    parser.add_argument("--vocab", type=int, default=256, help="vocabulary size (default 256)")
    parser.add_argument("--init-std", type=float, default=0.05,
                        help="standard deviation of the random weights (default 0.05)")
    parser.add_argument("--swiglu-limit", type=float, default=None,
                        help="the experts' SwiGLU clamp (default: the published model's, 7 for "
                             "gpt-oss, 10 for DeepSeek-V4; smaller values make tiny random "
                             "models reach it)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    shape = dict(layers=args.layers, experts=args.experts, top_k=args.top_k, hidden=args.hidden,
                 vocab=args.vocab, init_std=args.init_std)
    for key in ("intermediate", "swiglu_limit"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    for name in ("hidden", "intermediate"):
        value = shape.get(name)
        if value is not None and (value <= 0 or value % 32):
            parser.error(f"--{name}: expected a positive multiple of 32 (MXFP4 blocks), found "
                         f"{value}")
    path = _WRITERS[args.model](args.out_dir, seed=args.seed, **shape)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
