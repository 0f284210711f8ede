"""mxq on a CUDA GPU from Python: torch.ops.mxq.* and the mxq API with torch CUDA tensors (and
CuPy arrays when CuPy is installed): bitwise equal to the C++ CLI's --device cuda on the same
files, work on the caller's current stream (also under CUDA graph capture), no copies at the
boundary, clear errors. Skipped without a GPU (marker `cuda`)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxq  # noqa: E402
import mxq.torch_ops as ops  # noqa: E402
from mxq import _mxq  # noqa: E402

from conftest import run_cli  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.torch]

DEV = "cuda:0"


@pytest.fixture(autouse=True)
def mxq_has_cuda():
    if not mxq.with_cuda:
        pytest.fail("torch sees a GPU but this build of mxq has no CUDA support: build it where "
                    "nvcc is found (MXQ_CUDA=AUTO/ON)")


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]).numpy()


def normalized_error(out: np.ndarray, ref: np.ndarray) -> float:
    out = out.astype(np.float64)
    ref = ref.astype(np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))


def tokens(t: int, h: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((t, h)).astype(np.float32)


# --- MoE ----------------------------------------------------------------------------------

@pytest.mark.parametrize("layer,tp,ep,align", [(0, 1, 1, 128), (1, 2, 2, 128), (0, 3, 1, 0)])
def test_moe_forward_cuda_equals_cli(moe_checkpoint, tmp_path, layer, tp, ep, align):
    x = tokens(9, 128, seed=layer + 10 * tp)
    np.save(tmp_path / "x.npy", x)
    run_cli("moe", "--checkpoint", str(moe_checkpoint), "--layer", str(layer), "--input",
            str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"), "--tp", str(tp), "--ep",
            str(ep), "--align", str(align), "--device", "cuda")
    cli = np.load(tmp_path / "y.npy")
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=layer, tp_size=tp, ep_size=ep,
                                       align=align)
    moe.cuda(0, max_tokens=9)  # as the CLI uploads it
    xb = torch.from_numpy(x).to(DEV).bfloat16()
    y = moe.forward(xb)
    assert y.device == xb.device and y.dtype == torch.bfloat16 and y.shape == (9, 128)
    assert np.array_equal(bits(y.float()), cli.view(np.int32))
    # the GPU kernels against the CPU reference (docs/moe.md: <= 4e-3 for bf16 outputs)
    ref = moe.forward(x)
    assert normalized_error(y.float().cpu().numpy(), ref) <= 4e-3
    # one engine-facing module per rank (as one process per rank), fp32 partials summed
    total = torch.zeros(9, 128, device=DEV)
    for e in range(ep):
        for t in range(tp):
            total += ops.Mxfp4MoE.from_checkpoint(
                moe_checkpoint, layer, tp_rank=t, tp_size=tp, ep_rank=e, ep_size=ep,
                alignment=align, out_dtype=torch.float32, device=DEV)(xb)
    assert normalized_error(total.cpu().numpy(), ref) <= 4e-3


@pytest.mark.parametrize("tp,align", [(1, 128), (3, 0)])
def test_moe_w4a8_forward_cuda_equals_cli_and_reference(moe_checkpoint, tmp_path, tp, align):
    x = tokens(9, 128, seed=20 + tp)
    np.save(tmp_path / "x.npy", x)
    run_cli("moe", "--checkpoint", str(moe_checkpoint), "--input", str(tmp_path / "x.npy"),
            "--output", str(tmp_path / "y.npy"), "--tp", str(tp), "--align", str(align),
            "--activation-quant", "fp8_g128", "--device", "cuda")
    cli = np.load(tmp_path / "y.npy")
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=tp, align=align,
                                       activation_quant="fp8_g128")
    moe.cuda(0, max_tokens=9)
    y = moe.forward(torch.from_numpy(x).to(DEV).bfloat16())
    assert np.array_equal(bits(y.float()), cli.view(np.int32))
    # against the CPU's W4A8 reference (and not equal to the W4A16 one: the quantization shows)
    ref = moe.forward(x)
    assert normalized_error(y.float().cpu().numpy(), ref) <= 4e-3
    w4a16 = mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=tp, align=align).forward(x)
    assert normalized_error(ref, w4a16) > 1e-3


def test_moe_forward_cuda_upload_size_and_routing(moe_checkpoint):
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=2)
    x = torch.from_numpy(tokens(5, 128, seed=3)).to(DEV).bfloat16()
    small = moe.forward(x)  # uploads lazily (1024 tokens)
    moe.cuda(0, max_tokens=5)
    assert torch.equal(moe.forward(x), small)
    big = torch.from_numpy(tokens(2000, 128, seed=4)).to(DEV).bfloat16()
    assert moe.forward(big).shape == (2000, 128)  # re-uploads, larger
    details = moe.forward_details(x.float().cpu().numpy())
    ids = torch.from_numpy(details.expert_ids).to(DEV)
    weights = torch.from_numpy(details.expert_weights).to(DEV)
    routed = moe.forward(x, ids, weights)
    assert normalized_error(routed.float().cpu().numpy(), details.output) <= 4e-3
    assert not torch.equal(moe.forward(x, (ids + 1) % 8, weights), routed)


def test_moe_weight_update_reaches_the_gpu(moe_checkpoint):
    from safetensors.numpy import load_file

    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=0)
    x = torch.from_numpy(tokens(4, 128, seed=5)).to(DEV).bfloat16()
    before = moe.forward(x)
    other = {}
    for f in sorted(moe_checkpoint.glob("*.safetensors")):
        other.update({k.replace(".layers.1.", ".layers.0."): v
                      for k, v in load_file(str(f)).items() if ".layers.1." in k})
    with moe.update() as u:
        for name, value in other.items():
            u.load(name, value)
    after = moe.forward(x)
    assert not torch.equal(after, before)
    assert normalized_error(after.float().cpu().numpy(), moe.forward(x.float().cpu().numpy())) <= 4e-3


# --- block-FP8 linear ---------------------------------------------------------------------

@pytest.mark.parametrize("block,n,k,m", [("128x128", 256, 512, 64), ("64x128", 192, 384, 5)])
def test_block_fp8_linear_cuda_equals_cli(tmp_path, block, n, k, m):
    w = np.random.default_rng(31).standard_normal((n, k)).astype(np.float32)
    np.save(tmp_path / "w.npy", w)
    run_cli("quantize", "fp8-block", str(tmp_path / "w.npy"), str(tmp_path / "w.safetensors"),
            "--block", block, "--name", "proj")
    x = tokens(m, k, seed=32)
    np.save(tmp_path / "x.npy", x)
    run_cli("linear", "--checkpoint", str(tmp_path / "w.safetensors"), "--name", "proj", "--input",
            str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"), "--device", "cuda")
    cli = np.load(tmp_path / "y.npy")
    host = mxq.BlockFp8Linear.from_checkpoint(tmp_path / "w.safetensors", "proj")
    module = ops.BlockFp8Linear.from_mxq(host).to(DEV)
    xb = torch.from_numpy(x).to(DEV).bfloat16()
    y = module(xb)
    assert y.device == xb.device and y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert np.array_equal(bits(y.float()), cli.view(np.int32))
    # the plain API on a CUDA copy of the weight: the same tensor
    assert torch.equal(host.cuda(0).forward(xb), y)
    # against the CPU reference on the same quantized inputs
    ref = host.forward(x.astype(ml_dtypes.bfloat16), tactic="cpu.reference").astype(np.float32)
    assert normalized_error(y.float().cpu().numpy(), ref) <= 4e-3


def mn_major(scales, pad=4):
    """float32 [M, G] scales in DeepGEMM's MN-major layout (element (m, g) at m + g * ld)."""
    m, groups = scales.shape
    ld = (m + 3) // 4 * 4 + pad
    storage = torch.zeros(groups, ld, dtype=torch.float32, device=scales.device)
    storage[:, :m] = scales.t()
    return storage.t()[:m]


def packed(scales):
    return torch.from_numpy(mxq.formats.pack_ue8m0(scales.cpu().numpy())).to(scales.device)


def linear_case(m=24, n=256, k=512, seed=40):
    q, s = torch.ops.mxq.quantize_fp8_block(torch.randn(n, k), 128, 128, "ue8m0")
    x = torch.from_numpy(tokens(m, k, seed=seed)).to(DEV).bfloat16()
    return x, q.to(DEV), s.to(DEV)


def test_out_and_fp8_gemm_nt_cuda_equal_block_fp8_linear():
    x, q, s = linear_case()
    bias = torch.randn(256, device=DEV)
    want = torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128, bias, "ue8m0")
    out = torch.full_like(want, float("nan"))
    torch.ops.mxq.block_fp8_linear_out(x, q, s, out, 128, 128, bias, "ue8m0")
    assert torch.equal(out, want)
    xq, xs = torch.ops.mxq.quantize_fp8_groups(x, 128, "ue8m0")
    for scales in (xs, mn_major(xs), mn_major(xs, pad=0), packed(xs)):
        out = torch.full_like(want, float("nan"))
        torch.ops.mxq.fp8_gemm_nt(xq, scales, q, s, out, 128, 128, bias)
        assert torch.equal(out, want), scales.stride()
    # f32 output, 64x64 blocks (the wgmma fallback)
    q64, s64 = torch.ops.mxq.quantize_fp8_block(torch.randn(192, 512), 64, 64)
    q64, s64 = q64.to(DEV), s64.to(DEV)
    want = torch.ops.mxq.block_fp8_linear(x, q64, s64, 64, 64, None, "fp32", torch.float32)
    xq, xs = torch.ops.mxq.quantize_fp8_groups(x, 64, "fp32")
    out = torch.empty_like(want)
    torch.ops.mxq.fp8_gemm_nt(xq, mn_major(xs), q64, s64, out, 64, 64)
    assert torch.equal(out, want)


def test_temporaries_come_from_torchs_allocator():
    """The workspace is a torch allocation of exactly the size mxq asks for, and none is made
    where the call needs none (MN-major scales, fp32 weight scales)."""
    x, q, s = linear_case()
    xq, xs = torch.ops.mxq.quantize_fp8_groups(x, 128, "ue8m0")
    scales_mn = mn_major(xs)
    out = torch.empty(24, 256, device=DEV).bfloat16()
    torch.ops.mxq.fp8_gemm_nt(xq, scales_mn, q, s, out)  # warm-up (first-use wrapping)
    torch.cuda.synchronize()

    def allocations(call):
        before = torch.cuda.memory_stats(DEV)["allocation.all.allocated"]
        call()
        return torch.cuda.memory_stats(DEV)["allocation.all.allocated"] - before

    assert allocations(lambda: torch.ops.mxq.fp8_gemm_nt(xq, scales_mn, q, s, out)) == 0
    assert allocations(lambda: torch.ops.mxq.fp8_gemm_nt(xq, xs, q, s, out)) == 1
    assert allocations(lambda: torch.ops.mxq.block_fp8_linear_out(x, q, s, out)) == 1


@pytest.mark.parametrize("form", ["bf16", "bf16_out", "fp8", "fp8_mn_major", "fp8_packed"])
def test_linear_ops_in_a_cuda_graph(form):
    x, q, s = linear_case(m=32, seed=41)
    x2 = torch.from_numpy(tokens(32, 512, seed=42)).to(DEV).bfloat16()
    static_x = x.clone()
    out = torch.empty(32, 256, device=DEV).bfloat16()

    def quantized(t):
        xq, xs = torch.ops.mxq.quantize_fp8_groups(t, 128, "ue8m0")
        return xq, {"fp8": xs, "fp8_mn_major": mn_major(xs), "fp8_packed": packed(xs)}.get(form)

    static_q, static_scale = quantized(static_x)

    def step():
        if form == "bf16":
            return torch.ops.mxq.block_fp8_linear(static_x, q, s, 128, 128, None, "ue8m0")
        if form == "bf16_out":
            torch.ops.mxq.block_fp8_linear_out(static_x, q, s, out, 128, 128, None, "ue8m0")
        else:
            torch.ops.mxq.fp8_gemm_nt(static_q, static_scale, q, s, out, 128, 128)
        return out

    want = step().clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, want)
    # New activations in the captured buffers: the replay computes them.
    static_x.copy_(x2)
    new_q, new_scale = quantized(x2)
    static_q.copy_(new_q)
    if static_scale is not None:
        static_scale.copy_(new_scale)
    static_y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, torch.ops.mxq.block_fp8_linear(x2, q, s, 128, 128, None, "ue8m0"))


def test_quantize_fp8_groups_cuda_equals_cpu():
    x = torch.randn(37, 300).bfloat16()
    for mode in ("fp32", "ue8m0"):
        q, scale = torch.ops.mxq.quantize_fp8_groups(x.to(DEV), 128, mode)
        want_q, want_scale = torch.ops.mxq.quantize_fp8_groups(x, 128, mode)
        assert q.device == torch.device(DEV) and q.dtype == torch.float8_e4m3fn
        assert np.array_equal(bits(q), bits(want_q)) and np.array_equal(bits(scale), bits(want_scale))


# --- streams ------------------------------------------------------------------------------

def run_behind_a_busy_stream(fn, x):
    """Runs fn(x_on_stream) on a side stream whose input is written only after a long sleep on
    that stream: an op that ignores the current stream reads the NaN poison instead."""
    side = torch.cuda.Stream()
    staged = torch.full_like(x, float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on this stream
        staged.copy_(x)
        y = fn(staged)
    assert not side.query()  # still queued behind the sleep: nothing synchronized the host
    side.synchronize()
    return y


def test_ops_run_on_the_current_stream(moe_checkpoint):
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, tp_rank=1, tp_size=2, device=DEV)
    x = torch.from_numpy(tokens(16, 128, seed=6)).to(DEV).bfloat16()
    want = moe(x)
    got = run_behind_a_busy_stream(moe, x)
    assert torch.equal(got, want)
    layer = mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=2).cuda(0, max_tokens=64)
    want = layer.forward(x)
    assert torch.equal(run_behind_a_busy_stream(layer.forward, x), want)

    q, s = torch.ops.mxq.quantize_fp8_block(torch.randn(256, 512), 128, 128)
    q, s = q.to(DEV), s.to(DEV)
    xl = torch.randn(32, 512, device=DEV).bfloat16()
    want = torch.ops.mxq.block_fp8_linear(xl, q, s, 128, 128)
    got = run_behind_a_busy_stream(lambda t: torch.ops.mxq.block_fp8_linear(t, q, s, 128, 128), xl)
    assert torch.equal(got, want)

    # DeepGEMM's call on pre-quantized activations: the scales are what the side stream stages.
    xq, xs = torch.ops.mxq.quantize_fp8_groups(xl, 128, "fp32")
    torch.cuda.synchronize()

    def gemm(scales):  # into a torch output, on the side stream
        out = torch.empty(32, 256, device=DEV).bfloat16()
        torch.ops.mxq.fp8_gemm_nt(xq, scales, q, s, out)
        return out

    assert torch.equal(run_behind_a_busy_stream(gemm, xs), want)


def test_moe_layer_in_a_cuda_graph(moe_checkpoint):
    """The simulated layer on the GPU is capturable too, once uploaded."""
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=2).cuda(0, max_tokens=8)
    x = torch.from_numpy(tokens(8, 128, seed=7)).to(DEV).bfloat16()
    want = moe.forward(x)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        moe.forward(static_x)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        static_y = moe.forward(static_x)
    static_x.copy_(torch.from_numpy(tokens(8, 128, seed=8)).to(DEV).bfloat16())
    graph.replay()
    other = moe.forward(static_x)
    torch.cuda.synchronize()
    assert torch.equal(static_y, other) and not torch.equal(static_y, want)
    static_x.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, want)


# --- no copies ----------------------------------------------------------------------------

def test_cuda_tensors_cross_the_boundary_without_copies():
    x = torch.randn(8, 256, device=DEV).bfloat16()
    seen = _mxq._inspect_array(x)
    assert seen["data"] == x.data_ptr() and seen["device"] == "cuda:0" and seen["dtype"] == "bf16"
    q, s = torch.ops.mxq.quantize_fp8_block(torch.randn(128, 256), 128, 128)
    q, s = q.to(DEV), s.to(DEV)
    w = _mxq.BlockFp8Weight.borrow(q.view(torch.uint8), s, (128, 128))
    assert w.device == "cuda:0"
    assert torch.from_dlpack(w.q).data_ptr() == q.data_ptr()
    assert torch.from_dlpack(w.scale).data_ptr() == s.data_ptr()
    y = w.linear(x, None, "auto", "fp32", "bf16", torch.cuda.current_stream().cuda_stream)
    # y is a one-shot DLPack capsule of mxq's output (bf16 bits as uint16): torch adopts it in
    # place (a capsule cannot be copied from), on the input's device.
    t = torch.from_dlpack(y)
    assert t.device == x.device and t.dtype == torch.uint16 and tuple(t.shape) == (8, 128)
    with pytest.raises(RuntimeError):
        torch.from_dlpack(y)  # consumed: nothing else holds the output


# --- CuPy -----------------------------------------------------------------------------------

def test_cupy_arrays_in_and_out(moe_checkpoint):
    cupy = pytest.importorskip("cupy")
    x = torch.from_numpy(tokens(6, 256, seed=9)).to(DEV).bfloat16()
    q, s = torch.ops.mxq.quantize_fp8_block(torch.randn(128, 256), 128, 128)
    lin = mxq.BlockFp8Linear.from_arrays(q.view(torch.uint8).numpy(), s.numpy(), (128, 128)).cuda(0)
    want = lin.forward(x)
    x_cupy = cupy.from_dlpack(x.view(torch.int16)).view(cupy.uint16)  # CuPy has no bfloat16
    assert _mxq._inspect_array(x_cupy.view(cupy.uint8))["data"] == x.data_ptr()
    y = lin.forward(x_cupy)
    assert isinstance(y, cupy.ndarray) and y.dtype == cupy.uint16
    cupy.cuda.get_current_stream().synchronize()
    assert np.array_equal(cupy.asnumpy(y).view(np.int16), bits(want))
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint)
    xm = torch.from_numpy(tokens(3, 128, seed=10)).to(DEV).bfloat16()
    ym = moe.forward(cupy.from_dlpack(xm.view(torch.int16)).view(cupy.uint16))
    assert isinstance(ym, cupy.ndarray)
    assert np.array_equal(cupy.asnumpy(ym).view(np.int16), bits(moe.forward(xm)))


# --- opcheck and torch.compile on the GPU ---------------------------------------------------

def test_opcheck_cuda(moe_checkpoint):
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, device=DEV)
    prepared = (moe.w13, moe.w13_scale, moe.w13_bias, moe.w2, moe.w2_scale, moe.w2_bias)
    xm = torch.randn(5, 128, device=DEV).bfloat16()
    ids = torch.randint(0, 8, (5, 2), dtype=torch.int32, device=DEV)
    workspace = torch.zeros(ops.mxfp4_moe_workspace_bytes(8, 128, 96, 2, 5), dtype=torch.uint8,
                            device=DEV)
    q, s = torch.ops.mxq.quantize_fp8_block(torch.randn(128, 256), 128, 128)
    xb = torch.randn(3, 256, device=DEV).bfloat16()
    xq, xs = torch.ops.mxq.quantize_fp8_groups(xb, 128, "fp32")
    cases = [
        (torch.ops.mxq.block_fp8_linear, (xb, q.view(torch.uint8).to(DEV), s.to(DEV), 128, 128)),
        (torch.ops.mxq.quantize_fp8_groups, (xb, 128, "ue8m0")),
        (torch.ops.mxq.block_fp8_linear_out, (xb, q.view(torch.uint8).to(DEV), s.to(DEV),
                                              torch.empty(3, 128, device=DEV))),
        (torch.ops.mxq.fp8_gemm_nt, (xq.view(torch.uint8), xs, q.view(torch.uint8).to(DEV),
                                     s.to(DEV), torch.empty(3, 128, device=DEV).bfloat16())),
        (torch.ops.mxq.fp8_gemm_nt, (xq.view(torch.uint8), mn_major(xs),
                                     q.view(torch.uint8).to(DEV), s.to(DEV),
                                     torch.empty(3, 128, device=DEV).bfloat16())),
        (torch.ops.mxq.mxfp4_moe, (xm, *prepared, None, None, moe.router_weight,
                                   moe.router_bias, 8, 96, 2)),
        (torch.ops.mxq.mxfp4_moe, (xm, *prepared, ids, torch.rand(5, 2, device=DEV), None, None,
                                   8, 96, 2)),
        (torch.ops.mxq.mxfp4_moe_into, (xm, *prepared, ids, torch.rand(5, 2, device=DEV), None,
                                        None, torch.empty(5, 128, device=DEV), workspace, 8, 96,
                                        2, 5)),
        (torch.ops.mxq.moe_route, (xm, moe.router_weight, moe.router_bias, 2)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op.default, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_torch_compile_fullgraph_cuda(moe_checkpoint):
    torch._dynamo.reset()
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, tp_rank=1, tp_size=2)
    q, s = torch.ops.mxq.quantize_fp8_block(torch.randn(64, 128), 128, 128)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = moe
            self.proj = ops.BlockFp8Linear(q, s, (128, 128))

        def forward(self, x):
            return self.proj(self.moe(x)).float() * 2

    module = Block().to(DEV)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager", dynamic=True)
    for t in (7, 3):
        x = torch.randn(t, 128, device=DEV).bfloat16()
        assert torch.equal(compiled(x), module(x))


# --- errors -------------------------------------------------------------------------------

def test_cuda_errors_name_the_argument(moe_checkpoint):
    moe = ops.Mxfp4MoE.from_checkpoint(moe_checkpoint, device=DEV)
    with pytest.raises(TypeError, match=r"^x: expected bfloat16, found float32"):
        moe(torch.randn(2, 128, device=DEV))
    with pytest.raises(ValueError, match=r"^x: expected a contiguous tensor"):
        moe(torch.randn(128, 2, device=DEV).bfloat16().t())
    with pytest.raises(ValueError, match=r"^w13: expected a tensor on cuda:0"):
        moe.to("cpu")(torch.randn(2, 128, device=DEV).bfloat16())
    q, s = torch.ops.mxq.quantize_fp8_block(torch.randn(128, 256), 128, 128)
    x = torch.randn(2, 256, device=DEV).bfloat16()
    with pytest.raises(ValueError, match=r"^weight: expected a tensor on cuda:0 \(where x is\), found one on cpu"):
        torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128)
    qd, sd = q.to(DEV), s.to(DEV)
    buffer = torch.empty(2 * 128 + 1, device=DEV).bfloat16()
    with pytest.raises(ValueError, match=r"^out: expected a 16-byte aligned address \(TMA\)"):
        torch.ops.mxq.block_fp8_linear_out(x, qd, sd, buffer[1:].view(2, 128))
    with pytest.raises(ValueError, match=r"^out: expected a tensor on cuda:0 \(where x is\)"):
        torch.ops.mxq.block_fp8_linear_out(x, qd, sd, torch.empty(2, 128))
    with pytest.raises(ValueError, match=r"^x: expected a CPU tensor, found one on cuda:0"):
        torch.ops.mxq.quantize_mxfp4(torch.randn(4, 64, device=DEV))
    with pytest.raises(ValueError, match=r"^x is on cuda:0 but the weight is on cpu"):
        mxq.BlockFp8Linear.from_arrays(q.view(torch.uint8).numpy(), s.numpy(), (128, 128)).forward(x)
    with pytest.raises(ValueError, match=r"^x: expected a host"):
        mxq.formats.quantize_mxfp4(torch.randn(4, 64, device=DEV))


# --- autotuning on the GPU ----------------------------------------------------------------

def test_autotune_cuda_linear_and_moe(moe_checkpoint, tmp_path, monkeypatch):
    for name in ("MXQ_AUTOTUNE", "MXQ_AUTOTUNE_CACHE", "MXQ_AUTOTUNE_SKIP_OPS", "MXQ_AUTOTUNE_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    cache = str(tmp_path / "tactics.json")
    q, s = torch.ops.mxq.quantize_fp8_block(torch.randn(256, 512), 128, 128)
    lin = mxq.BlockFp8Linear.from_arrays(q.view(torch.uint8).numpy(), s.numpy(), (128, 128)).cuda(0)
    moe = mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=2)
    x = torch.randn(16, 512, device=DEV).bfloat16()
    xm = torch.from_numpy(tokens(16, 128, seed=11)).to(DEV).bfloat16()
    with mxq.autotune(cache=cache, mode="tune", device="cuda:0") as tuner:
        y = lin.forward(x)
        explained = lin.explain(16)
        ym = moe.forward(xm)
        assert moe.device_tactic(0, 16)["from_tuner"]
    ops_tuned = {r["op"] for r in tuner.records}
    assert ops_tuned == {"block_fp8_linear", "moe_gpu_forward"}, tuner.records
    assert all(r["status"] in ("tuned", "hit") for r in tuner.records), tuner.records
    assert explained["from_tuner"], explained["tuner_note"]
    ref = lin.to("cpu").forward(x.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16),
                                tactic="cpu.reference")
    assert normalized_error(y.float().cpu().numpy(), ref.astype(np.float32)) <= 4e-3
    assert normalized_error(ym.float().cpu().numpy(), moe.forward(xm.float().cpu().numpy())) <= 4e-3
    with mxq.autotune(cache=cache, mode="load", device="cuda:0") as served:
        assert lin.explain(16)["from_tuner"] and served.records == []


# --- the engine-facing MoE ops (torch.ops.mxq.mxfp4_moe*, Mxfp4MoE) ----------------------------

def _experts(checkpoint, layer=0):
    from test_mxfp4_moe_ops import experts_of

    return experts_of(checkpoint, layer)


def test_mxfp4_moe_cuda_matches_the_cpu_op_and_moves_with_the_module(moe_checkpoint):
    from test_mxfp4_moe_ops import H, module_of

    ex = _experts(moe_checkpoint)
    cpu = module_of(ex)
    gpu = module_of({k: v.to(DEV) for k, v in ex.items()})
    # Prepared on the device: the host's bytes; the same module moved: the same bytes too.
    for name in ("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
    moved = module_of(ex).to(DEV)
    for tokens in (1, 5, 300):
        x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens)).bfloat16()
        want = cpu(x).float().numpy()
        for module in (gpu, moved):
            got = module(x.to(DEV)).float().cpu().numpy()
            assert normalized_error(got, want) <= 4e-3, tokens
    # TP = 2 x EP = 2 as four calls: fp32 partials summed, against the CPU sum.
    x = torch.randn(9, H).bfloat16()
    total_cpu, total_gpu = torch.zeros(9, H), torch.zeros(9, H, device=DEV)
    for ep in range(2):
        for tp in range(2):
            kwargs = dict(tp_rank=tp, tp_size=2, ep_rank=ep, ep_size=2, out_dtype=torch.float32)
            total_cpu += module_of(ex, **kwargs)(x)
            total_gpu += module_of({k: v.to(DEV) for k, v in ex.items()}, **kwargs)(x.to(DEV))
    assert normalized_error(total_gpu.cpu().numpy(), total_cpu.numpy()) <= 4e-3


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the reference capture
def test_mxfp4_moe_graph_replay_equals_eager_and_allocates_nothing(moe_checkpoint):
    from test_mxfp4_moe_ops import H, module_of

    module = module_of({k: v.to(DEV) for k, v in _experts(moe_checkpoint).items()},
                       max_tokens=64)
    x = torch.randn(16, H, device=DEV).bfloat16()
    eager = module(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        module(x)  # warm-up outside capture (the workspace exists from the eager call)
    torch.cuda.current_stream().wait_stream(stream)

    def captured(fn):
        """(bytes torch's allocator gained while capturing fn, the graph, fn's result)."""
        graph = torch.cuda.CUDAGraph()
        allocated = torch.cuda.memory_allocated()
        with torch.cuda.graph(graph):
            result = fn()
        return torch.cuda.memory_allocated() - allocated, graph, result

    # What a capture holding only the output's allocation costs (torch's capture keeps a few
    # small tensors of its own, e.g. the RNG offset), against the forward's capture: equal.
    reference, _, _ = captured(lambda: torch.empty_like(x))
    used, graph, out = captured(lambda: module(x))
    assert used == reference
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_moe_route_cuda_equals_cpu(moe_checkpoint):
    from test_mxfp4_moe_ops import H, TOP_K

    ex = _experts(moe_checkpoint)
    x = torch.randn(40, H).bfloat16()
    ids, weights = torch.ops.mxq.moe_route(x, ex["router_weight"], ex["router_bias"], TOP_K)
    ids_d, weights_d = torch.ops.mxq.moe_route(x.to(DEV), ex["router_weight"].to(DEV),
                                               ex["router_bias"].to(DEV), TOP_K)
    assert torch.equal(ids_d.cpu(), ids)
    torch.testing.assert_close(weights_d.cpu(), weights, rtol=1e-5, atol=1e-6)
