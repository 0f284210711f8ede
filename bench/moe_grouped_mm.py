#!/usr/bin/env python3
"""mxq's MXFP4 MoE op against torch's bf16 grouped GEMM (``torch._grouped_mm``), same layer.

    python3 bench/moe_grouped_mm.py [--preset gpt-oss-120b] [--tokens 1,8,64,512,4096]
                                    [--repeats 50] [--sets 8] [--json]
    python3 bench/moe_grouped_mm.py --check [--device cpu|cuda]

The baseline is what an engine without an MXFP4 kernel runs: the experts' weights dequantized
once to bf16 (exactly: every E2M1 value times its E8M0 scale is a bf16), tokens sorted by expert
(argsort), GEMM1 and GEMM2 as ``torch._grouped_mm`` over the experts' row ranges, gpt-oss SwiGLU
(alpha 1.702, limit 7) with the biases, the routing weights applied and the top-k rows summed
(``index_add_``). mxq runs ``torch.ops.mxq.mxfp4_moe_into`` on the same MXFP4 weights (prepared
once) into its own output and workspace. Both take the same precomputed routing (``topk_ids``,
``topk_weights``): the router is not timed on either side.

Method (CUDA): random MXFP4 weights (codes uniform, scales 2^-8..2^-3), ``--sets`` input sets
of random activations and routings rotated across replays (different experts each time); one
CUDA graph per set and side; mxq and the baseline replayed alternately (so clock drift hits
both), CUDA events around each replay, median of ``--repeats`` per side. The effective TB/s is
the touched experts' MXFP4 bytes (mxq) or bf16 bytes (baseline) over the median time.

``--check`` runs a small layer (``--preset tiny`` unless given) at a few token counts without
timing, and compares mxq's output with the baseline's (normalized L2 difference; exit 1 above
the tolerance) and the baseline's dequantization with mxq's ``dequantize_mxfp4``. On the CPU,
a torch without a CPU ``_grouped_mm`` runs the baseline's GEMMs as one matmul per expert.
Exit status: 0 done, 1 a check failed, 2 bad arguments or no CUDA for a timed run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_graph_timing import capture, median_us  # noqa: E402

# (experts, hidden, intermediate, top_k)
PRESETS = {
    "gpt-oss-120b": (128, 2880, 2880, 4),
    "gpt-oss-20b": (32, 2880, 2880, 4),
    "tiny": (8, 256, 160, 2),
}
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
# Normalized L2 difference allowed between mxq and the baseline: both compute the same layer, but
# the baseline's GEMMs return bf16 (one rounding each, ~2^-9 relative) where mxq keeps fp32.
CHECK_TOLERANCE = 1e-2

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@dataclass
class Layer:
    """One MoE layer's MXFP4 tensors in mxq's "native" layout (gate rows, then up rows)."""
    experts: int
    hidden: int
    inter: int
    top_k: int
    w13: torch.Tensor        # uint8 [E, 2I, H/2]
    w13_scale: torch.Tensor  # uint8 [E, 2I, H/32]
    w13_bias: torch.Tensor   # bf16 [E, 2I]
    w2: torch.Tensor         # uint8 [E, H, I/2]
    w2_scale: torch.Tensor   # uint8 [E, H, I/32]
    w2_bias: torch.Tensor    # bf16 [E, H]

    def mxfp4_bytes_per_expert(self) -> int:
        rows13, rows2 = 2 * self.inter, self.hidden
        return (rows13 * (self.hidden // 2 + self.hidden // 32) + rows2 *
                (self.inter // 2 + self.inter // 32) + 2 * (rows13 + rows2))

    def bf16_bytes_per_expert(self) -> int:
        return 2 * (3 * self.inter * self.hidden + 2 * self.inter + self.hidden)


def random_layer(experts: int, hidden: int, inter: int, top_k: int, device: torch.device,
                 seed: int) -> Layer:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def codes(*shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(device)

    def scales(*shape: int) -> torch.Tensor:
        return torch.randint(119, 125, shape, generator=g, dtype=torch.uint8).to(device)

    def bias(*shape: int) -> torch.Tensor:
        return (0.5 * torch.randn(shape, generator=g)).to(torch.bfloat16).to(device)

    return Layer(experts, hidden, inter, top_k,
                 codes(experts, 2 * inter, hidden // 2), scales(experts, 2 * inter, hidden // 32),
                 bias(experts, 2 * inter), codes(experts, hidden, inter // 2),
                 scales(experts, hidden, inter // 32), bias(experts, hidden))


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 [..., R, C/2] codes (element 2j in the low nibble) and E8M0 [..., R, C/32] scales to
    bf16 [..., R, C] (exact)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    values = torch.stack([lut[(blocks & 0xF).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = values.flatten(-2)
    scale = torch.exp2(scales.float() - 127.0)
    shape = values.shape
    return (values.view(*shape[:-1], shape[-1] // 32, 32) * scale[..., None]).view(shape).to(
        torch.bfloat16)


class GroupedMmBaseline:
    """The bf16 layer on torch._grouped_mm (weights dequantized once, column-major as
    _grouped_mm's CUDA kernels take them)."""

    def __init__(self, layer: Layer):
        self.layer = layer
        w13 = torch.empty(layer.experts, 2 * layer.inter, layer.hidden, dtype=torch.bfloat16,
                          device=layer.w13.device)
        w2 = torch.empty(layer.experts, layer.hidden, layer.inter, dtype=torch.bfloat16,
                         device=layer.w2.device)
        for e in range(layer.experts):  # one expert at a time: no fp32 copy of every expert
            w13[e] = dequantize(layer.w13[e], layer.w13_scale[e])
            w2[e] = dequantize(layer.w2[e], layer.w2_scale[e])
        self.w13_t = w13.transpose(-2, -1)  # [E, H, 2I], column-major
        self.w2_t = w2.transpose(-2, -1)    # [E, I, H], column-major
        self.grouped_mm = torch._grouped_mm
        self.ones: Optional[torch.Tensor] = None

    def _mm(self, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        try:
            return self.grouped_mm(a, b, offs=offs)
        except (RuntimeError, NotImplementedError):
            if a.is_cuda:
                raise
            self.grouped_mm = _grouped_mm_loop  # this torch has no CPU _grouped_mm
            return self.grouped_mm(a, b, offs=offs)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        flat = topk_ids.flatten().long()
        order = torch.argsort(flat, stable=True)
        if self.ones is None or self.ones.numel() < flat.numel():
            self.ones = torch.ones(flat.numel(), dtype=torch.int32, device=x.device)
        counts = torch.zeros(layer.experts, dtype=torch.int32, device=x.device)
        counts.index_add_(0, flat, self.ones[:flat.numel()])  # bincount would synchronize
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        expert = flat[order]
        token = order // layer.top_k
        # Biases added in fp32 to the GEMMs' bf16 outputs (as a fused epilogue would).
        h = self._mm(x[token], self.w13_t, offs).float() + self.layer.w13_bias[expert].float()
        gate = h[:, :layer.inter].clamp(max=SWIGLU_LIMIT)
        up = h[:, layer.inter:].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
        act = ((up + 1.0) * gate * torch.sigmoid(SWIGLU_ALPHA * gate)).to(torch.bfloat16)
        y = self._mm(act, self.w2_t, offs).float() + self.layer.w2_bias[expert].float()
        y = y * topk_weights.flatten()[order, None]
        out = torch.zeros(x.shape[0], layer.hidden, dtype=torch.float32, device=x.device)
        return out.index_add_(0, token, y).to(torch.bfloat16)


def _grouped_mm_loop(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[-1], dtype=a.dtype, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ b[e]
        start = end
    return out


class MxqOp:
    """torch.ops.mxq.mxfp4_moe_into on the layer's prepared weights, into its own buffers."""

    def __init__(self, layer: Layer, max_tokens: int):
        import mxq.torch_ops as ops  # registers torch.ops.mxq.*

        self.layer = layer
        self.max_tokens = max_tokens
        self.prepared = torch.ops.mxq.mxfp4_moe_prepare(
            layer.w13, layer.w13_scale, layer.w13_bias, layer.w2, layer.w2_scale, layer.w2_bias,
            num_experts=layer.experts, intermediate_size=layer.inter)
        cuda = layer.w13.is_cuda
        size = ops.mxfp4_moe_workspace_bytes(layer.experts, layer.hidden, layer.inter,
                                             layer.top_k, max_tokens, cuda=cuda)
        self.workspace = torch.zeros(size, dtype=torch.uint8, device=layer.w13.device)

    def forward_into(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     out: torch.Tensor) -> None:
        layer = self.layer
        torch.ops.mxq.mxfp4_moe_into(
            x, *self.prepared, topk_ids, topk_weights, None, None, out, self.workspace,
            num_experts=layer.experts, intermediate_size=layer.inter, top_k=layer.top_k,
            max_tokens=self.max_tokens)


def random_inputs(layer: Layer, tokens: int, seed: int, device: torch.device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(tokens, layer.hidden, generator=g).to(torch.bfloat16).to(device)
    logits = torch.randn(tokens, layer.experts, generator=g)
    top = torch.topk(logits, layer.top_k, dim=-1)
    weights = torch.softmax(top.values, dim=-1).to(torch.float32)
    return x, top.indices.to(torch.int32).to(device), weights.to(device)


def normalized_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def check(preset: str, device: torch.device, tokens: list[int]) -> list[dict]:
    """mxq against the baseline on the same inputs; the baseline's dequantization against mxq's."""
    import mxq.formats

    layer = random_layer(*PRESETS[preset], device=device, seed=1)
    rows13 = 2 * layer.inter
    blocks = layer.w13[0].cpu().view(rows13, layer.hidden // 32, 16).numpy()
    reference = mxq.formats.dequantize_mxfp4(blocks, layer.w13_scale[0].cpu().numpy())
    ours = dequantize(layer.w13[0], layer.w13_scale[0]).float().cpu()
    if not torch.equal(ours, torch.from_numpy(reference).view(rows13, layer.hidden)):
        raise AssertionError("the baseline's dequantization differs from mxq.dequantize_mxfp4")
    base = GroupedMmBaseline(layer)
    op = MxqOp(layer, max(tokens))
    rows = []
    for t in tokens:
        x, ids, weights = random_inputs(layer, t, seed=100 + t, device=device)
        out = torch.empty(t, layer.hidden, dtype=torch.bfloat16, device=device)
        op.forward_into(x, ids, weights, out)
        rows.append({"tokens": t,
                     "normalized_difference": normalized_difference(out, base.forward(x, ids,
                                                                                       weights))})
    return rows


def time_point(layer: Layer, base: GroupedMmBaseline, op: MxqOp, tokens: int, sets: int,
               repeats: int) -> dict:
    device = layer.w13.device
    inputs = [random_inputs(layer, tokens, seed=1000 * tokens + s, device=device)
              for s in range(sets)]
    outs = [torch.empty(tokens, layer.hidden, dtype=torch.bfloat16, device=device)
            for _ in range(sets)]
    mxq_graphs, base_graphs, base_outs = [], [], []
    for s, (x, ids, weights) in enumerate(inputs):
        mxq_graphs.append(capture(lambda s=s, x=x, ids=ids, w=weights: op.forward_into(
            x, ids, w, outs[s])))
        holder = {}
        base_graphs.append(capture(lambda x=x, ids=ids, w=weights, holder=holder: holder.update(
            out=base.forward(x, ids, w))))
        base_outs.append(holder)
    times = median_us({"mxq": mxq_graphs, "grouped_mm": base_graphs}, repeats)
    mxq_us, base_us = times["mxq"], times["grouped_mm"]
    touched = statistics.mean(int(torch.unique(ids).numel()) for _, ids, _ in inputs)
    difference = normalized_difference(outs[0], base_outs[0]["out"])
    return {"tokens": tokens, "mxq_us": mxq_us, "grouped_mm_us": base_us,
            "speedup": base_us / mxq_us, "experts_touched": touched,
            "mxq_tbps": touched * layer.mxfp4_bytes_per_expert() / (mxq_us * 1e-6) / 1e12,
            "grouped_mm_tbps": touched * layer.bf16_bytes_per_expert() / (base_us * 1e-6) / 1e12,
            "normalized_difference": difference}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="layer shape (default gpt-oss-120b; tiny with --check)")
    parser.add_argument("--tokens", default=None,
                        help="comma-separated token counts (default 1,8,64,512,4096; "
                             "1,5,33 with --check)")
    parser.add_argument("--repeats", type=int, default=50, help="timed replays per side (>= 20)")
    parser.add_argument("--sets", type=int, default=8, help="input sets rotated across replays")
    parser.add_argument("--device", default=None,
                        help="cuda (default) or cpu (only with --check)")
    parser.add_argument("--check", action="store_true",
                        help="compare outputs on a small layer instead of timing")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        tokens = [int(t) for t in (args.tokens or ("1,5,33" if args.check else
                                                   "1,8,64,512,4096")).split(",")]
    except ValueError:
        parser.error(f"--tokens: expected comma-separated integers, found {args.tokens!r}")
    if any(t < 1 for t in tokens):
        parser.error(f"--tokens: every count must be >= 1, found {args.tokens!r}")
    device = torch.device(args.device or "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("moe_grouped_mm.py: no CUDA device is visible (use --check --device cpu)",
              file=sys.stderr)
        return 2
    if args.check:
        rows = check(args.preset or "tiny", device, tokens)
        worst = max(r["normalized_difference"] for r in rows)
        if args.json:
            print(json.dumps({"check": rows, "tolerance": CHECK_TOLERANCE}))
        else:
            for r in rows:
                print(f"T={r['tokens']}: normalized difference {r['normalized_difference']:.2e}")
        return 0 if worst <= CHECK_TOLERANCE else 1
    if device.type != "cuda":
        parser.error("timing needs --device cuda (the CPU is for --check)")
    if args.repeats < 20:
        parser.error(f"--repeats: expected at least 20, found {args.repeats}")
    preset = args.preset or "gpt-oss-120b"
    layer = random_layer(*PRESETS[preset], device=device, seed=1)
    base = GroupedMmBaseline(layer)
    op = MxqOp(layer, max(tokens))
    points = []
    for t in tokens:
        print(f"moe_grouped_mm.py: T={t} ...", file=sys.stderr, flush=True)
        points.append(time_point(layer, base, op, t, args.sets, args.repeats))
    result = {"preset": preset, "gpu": torch.cuda.get_device_name(device),
              "torch": torch.__version__, "repeats": args.repeats, "sets": args.sets,
              "points": points}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{preset} on {result['gpu']}, torch {torch.__version__}; CUDA graphs, alternating "
          f"samples, median of {args.repeats}")
    print(f"{'T':>6} {'mxq us':>9} {'grouped_mm us':>14} {'speedup':>8} {'mxq TB/s':>9} "
          f"{'bf16 TB/s':>10} {'difference':>11}")
    for p in points:
        print(f"{p['tokens']:>6} {p['mxq_us']:>9.1f} {p['grouped_mm_us']:>14.1f} "
              f"{p['speedup']:>7.2f}x {p['mxq_tbps']:>9.2f} {p['grouped_mm_tbps']:>10.2f} "
              f"{p['normalized_difference']:>11.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
