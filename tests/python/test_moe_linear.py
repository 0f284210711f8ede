"""mxq.MoELayer and mxq.BlockFp8Linear: bitwise equal to the C++ CLI on the same files."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import mxq
from mxq import formats

from conftest import run_cli


def tensors_of(checkpoint: Path) -> dict:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def tokens(n: int, h: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, h)).astype(np.float32)


@pytest.mark.parametrize("layer,tp,ep,align", [(0, 1, 1, 128), (1, 2, 2, 128), (0, 3, 1, 0),
                                               (1, 1, 3, 64)])
def test_moe_forward_equals_cli(moe_checkpoint, tmp_path, layer, tp, ep, align):
    x = tokens(9, 128, seed=layer * 10 + tp)
    x[4, 7] = np.nan  # a non-finite token gets NaN, others are unaffected
    np.save(tmp_path / "x.npy", x)
    run_cli("moe", "--checkpoint", str(moe_checkpoint), "--layer", str(layer), "--input",
            str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"), "--tp", str(tp),
            "--ep", str(ep), "--align", str(align))
    cli = np.load(tmp_path / "y.npy")
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=layer, tp_size=tp, ep_size=ep,
                                       align=align)
    y = moe.forward(x)
    assert y.dtype == np.float32 and y.shape == (9, 128)
    assert np.array_equal(y.view(np.uint32), cli.view(np.uint32))
    assert np.isnan(y[4]).all() and not np.isnan(np.delete(y, 4, 0)).any()
    # bf16 input gives the same result as f32 input (rounded to bf16 on entry)
    assert np.array_equal(moe.forward(x.astype(ml_dtypes.bfloat16)).view(np.uint32),
                          y.view(np.uint32))


def test_moe_w4a8_equals_cli_and_differs_from_w4a16(moe_checkpoint, tmp_path):
    x = tokens(6, 128, seed=5)
    np.save(tmp_path / "x.npy", x)
    run_cli("moe", "--checkpoint", str(moe_checkpoint), "--input", str(tmp_path / "x.npy"),
            "--output", str(tmp_path / "q.npy"), "--activation-quant", "fp8_g128")
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, activation_quant="fp8_g128")
    assert moe.config["activation_quant"] == "fp8_g128"
    y = moe.forward(x)
    assert np.array_equal(y.view(np.uint32), np.load(tmp_path / "q.npy").view(np.uint32))
    plain = mxq.MoELayer.from_checkpoint(moe_checkpoint)
    assert plain.config["activation_quant"] == "bf16"
    assert not np.array_equal(plain.forward(x), y)
    with pytest.raises(mxq.InvalidArgumentError, match="activation_quant"):
        mxq.MoELayer.from_checkpoint(moe_checkpoint, activation_quant="fp8")


def test_moe_properties_and_ranks(moe_checkpoint):
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=2, ep_size=3, align=128)
    c = moe.config
    assert (c["num_experts"], c["hidden_size"], c["intermediate_size"], c["top_k"]) == (8, 128, 96, 2)
    assert moe.num_ranks == 6 and moe.prepared
    # One owner for I_rank: the layer, every rank and the padding summary agree.
    assert moe.intermediate_size_per_partition_after_pad == 128
    assert moe.intermediate_size_per_partition == 64  # the TP width, unpadded
    assert moe.padding_summary["before"] == 64 and moe.padding_summary["after"] == 128
    assert abs(moe.padding_summary["wasted_fraction"] - (1 - 96 / (2 * 128))) < 1e-12
    r = moe.rank(tp_rank=1, ep_rank=2)
    assert r.rank_id == 5 and r.info["expert_begin"] == 6 and r.info["experts_local"] == 2
    assert r.info["intermediate_begin"] == 64 and r.info["intermediate_valid"] == 32
    assert r.param("w13").shape == (2, 2 * 128, 64) and r.param("w2").shape == (2, 128, 64)
    moe.restore()
    assert moe.intermediate_size_per_partition_after_pad == 64 and not moe.prepared
    assert moe.intermediate_size_per_partition == 64
    assert r.param("w13").shape == (2, 2 * 64, 64)
    with pytest.raises(AttributeError):
        moe.intermediate_size_per_partition_after_pad = 3
    with pytest.raises(ValueError, match="tp_rank"):
        moe.rank(tp_rank=2)
    with pytest.raises(NotImplementedError, match="tp_rank"):
        mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_rank=0, tp_size=2)
    for sizes in ({"tp_size": 0}, {"tp_size": -1}, {"ep_size": 0}):
        name = next(iter(sizes))
        with pytest.raises(ValueError, match=f"{name}: expected >= 1"):
            mxq.MoELayer.from_checkpoint(moe_checkpoint, align=None, **sizes)


def test_moe_sizes_are_refused_by_name_before_anything_is_allocated(moe_checkpoint):
    # I = 96 is 3 blocks of 32 channels and E = 8: the layer holds at most 3 TP and 8 EP ranks.
    with pytest.raises(ValueError, match=r"tp_size: expected at most 3 \(the layer's I = 96"):
        mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=4, align=None)
    with pytest.raises(ValueError, match=r"ep_size: expected at most 8 \(the layer's E"):
        mxq.MoELayer.from_checkpoint(moe_checkpoint, ep_size=9, align=None)
    # Sizes beyond what this machine can hold: refused up front (an allocation would fail, or
    # succeed on paper and be ended by the OOM killer later).
    fits = r"expected a value whose memory fits in the .* of host memory available"
    with pytest.raises(ValueError, match=r"^align: " + fits):
        mxq.MoELayer.from_checkpoint(moe_checkpoint, align=2**40)
    with pytest.raises(ValueError, match=r"^intermediate_per_rank: " + fits):
        mxq.MoELayer.from_checkpoint(moe_checkpoint, intermediate_per_rank=2**40, align=None)
    layer = mxq.MoELayer.from_checkpoint(moe_checkpoint, align=None)
    with pytest.raises(ValueError, match=r"^alignment: " + fits):
        layer.prepare(2**40)
    assert not layer.prepared and layer.intermediate_size_per_partition == 96


def test_moe_update_session_context_manager(moe_checkpoint):
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=0, tp_size=2, align=128)
    x = tokens(5, 128, seed=3)
    before = moe.forward(x)
    address = moe.rank(1, 0).param_address("w13_scale")
    tensors = {k: v for k, v in tensors_of(moe_checkpoint).items() if ".layers.0." in k}
    # Load layer 1's weights into layer 0 (renamed): the output must change ...
    other = {k.replace(".layers.1.", ".layers.0."): v
             for k, v in tensors_of(moe_checkpoint).items() if ".layers.1." in k}
    with moe.update() as u:
        for name, value in other.items():
            u.load(name, value)
    assert moe.prepared and moe.intermediate_size_per_partition_after_pad == 128
    assert moe.rank(1, 0).param_address("w13_scale") == address  # storage reused
    assert not np.array_equal(moe.forward(x), before, equal_nan=True)
    # ... and loading the original back restores it bit for bit.
    with moe.update() as u:
        for name, value in tensors.items():
            u.load(name, value)
    assert np.array_equal(moe.forward(x).view(np.uint32), before.view(np.uint32))


def test_moe_forward_racing_updates_is_never_torn(moe_checkpoint):
    """Forwards in one thread, updates (and re-layouts) of the same weights in another: every
    forward gives the reference bits or raises that an update is open, never a mix."""
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=0, tp_size=2, align=128)
    x = tokens(3, 128, seed=5)
    ref = moe.forward(x)
    same = {k: v for k, v in tensors_of(moe_checkpoint).items() if ".layers.0." in k}
    done = threading.Event()
    outcomes = {"equal": 0, "refused": 0, "torn": 0}

    def forwards():
        while not done.is_set() or outcomes["equal"] == 0:  # one after the updates, at least
            try:
                y = moe.forward(x)
            except ValueError as error:
                assert "during a weight update" in str(error)
                outcomes["refused"] += 1
                continue
            outcomes["equal" if np.array_equal(y, ref, equal_nan=True) else "torn"] += 1

    reader = threading.Thread(target=forwards)
    reader.start()
    try:
        for i in range(40):
            if i % 2:
                moe.restore()
                moe.prepare(128)
            else:
                with moe.update() as u:
                    for name, value in same.items():
                        u.load(name, value)
    finally:
        done.set()
        reader.join()
    assert outcomes["torn"] == 0, outcomes
    assert outcomes["equal"] > 0, outcomes


def test_a_device_copy_overtaken_by_a_weight_change_is_not_kept(moe_checkpoint, monkeypatch):
    """An upload that a change of the weights (here a restore from "another thread" while the
    copy is made) overtook serves the call that made it but is not kept: the next CUDA forward
    uploads the new weights instead of serving the old ones until the process ends."""
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=0, tp_size=2, align=128)
    uploads = []

    class FakeCopy:  # what MoeGpuLayer.upload returns, as far as the bookkeeping looks
        max_tokens = 1024

        def tune_problems(self):
            return []

    def upload(core, max_tokens, device, gemm, tuner):
        uploads.append(max_tokens)
        if len(uploads) == 1:
            moe.restore()
        return FakeCopy()

    monkeypatch.setattr(mxq.moe._mxq, "MoeGpuLayer", SimpleNamespace(upload=upload),
                        raising=False)
    first = moe._device_copy(0, 1)
    assert isinstance(first, FakeCopy) and 0 not in moe._device_copies
    second = moe._device_copy(0, 1)
    assert len(uploads) == 2 and moe._device_copies[0][0] is second
    assert moe._device_copy(0, 1) is second and len(uploads) == 2  # kept from then on


def test_moe_update_rejects_bad_tensor_and_still_ends(moe_checkpoint):
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=0)
    x = tokens(3, 128, seed=4)
    before = moe.forward(x)
    name = "model.layers.0.mlp.experts.down_proj_scales"
    good = tensors_of(moe_checkpoint)[name]
    with pytest.raises(ValueError, match="down_proj_scales"):
        with moe.update() as u:
            u.load(name, good[:, :, :1].copy())  # wrong shape
    with pytest.raises(TypeError):
        with moe.update() as u:
            u.load(name, good.astype(np.float32))  # wrong dtype
    assert moe.prepared and np.array_equal(moe.forward(x).view(np.uint32), before.view(np.uint32))


def test_moe_forward_input_errors(moe_checkpoint):
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint)
    with pytest.raises(TypeError, match="^x: "):
        moe.forward(np.ones((2, 128), np.float64))
    with pytest.raises(ValueError, match="^x: expected a C-contiguous"):
        moe.forward(np.ones((128, 2), np.float32).T)
    with pytest.raises(ValueError, match="x"):
        moe.forward(np.ones((2, 64), np.float32))


def test_moe_precomputed_routing_matches_router(moe_checkpoint):
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint)
    x = tokens(6, 128, seed=5)
    details = moe.forward_details(x)
    again = moe.forward(x, details.expert_ids, details.expert_weights)
    assert np.array_equal(again.view(np.uint32), details.output.view(np.uint32))
    assert details.expert_ids.dtype == np.int32 and details.expert_ids.shape == (6, 2)


def test_moe_layers_alive_at_exit_are_released(moe_checkpoint):
    # A layer that outlives the program in a reference nothing drops (as torch 2.11's
    # torch.compile cache holds a compiled module and its layers): its C++ state is freed at
    # exit, so nanobind reports no leaked instance, and a use after that says why it fails.
    script = f"""
import ctypes, mxq
import mxq.moe
layer = mxq.MoELayer.from_checkpoint({str(moe_checkpoint)!r})
held = mxq.MoELayer.from_checkpoint({str(moe_checkpoint)!r})
ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))
if __import__("sys").argv[-1] == "use-after-release":
    mxq.moe._release_layers_at_exit()
    try:
        layer.config
    except RuntimeError as error:
        print(error)
"""
    for args in ([], ["use-after-release"]):
        result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr
        assert "leaked" not in result.stderr, result.stderr
    assert result.stdout.startswith("mxq.MoELayer: released at interpreter exit"), result.stdout


# --- block-FP8 linear ---------------------------------------------------------------------

def test_linear_loads_cli_quantized_file(tmp_path):
    w = np.random.default_rng(12).standard_normal((192, 320)).astype(np.float32)
    np.save(tmp_path / "proj.npy", w)
    run_cli("quantize", "fp8-block", str(tmp_path / "proj.npy"), str(tmp_path / "proj.safetensors"),
            "--block", "64x128", "--name", "proj")
    lin = mxq.BlockFp8Linear.from_checkpoint(tmp_path / "proj.safetensors", "proj")
    assert lin.block == (64, 128) and (lin.n, lin.k) == (192, 320)
    q, scale = formats.quantize_fp8_block(w, [64, 128])
    assert np.array_equal(lin.q.view(np.uint8), q.view(np.uint8))
    assert np.array_equal(lin.scale, scale)
    assert not lin.q.flags.writeable


@pytest.mark.parametrize("block", [(128, 128), (64, 32)])
def test_linear_matches_exact_float64_oracle(block):
    """With power-of-two (UE8M0) scales every product is exact in float64 and so is the sum of
    these K terms, whatever the order: the reference's fp64 result is known exactly."""
    rng = np.random.default_rng(13)
    w = rng.standard_normal((96, 256)).astype(np.float32)
    x = rng.standard_normal((5, 256)).astype(np.float32).astype(ml_dtypes.bfloat16)
    lin = mxq.BlockFp8Linear.quantize(w, block, scale_mode="ue8m0")
    y = lin.forward(x, tactic="cpu.reference", activation_scales="ue8m0", out_dtype="f32")
    wq = formats.dequantize_fp8_block(lin.q, np.ascontiguousarray(lin.scale), block).astype(np.float64)
    xq, xs = formats.quantize_fp8_groups(x, block[1], "ue8m0")
    xd = formats.dequantize_fp8_block(xq, xs, (1, block[1])).astype(np.float64)
    expect = (xd @ wq.T).astype(np.float32)
    assert y.dtype == np.float32 and np.array_equal(y.view(np.uint32), expect.view(np.uint32))
    # bf16 output = the same value rounded once
    yb = lin.forward(x, tactic="cpu.reference", activation_scales="ue8m0")
    assert yb.dtype == ml_dtypes.bfloat16
    assert np.array_equal(yb.view(np.uint16), (xd @ wq.T).astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16))


def test_linear_from_arrays_and_packed_scales_agree():
    rng = np.random.default_rng(14)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    q, s = formats.quantize_fp8_block(w, (128, 128), "ue8m0")
    a = mxq.BlockFp8Linear.from_arrays(q, s, [128, 128])
    b = a.with_packed_ue8m0_scales()
    assert a.scale_layout == "fp32" and b.scale_layout == "packed-ue8m0"
    x = rng.standard_normal((3, 256)).astype(ml_dtypes.bfloat16)
    assert np.array_equal(a.forward(x).view(np.uint16), b.forward(x).view(np.uint16))


def test_linear_explain_and_errors():
    lin = mxq.BlockFp8Linear.quantize(np.ones((64, 128), np.float32), (64, 64))
    e = lin.explain(16)
    assert e["chosen"] is not None and "M=16 N=64 K=128 block=64x64" in e["problem"]
    assert all(name != e["chosen"] for name, _ in e["rejected"])
    assert e["chosen"] in e["text"]
    with pytest.raises(TypeError, match="^x: expected bf16"):
        lin.forward(np.ones((2, 128), np.float32))
    with pytest.raises(ValueError, match="x"):
        lin.forward(np.ones((2, 64), ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match="tactic|no-such"):
        lin.forward(np.ones((2, 128), ml_dtypes.bfloat16), tactic="no-such-tactic")


def test_python_m_mxq_runs_the_cli():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "mxq", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"mxq {mxq.__version__}"
    bad = subprocess.run([sys.executable, "-m", "mxq", "moe", "--checkpoint", "/nonexistent",
                          "--input", "a.npy", "--output", "b.npy"], capture_output=True, text=True)
    assert bad.returncode != 0 and "mxq: error:" in bad.stderr
