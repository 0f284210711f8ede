#!/usr/bin/env python3
"""mxq's block-FP8 GEMM against DeepGEMM's ``fp8_gemm_nt``, on the same inputs in one process.

    python3 bench/linear_deepgemm.py [--deepgemm DIR] [--shape N,K ...] [--m 1,64,4096]
                                     [--repeats 30] [--json]
    python3 bench/linear_deepgemm.py --check [--device cpu|cuda]

Both sides take DeepGEMM's call: ``fp8_gemm_nt((x_q, x_scale), (w_q, w_scale), out)`` with x_q
E4M3 [M, K], x_scale float32 per 1x128 group in DeepGEMM's MN-major TMA-aligned layout (element
(m, g) at m + g * ld, ld = M rounded up to 4), w_q E4M3 [N, K], w_scale float32 per 128x128 block
[N/128, K/128], out bf16 [M, N]. mxq runs ``torch.ops.mxq.fp8_gemm_nt`` (its dispatch's tactic,
the scales read in place); DeepGEMM runs ``deep_gemm.fp8_gemm_nt``. The inputs are quantized once
by this script (activations per 1x128 group, weights per 128x128 block, scale = amax / 448), so
neither side's timing includes quantization.

DeepGEMM is not a dependency of mxq: ``--deepgemm DIR`` names a folder from which ``import
deep_gemm`` works (e.g. a DeepGEMM source tree's ``build/lib.*`` after ``python3 setup.py
build``); without it, or when the import fails, only mxq is timed and the JSON says why.

Method (CUDA): input sets rotated across replays so that they exceed twice the L2 (as `mxq bench
linear`); one CUDA graph per set and side; the sides replayed alternately (clock drift hits both);
CUDA events around each replay; median of ``--repeats`` per side. Each point also records the
normalized L2 difference between the two outputs on the first set.

``--check`` runs mxq's op on a few small problems (the CPU by default) against this script's
plain-torch emulation of the same quantized product, without timing; exit 1 above the tolerance.
Exit status: 0 done, 1 a check failed, 2 bad arguments, no CUDA for a timed run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_graph_timing import capture, median_us  # noqa: E402

DEEPSEEK_V3_SHAPES = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
                      (7168, 2048)]
DEFAULT_M = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
BLOCK = 128
FP8_MAX = 448.0
WORKING_SET_BYTES = 120 << 20  # > 2x the H200's 50 MB L2, as `mxq bench linear`
MAX_SETS = 16
# Normalized L2 difference allowed between mxq's output and the fp32 emulation (DESIGN.md's
# bound for bf16 outputs), and between mxq and DeepGEMM (both bf16 outputs of the same product).
TOLERANCE = 4e-3


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16/fp32 [M, K] -> E4M3 [M, K] and float32 scales in the MN-major layout [M, G] with
    strides (1, round_up(M, 4)): one scale per 1x128 group, max(amax, 1e-4) / 448."""
    m, k = x.shape
    groups = -(-k // BLOCK)
    padded = torch.nn.functional.pad(x.float(), (0, groups * BLOCK - k)).view(m, groups, BLOCK)
    scale = padded.abs().amax(-1).clamp_min(1e-4) / FP8_MAX  # [M, G]
    q = (padded / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).view(m, -1)[:, :k]
    ld = -(-m // 4) * 4
    storage = torch.zeros(groups, ld, dtype=torch.float32, device=x.device)
    storage[:, :m] = scale.t()
    return q.to(torch.float8_e4m3fn).contiguous(), storage.t()[:m]


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> E4M3 [N, K] and float32 [ceil(N/128), ceil(K/128)] block scales."""
    n, k = w.shape
    rn, rk = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.nn.functional.pad(w.float(), (0, rk * BLOCK - k, 0, rn * BLOCK - n))
    blocks = padded.view(rn, BLOCK, rk, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-4) / FP8_MAX  # [rn, rk]
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(rn * BLOCK, -1)
    return q[:n, :k].to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def emulate(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor,
            w_scale: torch.Tensor) -> torch.Tensor:
    """The quantized product in float64 on the CPU: (x_q * x_scale) (w_q * w_scale)^T."""
    k = x_q.shape[1]
    xs = x_scale.double().cpu().repeat_interleave(BLOCK, dim=1)[:, :k]
    ws = w_scale.double().cpu().repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
    ws = ws[:w_q.shape[0], :k]
    return (x_q.double().cpu() * xs) @ (w_q.double().cpu() * ws).t()


def normalized_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def make_set(m: int, n: int, k: int, seed: int, device: torch.device) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    x_q, x_scale = quantize_rows(torch.randn(m, k, generator=g).to(device))
    w_q, w_scale = quantize_blocks(torch.randn(n, k, generator=g).to(device))
    out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    return {"x_q": x_q, "x_scale": x_scale, "w_q": w_q, "w_scale": w_scale, "out": out}


def run_mxq(s: dict) -> None:
    torch.ops.mxq.fp8_gemm_nt(s["x_q"], s["x_scale"], s["w_q"], s["w_scale"], s["out"])


def load_deepgemm(path: Optional[str]):
    """(module, None) or (None, why not)."""
    if path is not None:
        sys.path.insert(0, path)
    try:
        return importlib.import_module("deep_gemm"), None
    except Exception as error:  # an import of a native extension can fail in many ways
        return None, f"import deep_gemm failed: {type(error).__name__}: {error}"


def check(device: torch.device) -> list[dict]:
    """mxq's op against the emulation on small problems (ragged M, N, K tails included)."""
    importlib.import_module("mxq.torch_ops")  # registers torch.ops.mxq.*
    rows = []
    for m, n, k in [(1, 256, 512), (5, 384, 640), (64, 256, 256), (130, 128, 384)]:
        s = make_set(m, n, k, seed=7 + m, device=device)
        run_mxq(s)
        want = emulate(s["x_q"], s["x_scale"], s["w_q"], s["w_scale"])
        rows.append({"m": m, "n": n, "k": k,
                     "normalized_difference": normalized_difference(s["out"], want)})
    return rows


def time_point(m: int, n: int, k: int, repeats: int, deep_gemm) -> dict:
    device = torch.device("cuda")
    set_bytes = n * k + m * k + 2 * m * n
    sets = max(1, min(MAX_SETS, -(-WORKING_SET_BYTES // set_bytes)))
    inputs = [make_set(m, n, k, seed=1000 * m + s, device=device) for s in range(sets)]
    sides = {"mxq": [capture(lambda s=s: run_mxq(s)) for s in inputs]}
    point = {"m": m, "n": n, "k": k, "input_sets": sets}
    if deep_gemm is not None:
        outs = [torch.empty_like(s["out"]) for s in inputs]
        try:
            sides["deepgemm"] = [
                capture(lambda s=s, o=o: deep_gemm.fp8_gemm_nt((s["x_q"], s["x_scale"]),
                                                             (s["w_q"], s["w_scale"]), o))
                for s, o in zip(inputs, outs)]
        except Exception as error:
            point["deepgemm_error"] = f"{type(error).__name__}: {error}"
    times = median_us(sides, repeats)
    flops = 2.0 * m * n * k
    weight_bytes = n * k + 4 * (-(-n // BLOCK)) * (-(-k // BLOCK))
    for name, us in times.items():
        point[f"{name}_us"] = us
        point[f"{name}_tflops"] = flops / (us * 1e-6) / 1e12
        point[f"{name}_weight_tbps"] = weight_bytes / (us * 1e-6) / 1e12
    if "deepgemm" in sides:
        point["mxq_speedup_vs_deepgemm"] = point["deepgemm_us"] / point["mxq_us"]
        point["normalized_difference"] = normalized_difference(inputs[0]["out"], outs[0])
    return point


def parse_shape(text: str) -> tuple[int, int]:
    try:
        n, k = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N,K with two positive integers, found "
                                         f"{text!r}") from None
    if n < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"expected N,K with two positive integers, found "
                                         f"{text!r}")
    return n, k


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepgemm", metavar="DIR",
                        help="a folder from which `import deep_gemm` works")
    parser.add_argument("--shape", type=parse_shape, action="append", metavar="N,K",
                        help="an (N, K) pair (repeat for several; default DeepSeek-V3's six)")
    parser.add_argument("--m", default=None,
                        help="comma-separated token counts (default 1,8,...,4096)")
    parser.add_argument("--repeats", type=int, default=30, help="timed replays per side (>= 20)")
    parser.add_argument("--device", default=None, help="cuda (default) or cpu (only --check)")
    parser.add_argument("--check", action="store_true",
                        help="check mxq's op against the emulation instead of timing")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        ms = [int(v) for v in args.m.split(",")] if args.m else DEFAULT_M
    except ValueError:
        parser.error(f"--m: expected comma-separated integers, found {args.m!r}")
    if any(m < 1 for m in ms):
        parser.error(f"--m: every count must be >= 1, found {args.m!r}")
    device = torch.device(args.device or ("cpu" if args.check else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("linear_deepgemm.py: no CUDA device is visible (use --check)", file=sys.stderr)
        return 2
    if args.check:
        rows = check(device)
        worst = max(r["normalized_difference"] for r in rows)
        if args.json:
            print(json.dumps({"check": rows, "tolerance": TOLERANCE}))
        else:
            for r in rows:
                print(f"M={r['m']} N={r['n']} K={r['k']}: normalized difference "
                      f"{r['normalized_difference']:.2e}")
        return 0 if worst <= TOLERANCE else 1
    if device.type != "cuda":
        parser.error("timing needs --device cuda (the CPU is for --check)")
    if args.repeats < 20:
        parser.error(f"--repeats: expected at least 20, found {args.repeats}")
    importlib.import_module("mxq.torch_ops")  # registers torch.ops.mxq.*
    deep_gemm, why = load_deepgemm(args.deepgemm)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "repeats": args.repeats,
              "deepgemm": getattr(deep_gemm, "__version__", None) if deep_gemm else None,
              "points": []}
    if why:
        result["deepgemm_note"] = why
        print(f"linear_deepgemm.py: {why}; timing mxq alone", file=sys.stderr)
    for n, k in args.shape or DEEPSEEK_V3_SHAPES:
        for m in ms:
            print(f"linear_deepgemm.py: N={n} K={k} M={m} ...", file=sys.stderr, flush=True)
            result["points"].append(time_point(m, n, k, args.repeats, deep_gemm))
    if deep_gemm is not None:
        per_m = {}
        for p in result["points"]:
            if "mxq_speedup_vs_deepgemm" in p:
                per_m.setdefault(p["m"], []).append(p["mxq_speedup_vs_deepgemm"])
        result["summary"] = [{"m": m, "shapes": len(v),
                              "geomean_mxq_vs_deepgemm": statistics.geometric_mean(v),
                              "min_mxq_vs_deepgemm": min(v)} for m, v in sorted(per_m.items())]
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['gpu']}, torch {result['torch']}, DeepGEMM {result['deepgemm']}")
    print(f"{'N':>6} {'K':>6} {'M':>5} {'mxq us':>9} {'DeepGEMM us':>12} {'mxq/DG speed':>13}"
          f" {'diff':>9}")
    for p in result["points"]:
        dg = p.get("deepgemm_us")
        print(f"{p['n']:6d} {p['k']:6d} {p['m']:5d} {p['mxq_us']:9.1f} "
              f"{dg if dg is not None else float('nan'):12.1f} "
              f"{p.get('mxq_speedup_vs_deepgemm', float('nan')):12.2f}x "
              f"{p.get('normalized_difference', float('nan')):9.1e}")
    for s in result.get("summary", []):
        print(f"M={s['m']}: mxq vs DeepGEMM over {s['shapes']} shapes: geomean "
              f"{s['geomean_mxq_vs_deepgemm']:.2f}x, min {s['min_mxq_vs_deepgemm']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
