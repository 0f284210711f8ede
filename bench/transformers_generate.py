#!/usr/bin/env python3
"""gpt-oss in Hugging Face transformers: decode tokens/s and prefill time with mxq's experts
against transformers' own bf16 "grouped_mm" experts, on the same model in the same run.

    python3 bench/transformers_generate.py [--shape gpt-oss-20b] [--layers 2] [--prompt 2048]
                                           [--new-tokens 64] [--batch 1] [--repeats 5] [--json]
    python3 bench/transformers_generate.py --shape tiny --device cpu --repeats 1   (a smoke run)

The model is synthetic (mxq.integrations.transformers.synth: random weights, experts quantized to
MXFP4, written in gpt-oss's on-disk format into --checkpoint or a temporary folder) with the
sizes of --shape and --layers decoder layers. transformers loads it with its experts dequantized
to bf16 (`Mxfp4Config(dequantize=True)`): those run "grouped_mm" (torch._grouped_mm over the
experts); `use_mxq_experts` prepares the stored MXFP4 bytes for "mxq". The two implementations
alternate on the one loaded model (`set_experts_implementation`), so attention, norms, the
router and the LM head are the same work on both sides:

* decode: `generate` from a 32-token prompt, exactly --new-tokens greedy tokens (min = max),
  tokens/s = batch * new tokens / wall time (the prompt's prefill included), median of --repeats;
* prefill: one forward of a --prompt-token batch (no cache), wall time, median of --repeats.

Wall times are taken around synchronized calls (torch.cuda.synchronize), as a user of
`generate` sees them: the host work of transformers' eager loop is included on both sides.
Exit status: 0 done, 2 bad arguments or no CUDA where CUDA was asked for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import torch

SHAPES = {
    # gpt-oss-20b's sizes (config.json of openai/gpt-oss-20b): only the layer count differs.
    "gpt-oss-20b": dict(experts=32, top_k=4, hidden=2880, intermediate=2880, vocab=201088,
                        heads=64, kv_heads=8, head_dim=64, sliding_window=128, init_std=0.02),
    "tiny": dict(experts=8, top_k=2, hidden=128, intermediate=160, vocab=256),
}
DECODE_PROMPT = 32


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def load_model(checkpoint: Path, device: torch.device):
    import transformers

    from mxq.integrations.transformers import use_mxq_experts

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.bfloat16, device_map=str(device),
        experts_implementation="grouped_mm",
        quantization_config=transformers.Mxfp4Config(dequantize=True))
    model.eval()
    use_mxq_experts(model, checkpoint)  # switches the model to "mxq"
    return model


def measure(model, device: torch.device, vocab: int, prompt: int, new_tokens: int, batch: int,
            repeats: int) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)
    decode_ids = torch.randint(0, vocab - 2, (batch, DECODE_PROMPT), generator=g).to(device)
    prefill_ids = torch.randint(0, vocab - 2, (batch, prompt), generator=g).to(device)

    def decode():
        out = model.generate(decode_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=vocab - 2)
        assert out.shape[1] == DECODE_PROMPT + new_tokens
        return out

    def prefill():
        return model(prefill_ids, use_cache=False).logits

    sides = ("mxq", "grouped_mm")
    times = {side: {"decode": [], "prefill": []} for side in sides}
    tokens = {}
    with torch.no_grad():
        for side in sides:  # warm-up: kernels, autotuning, caches
            model.set_experts_implementation(side)
            tokens[side] = decode()
            prefill()
        for _ in range(repeats):  # alternating, so drift hits both sides
            for side in sides:
                model.set_experts_implementation(side)
                times[side]["decode"].append(_seconds(decode, device))
                times[side]["prefill"].append(_seconds(prefill, device))
    result = {}
    for side in sides:
        decode_s = statistics.median(times[side]["decode"])
        result[side] = {"decode_tokens_per_s": batch * new_tokens / decode_s,
                        "decode_ms_per_token": 1e3 * decode_s / new_tokens,
                        "prefill_ms": 1e3 * statistics.median(times[side]["prefill"])}
    result["decode_speedup"] = (result["mxq"]["decode_tokens_per_s"] /
                                result["grouped_mm"]["decode_tokens_per_s"])
    result["prefill_speedup"] = result["grouped_mm"]["prefill_ms"] / result["mxq"]["prefill_ms"]
    # Greedy tokens of the two: the same except after a near-tie (random weights have many).
    same = (tokens["mxq"] == tokens["grouped_mm"]).all(dim=0)
    result["greedy_tokens_equal_prefix"] = int(
        same.logical_not().nonzero()[0, 0].item() - DECODE_PROMPT if not same.all() else
        new_tokens)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt-oss-20b",
                        help="the model's sizes (default gpt-oss-20b)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--prompt", type=int, default=2048, help="prefill tokens (default 2048)")
    parser.add_argument("--new-tokens", type=int, default=64,
                        help="greedy tokens generated per decode run (default 64)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per run (default 1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side (median)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="write (or reuse, when it holds a config.json) the synthetic "
                             "checkpoint here instead of a temporary folder")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    for name in ("layers", "prompt", "new_tokens", "batch", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected at least 1, found "
                         f"{getattr(args, name)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("transformers_generate.py: no CUDA device is visible (--device cpu for a smoke run)",
              file=sys.stderr)
        return 2
    shape = SHAPES[args.shape]

    from mxq.integrations.transformers import synth

    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.checkpoint or Path(scratch) / "gpt-oss"
        if not (checkpoint / "config.json").is_file():
            print(f"transformers_generate.py: writing a {args.shape}-shaped checkpoint with "
                  f"{args.layers} layers to {checkpoint} ...", file=sys.stderr, flush=True)
            synth.write_gpt_oss(checkpoint, layers=args.layers, **shape)
        print("transformers_generate.py: loading ...", file=sys.stderr, flush=True)
        model = load_model(checkpoint, device)
        print("transformers_generate.py: timing ...", file=sys.stderr, flush=True)
        result = measure(model, device, shape["vocab"], args.prompt, args.new_tokens, args.batch,
                         args.repeats)
    import transformers

    result.update(shape=args.shape, layers=args.layers, prompt=args.prompt,
                  new_tokens=args.new_tokens, batch=args.batch, repeats=args.repeats,
                  device=(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
                  torch=torch.__version__, transformers=transformers.__version__)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.shape}-shaped gpt-oss, {args.layers} layers, batch {args.batch}, on "
          f"{result['device']} (torch {torch.__version__}, transformers "
          f"{transformers.__version__}); median of {args.repeats}, alternating")
    print(f"{'experts':>12} {'decode tok/s':>13} {'ms/token':>9} "
          f"{'prefill ' + str(args.prompt) + ' ms':>16}")
    for side in ("mxq", "grouped_mm"):
        r = result[side]
        print(f"{side:>12} {r['decode_tokens_per_s']:>13.1f} {r['decode_ms_per_token']:>9.2f} "
              f"{r['prefill_ms']:>16.1f}")
    print(f"mxq / grouped_mm: decode {result['decode_speedup']:.2f}x, prefill "
          f"{result['prefill_speedup']:.2f}x; greedy tokens equal for the first "
          f"{result['greedy_tokens_equal_prefix']} of {args.new_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
