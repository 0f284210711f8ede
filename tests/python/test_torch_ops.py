"""torch.ops.mxq.* on the CPU: results bitwise equal to mxq's Python API and to the C++ CLI on the
same files, opcheck on every op, torch.compile(fullgraph=True), autograd (the linear's
straight-through gradient; a clear error from the other ops' backward), no copies, clear errors."""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import types

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxq  # noqa: E402
import mxq.torch_ops as ops  # noqa: E402  (registers torch.ops.mxq.*)
from mxq import _mxq, formats  # noqa: E402

from conftest import run_cli  # noqa: E402

pytestmark = pytest.mark.torch

E4M3 = torch.float8_e4m3fn


def bits(t: "torch.Tensor") -> np.ndarray:
    """The raw bits of a tensor (NaN-safe bitwise comparison)."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]).numpy()


def bf16_numpy(t: "torch.Tensor") -> np.ndarray:
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


# --- format ops ---------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_mxfp4_ops_equal_formats(rule):
    x = torch.randn(3, 8, 64) * 10
    x[0, 0, 5] = float("inf")
    blocks, scales = torch.ops.mxq.quantize_mxfp4(x, rule)
    want_blocks, want_scales = formats.quantize_mxfp4(x.numpy(), rule)
    assert blocks.dtype == torch.uint8 and blocks.shape == (3, 8, 2, 16)
    assert scales.dtype == torch.float8_e8m0fnu and scales.shape == (3, 8, 2)
    assert np.array_equal(blocks.numpy(), want_blocks)
    assert np.array_equal(bits(scales), want_scales.view(np.uint8))
    y = torch.ops.mxq.dequantize_mxfp4(blocks, scales)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert np.array_equal(bits(y), formats.dequantize_mxfp4(want_blocks, want_scales).view(np.int32))
    # uint8 scale codes are the same bytes
    assert np.array_equal(bits(torch.ops.mxq.dequantize_mxfp4(blocks, scales.view(torch.uint8))),
                          bits(y))
    xb = x.bfloat16()
    assert np.array_equal(torch.ops.mxq.quantize_mxfp4(xb, rule)[0].numpy(),
                          formats.quantize_mxfp4(bf16_numpy(xb), rule)[0])


def test_e4m3_ops_equal_formats_and_torch():
    x = torch.cat([torch.randn(1000) * 100, torch.tensor([448.0, 464.0, 500.0, -1e9, 0.0, -0.0])])
    codes = torch.ops.mxq.e4m3_encode(x, True)
    assert codes.dtype == E4M3
    assert np.array_equal(bits(codes), formats.e4m3_encode(x.numpy()).view(np.uint8))
    assert np.array_equal(bits(codes), bits(x.clamp(-448, 448).to(E4M3)))  # torch's RNE cast
    nosat = torch.ops.mxq.e4m3_encode(x, False)
    assert torch.isnan(torch.ops.mxq.e4m3_decode(nosat)[-4]).item()  # -1e9 overflows to NaN
    back = torch.ops.mxq.e4m3_decode(codes)
    assert back.dtype == torch.float32 and torch.equal(back, codes.float())
    assert torch.equal(torch.ops.mxq.e4m3_decode(codes.view(torch.uint8)), back)


@pytest.mark.parametrize("block,mode", [((128, 128), "fp32"), ((64, 32), "ue8m0"), ((1, 128), "fp32")])
def test_fp8_block_ops_equal_formats(block, mode):
    w = torch.randn(130, 200) * 3
    q, scale = torch.ops.mxq.quantize_fp8_block(w, *block, mode)
    want_q, want_scale = formats.quantize_fp8_block(w.numpy(), block, mode)
    assert q.dtype == E4M3 and scale.dtype == torch.float32
    assert scale.shape == (-(-130 // block[0]), -(-200 // block[1]))
    assert np.array_equal(bits(q), want_q.view(np.uint8)) and np.array_equal(scale.numpy(), want_scale)
    back = torch.ops.mxq.dequantize_fp8_block(q, scale, *block)
    assert np.array_equal(back.numpy(), formats.dequantize_fp8_block(want_q, want_scale, block))


def test_quantize_fp8_groups_equals_formats():
    x = torch.randn(5, 300).bfloat16()
    q, scale = torch.ops.mxq.quantize_fp8_groups(x, 128, "ue8m0")
    want_q, want_scale = formats.quantize_fp8_groups(bf16_numpy(x), 128, "ue8m0")
    assert q.shape == (5, 300) and scale.shape == (5, 3)
    assert np.array_equal(bits(q), want_q.view(np.uint8)) and np.array_equal(scale.numpy(), want_scale)


# --- block-FP8 linear ---------------------------------------------------------------------

def quantized_weight(n, k, block, seed=0, mode="fp32"):
    w = torch.from_numpy(np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32))
    return torch.ops.mxq.quantize_fp8_block(w, *block, mode)


def test_block_fp8_linear_equals_python_api_with_bias_and_leading_dims():
    q, s = quantized_weight(192, 256, (64, 128))
    bias = torch.randn(192).bfloat16()
    x = torch.randn(2, 3, 256).bfloat16()
    y = torch.ops.mxq.block_fp8_linear(x, q, s, 64, 128, bias)
    assert y.shape == (2, 3, 192) and y.dtype == torch.bfloat16
    lin = mxq.BlockFp8Linear.from_arrays(bits(q), s.numpy(), (64, 128), bias=bf16_numpy(bias))
    want = lin.forward(bf16_numpy(x.reshape(6, 256)))
    assert np.array_equal(bits(y.reshape(6, 192)), want.view(np.int16))
    y32 = torch.ops.mxq.block_fp8_linear(x, q, s, 64, 128, bias, "ue8m0", torch.float32,
                                         "cpu.reference")
    want32 = lin.forward(bf16_numpy(x.reshape(6, 256)), tactic="cpu.reference",
                         activation_scales="ue8m0", out_dtype="f32")
    assert y32.dtype == torch.float32 and np.array_equal(bits(y32.reshape(6, 192)), want32.view(np.int32))
    # packed UE8M0 weight scales: same result as the fp32 power-of-two scales they pack
    qp, sp = quantized_weight(128, 256, (128, 128), mode="ue8m0")
    packed = torch.from_numpy(formats.pack_ue8m0(sp.numpy()))
    xb = torch.randn(4, 256).bfloat16()
    assert np.array_equal(bits(torch.ops.mxq.block_fp8_linear(xb, qp, packed, 128, 128)),
                          bits(torch.ops.mxq.block_fp8_linear(xb, qp, sp, 128, 128)))


def mn_major(scales: "torch.Tensor", pad: int = 4) -> "torch.Tensor":
    """float32 [M, G] scales in DeepGEMM's MN-major layout: element (m, g) at m + g * ld, ld the
    smallest multiple of 4 >= M plus `pad` (a view of a [G, ld] tensor)."""
    m, groups = scales.shape
    ld = (m + 3) // 4 * 4 + pad
    storage = torch.zeros(groups, ld, dtype=torch.float32, device=scales.device)
    storage[:, :m] = scales.t()
    return storage.t()[:m]


def packed_scales(scales: "torch.Tensor") -> "torch.Tensor":
    """Power-of-two float32 scales [M, G] packed as UE8M0 int32 [ceil(G/4), round_up(M, 4)]."""
    return torch.from_numpy(formats.pack_ue8m0(scales.cpu().numpy())).to(scales.device)


def test_out_and_pre_quantized_ops_write_the_bits_of_block_fp8_linear():
    q, s = quantized_weight(192, 256, (64, 128), seed=3)
    bias = torch.randn(192)
    x = torch.randn(2, 3, 256).bfloat16()
    for out_dtype in (torch.bfloat16, torch.float32):
        want = torch.ops.mxq.block_fp8_linear(x, q, s, 64, 128, bias, "fp32", out_dtype)
        out = torch.full((2, 3, 192), float("nan"), dtype=out_dtype)
        assert torch.ops.mxq.block_fp8_linear_out(x, q, s, out, 64, 128, bias) is None
        assert np.array_equal(bits(out), bits(want))
        module = ops.BlockFp8Linear(q, s, (64, 128), bias, out_dtype=out_dtype)
        given = torch.full((2, 3, 192), float("nan"), dtype=out_dtype)
        assert module(x, out=given) is given and np.array_equal(bits(given), bits(want))
        # DeepGEMM's call: the same quantized activations in each scale layout.
        xq, xs = torch.ops.mxq.quantize_fp8_groups(x.reshape(6, 256), 128, "fp32")
        # Any strides: row-major, MN-major (read in place), every other column (copied).
        wide = torch.zeros(6, 2 * xs.shape[1])
        wide[:, ::2] = xs
        for scales in (xs, mn_major(xs), mn_major(xs, pad=0)[:5], wide[:, ::2]):
            m = scales.shape[0]
            out = torch.full((m, 192), float("nan"), dtype=out_dtype)
            assert torch.ops.mxq.fp8_gemm_nt(xq[:m], scales, q, s, out, 64, 128, bias) is None
            assert np.array_equal(bits(out), bits(want.reshape(6, 192)[:m])), scales.stride()
    # Packed UE8M0 activation scales equal the power-of-two float32 ones they pack.
    want = torch.ops.mxq.block_fp8_linear(x, q, s, 64, 128, None, "ue8m0")
    xq, xs = torch.ops.mxq.quantize_fp8_groups(x.reshape(6, 256), 128, "ue8m0")
    out = torch.empty(6, 192).bfloat16()
    torch.ops.mxq.fp8_gemm_nt(xq, packed_scales(xs), q, s, out, 64, 128)
    assert np.array_equal(bits(out), bits(want.reshape(6, 192)))


def test_no_rows_leave_out_as_it_was():
    q, s = quantized_weight(64, 128, (64, 128))
    out = torch.empty(0, 64)
    torch.ops.mxq.block_fp8_linear_out(torch.empty(0, 128).bfloat16(), q, s, out, 64, 128)
    torch.ops.mxq.fp8_gemm_nt(torch.empty(0, 128, dtype=torch.uint8), torch.empty(0, 1), q, s,
                              out, 64, 128)
    assert torch.ops.mxq.block_fp8_linear(torch.empty(4, 0, 128).bfloat16(), q, s, 64,
                                          128).shape == (4, 0, 64)


def test_out_and_scale_errors_name_the_argument():
    q, s = quantized_weight(128, 256, (128, 128))
    x = torch.randn(4, 256).bfloat16()
    xq, xs = torch.ops.mxq.quantize_fp8_groups(x, 128, "fp32")
    with pytest.raises(TypeError, match=r"^out: expected bfloat16 or float32, found float16"):
        torch.ops.mxq.block_fp8_linear_out(x, q, s, torch.empty(4, 128, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"^out: expected shape \[4, 128\], found \[4, 127\]"):
        torch.ops.mxq.block_fp8_linear_out(x, q, s, torch.empty(4, 127))
    with pytest.raises(ValueError, match=r"^out: expected a contiguous tensor"):
        torch.ops.mxq.fp8_gemm_nt(xq, xs, q, s, torch.empty(128, 4).t())
    with pytest.raises(ValueError, match=r"^out: expected a tensor on cpu \(where x is\), found one on meta"):
        torch.ops.mxq.fp8_gemm_nt(xq, xs, q, s, torch.empty(4, 128, device="meta"))
    with pytest.raises(TypeError, match=r"^out_dtype: expected torch.bfloat16 or torch.float32, found torch.float16"):
        torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128, None, "fp32", torch.float16)
    with pytest.raises(ValueError, match=r"^x_scale: expected float32 \[4, 2\] \(one per 1x128 group of x_q\), found \[4, 3\]"):
        torch.ops.mxq.fp8_gemm_nt(xq, torch.ones(4, 3), q, s, torch.empty(4, 128))
    with pytest.raises(ValueError, match=r"^x_scale: expected packed UE8M0 int32 \[1, 4\] for 4x2 scales"):
        torch.ops.mxq.fp8_gemm_nt(xq, torch.zeros(2, 4, dtype=torch.int32), q, s, torch.empty(4, 128))
    with pytest.raises(ValueError, match=r"^x_q: expected K = 256 columns"):
        torch.ops.mxq.fp8_gemm_nt(xq[:, :128].contiguous(), xs, q, s, torch.empty(4, 128))
    with pytest.raises(TypeError, match=r"^out_dtype: expected"):
        ops.BlockFp8Linear(q, s, out_dtype="bf16")


def test_the_weight_is_wrapped_once_and_held_weakly(monkeypatch):
    """The op wraps a weight tensor for mxq on first use and reuses that while the tensors
    describe the same memory; the wrapper keeps no tensor alive."""
    linear_ops = sys.modules[ops.BlockFp8Linear.__module__]  # the ops' module, whatever its name

    q, s = quantized_weight(128, 256, (128, 128), seed=4)
    q2, s2 = quantized_weight(128, 256, (128, 128), seed=5)
    x = torch.randn(3, 256).bfloat16()
    want = torch.ops.mxq.block_fp8_linear(x, q, s)
    want2 = torch.ops.mxq.block_fp8_linear(x, q2, s2)
    want_mixed = torch.ops.mxq.block_fp8_linear(x, q2, s)
    made = []
    real_view = _mxq.BlockFp8Weight.view

    def counting_view(*args):
        made.append(args[0].data_ptr())
        return real_view(*args)

    monkeypatch.setattr(linear_ops._mxq, "BlockFp8Weight",
                        types.SimpleNamespace(view=counting_view))
    module = ops.BlockFp8Linear(q.clone(), s.clone(), (128, 128))
    for _ in range(4):
        assert torch.equal(module(x), want)
    assert len(made) == 1
    # An update in place (e.g. an RL weight update): the same memory, read anew; not rewrapped.
    module.weight.copy_(q2)
    module.weight_scale.copy_(s2)
    assert torch.equal(module(x), want2) and len(made) == 1
    # New tensors (a device move or an assignment replaces the buffers): wrapped again.
    module.weight = module.weight.clone()
    assert torch.equal(module(x), want2) and len(made) == 2
    # Other scales under the same codes tensor: wrapped again, never the stale scales.
    module.weight_scale = s.clone()
    assert torch.equal(module(x), want_mixed) and len(made) == 3
    # The cache holds the tensors weakly.
    import weakref

    alive = weakref.ref(module.weight)
    del module
    gc.collect()
    assert alive() is None


def test_the_workspace_comes_from_the_caller_only_when_needed():
    """mxq asks the workspace callable (torch.empty in the ops) for exactly the bytes
    linear_workspace_bytes gives, and only when the call needs any."""
    q, s = quantized_weight(128, 256, (64, 128), seed=6, mode="ue8m0")
    packed = torch.from_numpy(formats.pack_ue8m0(s.numpy()))
    x = torch.randn(5, 256).bfloat16()
    xq, xs = torch.ops.mxq.quantize_fp8_groups(x, 128, "ue8m0")
    for weight_scale in (s, packed):
        w = _mxq.BlockFp8Weight.view(q.view(torch.uint8), weight_scale, (64, 128))
        for name, call in (
                ("bf16", lambda ws, out: w.linear_into(x, out, ws, None, "auto", "ue8m0")),
                ("fp8", lambda ws, out: w.fp8_linear_into(xq, xs, out, ws)),
                ("fp8-mn-major", lambda ws, out: w.fp8_linear_into(xq, mn_major(xs), out, ws)),
                ("fp8-packed-ue8m0",
                 lambda ws, out: w.fp8_linear_into(xq, packed_scales(xs), out, ws))):
            asked = []

            def workspace(nbytes):
                asked.append(nbytes)
                return torch.empty(nbytes, dtype=torch.uint8)

            out = torch.empty(5, 128).bfloat16()
            run = call(workspace, out)
            assert run is None
            want = w.workspace_bytes(5, name)
            assert asked == ([want] if want else []), (name, asked, want)
            assert np.array_equal(bits(out), bits(torch.ops.mxq.block_fp8_linear(
                x, q, weight_scale, 64, 128, None, "ue8m0"))), name
    assert _mxq.BlockFp8Weight.view(q.view(torch.uint8), s, (64, 128)).workspace_bytes(5, "fp8") == 0
    with pytest.raises(ValueError, match=r"^workspace: expected at least \d+ bytes"):
        w.linear_into(x, torch.empty(5, 128).bfloat16(), torch.empty(8, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"activation_input: expected one of"):
        w.workspace_bytes(5, "int8")



@pytest.mark.parametrize("block,m", [("128x128", 5), ("64x128", 17)])
def test_block_fp8_linear_equals_cli(tmp_path, block, m):
    w = np.random.default_rng(21).standard_normal((192, 384)).astype(np.float32)
    np.save(tmp_path / "w.npy", w)
    run_cli("quantize", "fp8-block", str(tmp_path / "w.npy"), str(tmp_path / "w.safetensors"),
            "--block", block, "--name", "proj")
    x = np.random.default_rng(22).standard_normal((m, 384)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    run_cli("linear", "--checkpoint", str(tmp_path / "w.safetensors"), "--name", "proj", "--input",
            str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"))
    cli = np.load(tmp_path / "y.npy")
    module = ops.BlockFp8Linear.from_mxq(
        mxq.BlockFp8Linear.from_checkpoint(tmp_path / "w.safetensors", "proj"))
    assert module.weight.dtype == E4M3 and (module.block_n, module.block_k) == tuple(
        int(v) for v in block.split("x"))
    y = module(torch.from_numpy(x).bfloat16())
    assert np.array_equal(bits(y.float()), cli.view(np.int32))


@pytest.mark.parametrize("bias_dtype", [np.float32, ml_dtypes.bfloat16])
def test_from_mxq_keeps_the_bias_dtype(bias_dtype):
    q, s = quantized_weight(128, 256, (128, 128))
    bias = np.random.default_rng(5).standard_normal(128).astype(bias_dtype)
    lin = mxq.BlockFp8Linear.from_arrays(bits(q), s.numpy(), (128, 128), bias=bias)
    module = ops.BlockFp8Linear.from_mxq(lin)
    want = torch.float32 if bias_dtype is np.float32 else torch.bfloat16
    assert module.bias.dtype == want
    assert np.array_equal(bits(module.bias), bias.view(bits(module.bias).dtype))
    x = torch.randn(3, 256).bfloat16()
    assert np.array_equal(bits(module(x)), lin.forward(bf16_numpy(x)).view(np.int16))


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_block_fp8_linear_module_keeps_buffer_dtypes(bias_dtype):
    """model.half() / .to(dtype) / .double() leave the quantized layer's buffers as they are
    (a float16 weight is refused by the op, rounded scales change the weight); devices move."""
    q, s = quantized_weight(128, 256, (128, 128))
    module = ops.BlockFp8Linear(q, s, (128, 128), torch.randn(128).to(bias_dtype))
    x = torch.randn(3, 256).bfloat16()
    want = module(x)
    dtypes = [b.dtype for b in module.buffers()]
    for convert in (lambda m: m.half(), lambda m: m.to(torch.bfloat16), lambda m: m.double(),
                    lambda m: m.float(), lambda m: m.to("cpu", torch.float16)):
        assert convert(module) is module
        assert [b.dtype for b in module.buffers()] == dtypes
        assert torch.equal(module(x), want)
    # Device moves still apply (a same-device move is no copy); the dtypes stay.
    weight = module.weight
    assert module.to("cpu").weight is weight
    model = torch.nn.Sequential(torch.nn.Linear(4, 256), module).to("meta", torch.float16)
    assert model[0].weight.dtype == torch.float16  # the torch layer converts, this one does not
    assert [(b.device.type, b.dtype) for b in module.buffers()] == [("meta", d) for d in dtypes]
    model.to_empty(device="cpu")
    assert [(b.device.type, b.dtype) for b in module.buffers()] == [("cpu", d) for d in dtypes]


# --- MoE ----------------------------------------------------------------------------------

def rank_modules(checkpoint, layer=0, tp=1, ep=1, align=128, **kwargs):
    """One Mxfp4MoE per rank of a TP x EP grid, in rank order (ep_rank * tp + tp_rank), as one
    process per rank would build them."""
    return [ops.Mxfp4MoE.from_checkpoint(checkpoint, layer, tp_rank=t, tp_size=tp, ep_rank=e,
                                         ep_size=ep, alignment=align, **kwargs)
            for e in range(ep) for t in range(tp)]


@pytest.mark.parametrize("layer,tp,ep,align", [(0, 1, 1, 128), (1, 2, 2, 128), (0, 3, 1, 0)])
def test_mxfp4_moe_ranks_sum_to_the_cli(moe_checkpoint, tmp_path, layer, tp, ep, align):
    """Each rank's float32 partial (its own module, read from the checkpoint by mxq), summed in
    rank order and rounded once to bf16, is the CLI's output bit for bit (NaN rows stay NaN)."""
    x = torch.from_numpy(
        np.random.default_rng(layer + 10 * tp).standard_normal((9, 128)).astype(np.float32))
    x[4, 7] = float("nan")
    xb = x.bfloat16()
    np.save(tmp_path / "x.npy", xb.float().numpy())
    run_cli("moe", "--checkpoint", str(moe_checkpoint), "--layer", str(layer), "--input",
            str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"), "--tp", str(tp),
            "--ep", str(ep), "--align", str(align))
    cli = np.load(tmp_path / "y.npy")
    total = torch.zeros(9, 128)
    for module in rank_modules(moe_checkpoint, layer, tp, ep, align, out_dtype=torch.float32):
        total += module(xb)
    y = total.bfloat16().float().numpy()
    nan = np.isnan(cli)
    assert np.array_equal(np.isnan(y), nan) and nan[4].all()
    assert np.array_equal(y[~nan].view(np.int32), cli[~nan].view(np.int32))


def test_from_checkpoint_reads_either_layout(moe_checkpoint, tmp_path):
    """A native-layout checkpoint of the same layer (mxq synth --layout native) gives the same
    prepared buffers; the config comes from config.json."""
    native = tmp_path / "native"
    run_cli("synth", "gpt-oss", str(native), "--experts", "8", "--hidden", "128",
            "--intermediate", "96", "--top-k", "2", "--layers", "2", "--seed", "7", "--layout",
            "native")
    a = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, 1, tp_rank=1, tp_size=2)
    b = ops.Mxfp4MoE.from_checkpoint(native, 1, tp_rank=1, tp_size=2)
    assert (a.num_experts, a.hidden_size, a.intermediate_size, a.top_k) == (8, 128, 96, 2)
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
    with pytest.raises(mxq.Error, match="7"):
        ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, 7)


# --- opcheck ------------------------------------------------------------------------------

def opcheck_cases(moe):
    x = torch.randn(4, 64)
    blocks, scales = torch.ops.mxq.quantize_mxfp4(x, "ceil")
    q, s = quantized_weight(128, 256, (128, 128))
    codes = torch.ops.mxq.e4m3_encode(x, True)
    xb = torch.randn(3, 256).bfloat16()
    xq, xs = torch.ops.mxq.quantize_fp8_groups(xb, 128, "fp32")
    xq_p, xs_p = torch.ops.mxq.quantize_fp8_groups(xb, 128, "ue8m0")
    ids = torch.randint(0, 8, (5, 2), dtype=torch.int32)
    prepared = (moe.w13, moe.w13_scale, moe.w13_bias, moe.w2, moe.w2_scale, moe.w2_bias)
    experts = _mxq.moe_checkpoint_experts(str(moe.checkpoint_path), 0)

    def bias(array):
        return ops._from_numpy(array, torch.bfloat16)

    return {
        "quantize_mxfp4": (x, "floor"),
        "quantize_mxfp4_bf16": (x.bfloat16(), "ceil"),
        "dequantize_mxfp4": (blocks, scales.view(torch.uint8)),
        "e4m3_encode": (x, False),
        "e4m3_decode": (codes.view(torch.uint8),),
        "quantize_fp8_block": (torch.randn(130, 200), 64, 128, "ue8m0"),
        "dequantize_fp8_block": (q.view(torch.uint8), s, 128, 128),
        "quantize_fp8_groups": (xb, 128, "fp32"),
        "block_fp8_linear": (xb, q.view(torch.uint8), s, 128, 128, torch.randn(128), "fp32",
                             torch.bfloat16, "auto"),
        "block_fp8_linear_3d": (xb.reshape(1, 3, 256), q.view(torch.uint8), s, 128, 128, None,
                                "ue8m0", torch.float32, "auto"),
        "block_fp8_linear_out": (xb.reshape(1, 3, 256), q.view(torch.uint8), s,
                                 torch.empty(1, 3, 128), 128, 128, torch.randn(128).bfloat16()),
        "fp8_gemm_nt": (xq.view(torch.uint8), xs, q.view(torch.uint8), s,
                        torch.empty(3, 128).bfloat16()),
        "fp8_gemm_nt_mn": (xq.view(torch.uint8), mn_major(xs), q.view(torch.uint8), s,
                           torch.empty(3, 128), 128, 128, torch.randn(128)),
        "fp8_gemm_nt_packed": (xq_p.view(torch.uint8), packed_scales(xs_p), q.view(torch.uint8), s,
                               torch.empty(3, 128).bfloat16()),
        "mxfp4_moe": (torch.randn(5, 128).bfloat16(), *prepared, None, None, moe.router_weight,
                      moe.router_bias, 8, 96, 2),
        "mxfp4_moe_routed": (torch.randn(5, 128), *prepared, ids, torch.rand(5, 2), None, None, 8,
                             96, 2, 0, 1, 0, 1, 128, "swiglu_oai", 1.702, 7.0, "bf16", True,
                             torch.float32),
        "mxfp4_moe_into": (torch.randn(5, 128).bfloat16(), *prepared, ids, torch.rand(5, 2), None,
                           None, torch.empty(5, 128), torch.empty(0, dtype=torch.uint8), 8, 96, 2,
                           5),
        "mxfp4_moe_prepare": (*(torch.from_numpy(experts[n]) for n in (
                                  "w13", "w13_scale")), bias(experts["w13_bias"]),
                              *(torch.from_numpy(experts[n]) for n in ("w2", "w2_scale")),
                              bias(experts["w2_bias"]), 8, 96, 0, 2, 1, 2, 128, "bf16",
                              "gpt-oss"),
        "moe_route": (torch.randn(5, 128).bfloat16(), moe.router_weight, moe.router_bias, 2),
    }


def test_opcheck_every_op(moe_checkpoint):
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint)
    moe.checkpoint_path = moe_checkpoint
    cases = opcheck_cases(moe)
    checked = set()
    for name, args in cases.items():
        op = getattr(torch.ops.mxq, re.sub(r"_(bf16|3d|routed|mn|packed)$", "", name))
        result = torch.library.opcheck(op.default, args)
        assert set(result.values()) == {"SUCCESS"}, (name, result)
        checked.add(op.default.name())
    registered = {f"mxq::{n}" for n in ops.__all__ if hasattr(torch.ops.mxq, n)}
    assert checked == registered


def test_opcheck_with_float8_inputs():
    """float8 inputs too, without opcheck's schema test: torch's own mutation check compares
    inputs with allclose, which torch does not implement for float8 on the CPU."""
    q, s = quantized_weight(128, 256, (128, 128))
    xb = torch.randn(3, 256).bfloat16()
    _, scales = torch.ops.mxq.quantize_mxfp4(torch.randn(2, 64))
    tests = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for op, args in ((torch.ops.mxq.block_fp8_linear, (xb, q, s, 128, 128)),
                     (torch.ops.mxq.dequantize_fp8_block, (q, s, 128, 128)),
                     (torch.ops.mxq.e4m3_decode, (q,)),
                     (torch.ops.mxq.dequantize_mxfp4,
                      (torch.zeros(2, 2, 16, dtype=torch.uint8), scales))):
        result = torch.library.opcheck(op.default, args, test_utils=tests)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


# --- torch.compile --------------------------------------------------------------------------

class Block(torch.nn.Module):
    """A module mixing the ops: MoE, a block-FP8 projection, an MXFP4 round trip."""

    def __init__(self, moe: "ops.Mxfp4MoE", q, s) -> None:
        super().__init__()
        self.moe = moe
        self.proj = ops.BlockFp8Linear(q, s, (128, 128))

    def forward(self, x):
        h = self.moe(x.bfloat16())
        blocks, scales = torch.ops.mxq.quantize_mxfp4(h, "floor")
        h = torch.ops.mxq.dequantize_mxfp4(blocks, scales).bfloat16()
        return self.proj(torch.cat([h, h], dim=-1)).float() + 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(moe_checkpoint, backend):
    torch._dynamo.reset()
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, tp_rank=1, tp_size=2)
    q, s = quantized_weight(64, 256, (128, 128))
    module = Block(moe, q, s)
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=True)
    for tokens in (7, 3, 12):
        x = torch.randn(tokens, 128)
        want = module(x)
        got = compiled(x)
        assert got.shape == (tokens, 64) and np.array_equal(bits(got), bits(want))


class Engine(torch.nn.Module):
    """An engine-style forward: quantize, DeepGEMM's call into a preallocated buffer (row-major or
    MN-major scales), then a projection into the caller's output."""

    def __init__(self, q, s, q2, s2) -> None:
        super().__init__()
        self.register_buffer("q", q)
        self.register_buffer("s", s)
        self.proj = ops.BlockFp8Linear(q2, s2, (128, 128))

    def forward(self, x, out):
        xq, xs = torch.ops.mxq.quantize_fp8_groups(x, 128, "fp32")
        h = torch.empty(x.shape[0], self.q.shape[0], dtype=torch.bfloat16)
        torch.ops.mxq.fp8_gemm_nt(xq, xs, self.q, self.s, h)
        m = x.shape[0]
        storage = torch.zeros(xs.shape[1], (m + 3) // 4 * 4)  # MN-major, ld = round_up(M, 4)
        storage[:, :m] = xs.t()
        g = torch.empty(m, self.q.shape[0], dtype=torch.bfloat16)
        torch.ops.mxq.fp8_gemm_nt(xq, storage.t()[:m], self.q, self.s, g)
        return self.proj(torch.cat([h, g], dim=-1), out=out)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_out_and_fp8_gemm_nt(backend):
    torch._dynamo.reset()
    q, s = quantized_weight(128, 256, (128, 128), seed=7)
    q2, s2 = quantized_weight(64, 256, (128, 128), seed=8)
    module = Engine(q, s, q2, s2)
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=True)
    for tokens in (8, 3, 12):
        x = torch.randn(tokens, 256).bfloat16()
        want = module(x, torch.empty(tokens, 64))
        out = torch.full((tokens, 64), float("nan"))
        got = compiled(x, out)
        assert np.array_equal(bits(got), bits(want)) and np.array_equal(bits(out), bits(want))


def test_fake_impls_check_arguments_while_tracing(moe_checkpoint):
    module = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"x: expected \[T, 128\]"):
        compiled(torch.randn(3, 64).bfloat16())


# --- autograd -------------------------------------------------------------------------------
#
# torch.autograd.gradcheck does not apply to block_fp8_linear: its gradient is a straight-through
# estimate (the activation quantization inside the op counts as the identity), not the derivative
# of the quantized forward (piecewise constant in x), and the op takes bf16 x only. The tests
# assert the formula against a float64 reference instead.

def graded_weight(n, k, block, mode):
    """Block-FP8 codes with block scales spanning orders of magnitude (a misplaced scale shows),
    the float32 scales (packed UE8M0 int32 for mode "packed") and mxq's dequantization."""
    rng = np.random.default_rng(n + k)
    w = rng.standard_normal((n, k)) * 2.0 ** rng.integers(-4, 5, (n, 1))
    w *= 2.0 ** rng.integers(-4, 5, k)
    q, s = torch.ops.mxq.quantize_fp8_block(torch.from_numpy(w.astype(np.float32)), *block,
                                            "fp32" if mode == "fp32" else "ue8m0")
    w_deq = torch.ops.mxq.dequantize_fp8_block(q, s, *block).double()
    if mode == "packed":
        s = torch.from_numpy(formats.pack_ue8m0(s.numpy()))
    return q, s, w_deq


def assert_straight_through(x, bias, grad_y, w_deq):
    """grad_x = grad_y @ W (float64 reference, rounded once to x's dtype); grad_bias = grad_y
    summed over the tokens."""
    n, k = w_deq.shape
    want = grad_y.double().reshape(-1, n) @ w_deq
    assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
    torch.testing.assert_close(x.grad.double().reshape(-1, k), want, rtol=2**-8,
                               atol=1e-5 * want.abs().max().item())
    if bias is not None:
        assert bias.grad.dtype == bias.dtype and bias.grad.shape == bias.shape
        torch.testing.assert_close(bias.grad.double(), grad_y.double().reshape(-1, n).sum(0),
                                   rtol=2**-8 if bias.dtype == torch.bfloat16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("n,k,block,mode", [(256, 384, (128, 128), "fp32"),
                                            (200, 300, (128, 128), "fp32"),
                                            (256, 384, (128, 128), "packed"),
                                            (200, 300, (32, 64), "packed")])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.bfloat16])
def test_block_fp8_linear_gradient_is_straight_through(n, k, block, mode, bias_dtype):
    q, s, w_deq = graded_weight(n, k, block, mode)
    x = torch.randn(2, 3, k).bfloat16().requires_grad_(True)
    bias = None if bias_dtype is None else torch.randn(n).to(bias_dtype).requires_grad_(True)
    y = torch.ops.mxq.block_fp8_linear(x, q, s, *block, bias)
    grad_y = torch.randn(y.shape).bfloat16()
    y.backward(grad_y)
    assert_straight_through(x, bias, grad_y, w_deq)
    # f32 output, frozen bias: only x gets a gradient (from an f32 grad_y)
    x.grad = None
    y = torch.ops.mxq.block_fp8_linear(x, q, s, *block, None if bias is None else bias.detach(),
                                       "fp32", torch.float32)
    grad_y = torch.randn(y.shape)
    y.backward(grad_y)
    assert_straight_through(x, None, grad_y, w_deq)


def test_unpacked_ue8m0_scales_equal_mxq():
    """The backward's torch unpacking of packed UE8M0 scales, every byte value included."""
    codes = np.random.default_rng(1).permutation(256).astype(np.uint8)
    packed = codes.reshape(4, 16, 4).view("<i4")[..., 0]  # [ceil(G/4), MN], 4 groups per int32
    for mn, groups in ((16, 16), (13, 14)):
        want = formats.unpack_ue8m0(packed, mn, groups)
        assert np.array_equal(bits(ops._unpack_ue8m0(torch.from_numpy(packed), mn, groups)),
                              want.view(np.int32))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_block_fp8_linear_has_the_gradient(backend):
    torch._dynamo.reset()
    q, s, w_deq = graded_weight(200, 300, (128, 128), "packed")
    module = ops.BlockFp8Linear(q, s, (128, 128), torch.randn(200))
    module.bias.requires_grad_(True)
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    x = torch.randn(5, 300).bfloat16()
    grad_y = torch.randn(5, 200).bfloat16()
    results = []
    for run in (module, compiled):
        xr = x.clone().requires_grad_(True)
        module.bias.grad = None
        y = run(xr)
        y.backward(grad_y)
        assert_straight_through(xr, module.bias, grad_y, w_deq)
        results.append((y.detach(), xr.grad, module.bias.grad))
    (y, gx, gb), (yc, gxc, gbc) = results
    assert torch.equal(yc, y)
    if backend == "aot_eager":  # inductor may fuse the dequantization differently
        assert torch.equal(gxc, gx) and torch.equal(gbc, gb)


def test_opcheck_block_fp8_linear_with_gradients():
    """opcheck's autograd tests with inputs that require grad (eager vs AOT-compiled grads)."""
    q, s = quantized_weight(128, 256, (128, 128))
    x = torch.randn(3, 256).bfloat16().requires_grad_(True)
    packed = torch.from_numpy(formats.pack_ue8m0(quantized_weight(128, 256, (128, 128),
                                                                  mode="ue8m0")[1].numpy()))
    for args in ((x, q.view(torch.uint8), s, 128, 128, torch.randn(128, requires_grad=True),
                  "fp32", torch.bfloat16, "auto"),
                 (x.detach().reshape(1, 3, 256).requires_grad_(True), q.view(torch.uint8), packed,
                  128, 128)):
        result = torch.library.opcheck(torch.ops.mxq.block_fp8_linear.default, args)
        assert set(result.values()) == {"SUCCESS"}, result


def no_gradient_cases(moe_checkpoint):
    """Per op without a gradient: a function of one floating input, and that input."""
    x = torch.randn(4, 64)
    q, s = quantized_weight(128, 256, (128, 128))
    blocks, e8m0 = torch.ops.mxq.quantize_mxfp4(x)
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, tp_rank=1, tp_size=2)
    return {
        "mxfp4_moe": (moe, torch.randn(5, 128).bfloat16()),
        "moe_route": (lambda a: torch.ops.mxq.moe_route(a, moe.router_weight, None, 2)[1],
                      torch.randn(8, 128).bfloat16()),
        "quantize_mxfp4": (lambda a: torch.ops.mxq.quantize_mxfp4(a)[1], x),
        "quantize_fp8_block": (lambda a: torch.ops.mxq.quantize_fp8_block(a, 32, 32)[1], x),
        "quantize_fp8_groups": (lambda a: torch.ops.mxq.quantize_fp8_groups(a, 32)[1], x),
        "e4m3_encode": (lambda a: torch.ops.mxq.e4m3_encode(a), x),
        "e4m3_decode": (lambda a: torch.ops.mxq.e4m3_decode(a), q),
        "dequantize_fp8_block": (lambda a: torch.ops.mxq.dequantize_fp8_block(q, a, 128, 128), s),
        "dequantize_mxfp4": (lambda a: torch.ops.mxq.dequantize_mxfp4(blocks, a), e8m0),
    }


@pytest.mark.parametrize("op", ["mxfp4_moe", "moe_route", "quantize_mxfp4", "quantize_fp8_block",
                                "quantize_fp8_groups", "e4m3_encode", "e4m3_decode",
                                "dequantize_fp8_block", "dequantize_mxfp4"])
def test_ops_without_gradient_run_and_compile_with_grad_inputs(moe_checkpoint, op):
    """With an input that requires grad, eager and torch.compile(fullgraph=True) forwards work;
    only a backward reaching the op fails, naming it."""
    torch._dynamo.reset()
    fn, arg = no_gradient_cases(moe_checkpoint)[op]
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        want = fn(arg)
    for run in (compiled, fn):
        leaf = arg.clone().requires_grad_(True)
        y = run(leaf)
        assert y.requires_grad and np.array_equal(bits(y), bits(want))
        with pytest.raises(mxq.Error, match=rf"^mxq\.{op} has no gradient \(") as info:
            y.float().sum().backward()
        assert info.value.code == "unsupported" and isinstance(info.value, RuntimeError)


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_backward_fails_also_where_the_gradient_is_zeroed(backend):
    """torch.round's backward ignores its incoming gradient: the failing backward node feeds
    nothing, and must not be dead-code eliminated into a silent zero gradient."""
    torch._dynamo.reset()

    def fn(a):
        return torch.ops.mxq.e4m3_encode(torch.round(a)).float()

    x = torch.randn(4, 64, requires_grad=True)
    with torch._inductor.config.patch(force_disable_caches=True):  # a fresh backward graph
        y = torch.compile(fn, fullgraph=True, backend=backend)(x)
        with pytest.raises(mxq.Error, match=r"^mxq\.e4m3_encode has no gradient"):
            y.sum().backward()


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_block_with_grad_runs_and_fails_where_eager_does(moe_checkpoint, backend):
    """The mixed module (MoE, MXFP4 round trip, block-FP8 projection) with x requiring grad:
    the compiled forward equals eager, and the backward fails at the op eager fails at (the
    MXFP4 dequantization, the first op without gradient from the loss)."""
    torch._dynamo.reset()
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, tp_rank=1, tp_size=2)
    q, s = quantized_weight(64, 256, (128, 128))
    module = Block(moe, q, s)
    with torch._inductor.config.patch(force_disable_caches=True):  # a fresh backward graph
        compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=True)
        for tokens in (7, 3):
            x = torch.randn(tokens, 128, requires_grad=True)
            for run in (module, compiled):
                y = run(x)
                assert y.requires_grad and np.array_equal(bits(y), bits(module(x)))
                with pytest.raises(mxq.Error, match=r"^mxq\.dequantize_mxfp4 has no gradient"):
                    y.sum().backward()


def test_mxfp4_moe_message_says_no_grad(moe_checkpoint):
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint)
    y = moe(torch.randn(3, 128).bfloat16().requires_grad_(True))
    with pytest.raises(RuntimeError, match=r"^mxq.mxfp4_moe has no gradient \(mxq's MoE op is "
                                           r"for inference; run it under torch.no_grad\(\)\)$"):
        y.sum().backward()


# --- no copies ------------------------------------------------------------------------------

def test_weights_are_borrowed_not_copied():
    q, s = quantized_weight(128, 256, (128, 128))
    w = _mxq.BlockFp8Weight.borrow(q.view(torch.uint8), s, (128, 128))
    assert w.q.__array_interface__["data"][0] == q.data_ptr()
    assert w.scale.__array_interface__["data"][0] == s.data_ptr()
    del q, s
    gc.collect()
    assert w.q.shape == (128, 256)  # the weight keeps the torch tensors alive


def test_results_wrap_mxq_memory_and_round_trip_without_copies():
    blocks, scales = formats.quantize_mxfp4(np.ones((4, 64), np.float32))
    t = torch.from_numpy(blocks)
    assert t.data_ptr() == blocks.ctypes.data
    assert _mxq._inspect_array(t)["data"] == t.data_ptr()  # back into mxq: same memory
    e8m0 = ops._from_numpy(scales, torch.float8_e8m0fnu)
    assert e8m0.data_ptr() == scales.ctypes.data and e8m0.dtype == torch.float8_e8m0fnu
    bf = np.ones((2, 3), ml_dtypes.bfloat16)
    tb = ops._from_numpy(bf, torch.bfloat16)
    assert tb.data_ptr() == bf.ctypes.data and tb.dtype == torch.bfloat16
    assert _mxq._inspect_array(tb)["dtype"] == "bf16"


# --- errors -------------------------------------------------------------------------------

def test_wrong_dtype_is_type_error_naming_argument(moe_checkpoint):
    q, s = quantized_weight(128, 256, (128, 128))
    with pytest.raises(TypeError, match=r"^x: expected bfloat16, found float32"):
        torch.ops.mxq.block_fp8_linear(torch.randn(2, 256), q, s, 128, 128)
    with pytest.raises(TypeError, match=r"^weight: expected float8_e4m3fn or uint8, found float32"):
        torch.ops.mxq.block_fp8_linear(torch.randn(2, 256).bfloat16(), q.float(), s, 128, 128)
    with pytest.raises(TypeError, match=r"^weight_scale: "):
        torch.ops.mxq.block_fp8_linear(torch.randn(2, 256).bfloat16(), q, s.double(), 128, 128)
    with pytest.raises(TypeError, match=r"^x: expected float32 or bfloat16, found float64"):
        torch.ops.mxq.quantize_mxfp4(torch.randn(2, 64, dtype=torch.float64))
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint)
    with pytest.raises(TypeError, match=r"^x: "):
        moe(torch.randn(2, 128, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"^topk_ids: expected int32"):
        moe(torch.randn(2, 128), torch.zeros(2, 2, dtype=torch.int64), torch.ones(2, 2))


def test_non_contiguous_is_value_error_naming_argument(moe_checkpoint):
    with pytest.raises(ValueError, match=r"^x: expected a contiguous tensor"):
        torch.ops.mxq.quantize_mxfp4(torch.randn(64, 4).t())
    q, s = quantized_weight(128, 256, (128, 128))
    wt = torch.ops.mxq.quantize_fp8_block(torch.randn(256, 128), 128, 128)[0].t()
    with pytest.raises(ValueError, match=r"^weight: expected a contiguous tensor"):
        torch.ops.mxq.block_fp8_linear(torch.randn(2, 256).bfloat16(), wt, s, 128, 128)
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint)
    with pytest.raises(ValueError, match=r"^x: expected a contiguous tensor"):
        moe(torch.randn(128, 4).t())


def test_shape_and_device_errors_name_the_argument(moe_checkpoint):
    q, s = quantized_weight(128, 256, (128, 128))
    x = torch.randn(2, 256).bfloat16()
    with pytest.raises(ValueError, match=r"^x: expected K = 256 columns"):
        torch.ops.mxq.block_fp8_linear(torch.randn(2, 128).bfloat16(), q, s, 128, 128)
    with pytest.raises(ValueError, match=r"^bias: expected shape \[128\]"):
        torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128, torch.zeros(5))
    with pytest.raises(ValueError, match=r"^weight: expected a tensor on cpu \(where x is\), found one on meta"):
        torch.ops.mxq.block_fp8_linear(x, q.to("meta"), s, 128, 128)
    with pytest.raises(ValueError, match=r"^x: expected a last dimension that is a multiple of 32"):
        torch.ops.mxq.quantize_mxfp4(torch.randn(2, 40))
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint)
    with pytest.raises(ValueError, match=r"^topk_weights: expected a tensor with topk_ids"):
        moe(torch.randn(2, 128), torch.zeros(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^topk_weights: expected \[T, top_k\] = \[2, 2\]"):
        moe(torch.randn(2, 128), torch.zeros(2, 2, dtype=torch.int32), torch.ones(3, 2))


def test_mxq_errors_from_cpp_keep_their_classes():
    q, s = quantized_weight(128, 256, (128, 128))
    with pytest.raises(mxq.Error, match="no-such-tactic"):
        torch.ops.mxq.block_fp8_linear(torch.randn(2, 256).bfloat16(), q, s, 128, 128, None, "fp32",
                                       torch.bfloat16, "no-such-tactic")
    with pytest.raises(ValueError, match="scale_rule"):
        torch.ops.mxq.quantize_mxfp4(torch.randn(2, 64), "nearest")


def test_argument_errors_are_mxq_errors_with_codes(moe_checkpoint):
    """torch_ops' own argument errors are mxq.Error like the rest of mxq (code as the C++ core
    would name it), still TypeError / ValueError; the fake implementations raise the same."""
    q, s = quantized_weight(128, 256, (128, 128))
    x = torch.randn(2, 256).bfloat16()
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint)
    cases = [
        (lambda: torch.ops.mxq.block_fp8_linear(x.float(), q, s, 128, 128),
         mxq.DtypeError, TypeError, "dtype_mismatch"),
        (lambda: torch.ops.mxq.quantize_mxfp4(torch.randn(2, 40)),
         mxq.InvalidArgumentError, ValueError, "shape_mismatch"),
        (lambda: torch.ops.mxq.block_fp8_linear(x, q.to("meta"), s, 128, 128),
         mxq.InvalidArgumentError, ValueError, "device_mismatch"),
        (lambda: torch.ops.mxq.quantize_mxfp4(torch.randn(64, 4).t()),
         mxq.InvalidArgumentError, ValueError, "invalid_argument"),
        (lambda: torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128, None, "fp32", torch.float16),
         mxq.DtypeError, TypeError, "dtype_mismatch"),
        (lambda: torch.ops.mxq.block_fp8_linear_out(x, q, s, torch.empty(2, 128, dtype=torch.float16)),
         mxq.DtypeError, TypeError, "dtype_mismatch"),
        (lambda: torch.ops.mxq.fp8_gemm_nt(torch.zeros(2, 256, dtype=torch.uint8),
                                           torch.ones(2, 3), q, s, torch.empty(2, 128)),
         mxq.InvalidArgumentError, ValueError, "shape_mismatch"),
        (lambda: torch.ops.mxq.quantize_fp8_block(torch.randn(4, 4), 0, 128),
         mxq.InvalidArgumentError, ValueError, "invalid_argument"),
        (lambda: moe(torch.randn(2, 128), torch.zeros(2, 2, dtype=torch.int32)),
         mxq.InvalidArgumentError, ValueError, "invalid_argument"),
    ]
    fake_mode = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    for call, cls, base, code in cases:
        for mode in (contextlib.nullcontext(), fake_mode):
            with mode, pytest.raises(mxq.Error) as info:
                call()
            assert type(info.value) is cls and isinstance(info.value, base), (code, info.value)
            assert info.value.code == code, (code, info.value)


# --- autotune through the torch op ------------------------------------------------------------

def test_block_fp8_linear_runs_the_tuned_tactic(tmp_path, monkeypatch):
    for name in ("MXQ_AUTOTUNE", "MXQ_AUTOTUNE_CACHE", "MXQ_AUTOTUNE_SKIP_OPS", "MXQ_AUTOTUNE_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    runs = []

    class SpyWeight:
        def __init__(self, weight):
            self._weight = weight

        def __getattr__(self, name):
            return getattr(self._weight, name)

        def linear_into(self, x, out, workspace, bias, tactic, scales, stream, tuner, problem):
            run = self._weight.linear_into(x, out, workspace, bias, tactic, scales, stream, tuner,
                                           problem, True)
            runs.append((run["tactic"], run["from_tuner"], problem is not None))

    linear_ops = sys.modules[ops.BlockFp8Linear.__module__]  # the ops' module, whatever its name

    spy = types.SimpleNamespace(
        BlockFp8Weight=types.SimpleNamespace(
            view=lambda *args: SpyWeight(_mxq.BlockFp8Weight.view(*args))))
    q, s = quantized_weight(256, 512, (128, 128))
    monkeypatch.setattr(linear_ops, "_mxq", spy)
    x = torch.randn(8, 512).bfloat16()
    outside = torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128)
    with mxq.autotune(cache=str(tmp_path / "tactics.json")) as tuner:
        inside = torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128)
        forced = torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128, None, "fp32", torch.bfloat16,
                                                "cpu.reference")
    (record,) = tuner.records
    assert record["status"] == "tuned" and record["bucket"] == 8
    assert runs[0] == ("cpu.reference", False, False)
    assert runs[2] == ("cpu.reference", False, False)
    # The tuned tactic ran, looked up with the problem the tuner built once (no allocation).
    assert runs[1][1] and runs[1][2] and runs[1][0].startswith("cpu.")
    assert record["tactic"].split("[")[0] in runs[1][0]
    assert inside.shape == outside.shape == forced.shape
