"""torch.ops.mxq.*: real results equal mxq.formats / BlockFp8Linear, opcheck, torch.compile."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxq  # noqa: E402
import mxq.torch_ops  # noqa: E402,F401  (registers torch.ops.mxq.*)
from mxq import formats  # noqa: E402

pytestmark = pytest.mark.torch


def test_quantize_mxfp4_matches_formats():
    x = torch.randn(8, 64)
    blocks, scales = torch.ops.mxq.quantize_mxfp4(x, "floor")
    want_blocks, want_scales = formats.quantize_mxfp4(x.numpy())
    assert np.array_equal(blocks.numpy(), want_blocks)
    assert np.array_equal(scales.view(torch.uint8).numpy(), want_scales.view(np.uint8))
    y = torch.ops.mxq.dequantize_mxfp4(blocks, scales)
    assert np.array_equal(y.numpy(), formats.dequantize_mxfp4(want_blocks, want_scales))


def test_block_fp8_linear_matches_python_api():
    w = torch.randn(128, 256)
    q, s = torch.ops.mxq.quantize_fp8_block(w, 128, 128, "fp32")
    x = torch.randn(4, 256).to(torch.bfloat16)
    y = torch.ops.mxq.block_fp8_linear(x, q, s, 128, 128, None, "bf16")
    lin = mxq.BlockFp8Linear.quantize(w.numpy(), (128, 128))
    want = lin.forward(x.view(torch.int16).numpy().view(np.uint16).view(__import__("ml_dtypes").bfloat16))
    assert np.array_equal(y.view(torch.int16).numpy(), want.view(np.int16))


def test_opcheck():
    x = torch.randn(4, 64)
    torch.library.opcheck(torch.ops.mxq.quantize_mxfp4.default, (x, "floor"))
    blocks, scales = torch.ops.mxq.quantize_mxfp4(x, "ceil")
    torch.library.opcheck(torch.ops.mxq.dequantize_mxfp4.default, (blocks, scales))
    torch.library.opcheck(torch.ops.mxq.quantize_fp8_block.default, (torch.randn(130, 200), 64, 128, "ue8m0"))
    w = torch.randn(128, 256)
    q, s = torch.ops.mxq.quantize_fp8_block(w, 128, 128, "fp32")
    xb = torch.randn(3, 256).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.mxq.block_fp8_linear.default, (xb, q, s, 128, 128, None, "bf16"))


def test_torch_compile_fullgraph():
    class Module(torch.nn.Module):
        def forward(self, x):
            blocks, scales = torch.ops.mxq.quantize_mxfp4(x, "floor")
            return torch.ops.mxq.dequantize_mxfp4(blocks, scales) * 2

    x = torch.randn(4, 64)
    eager = Module()(x)
    compiled = torch.compile(Module(), fullgraph=True, backend="eager")(x)
    assert torch.equal(eager, compiled)


@pytest.mark.cuda
def test_cuda_tensor_is_refused_clearly():
    with pytest.raises(ValueError, match="^x: expected a CPU tensor"):
        torch.ops.mxq.quantize_mxfp4(torch.randn(4, 64, device="cuda"), "floor")
