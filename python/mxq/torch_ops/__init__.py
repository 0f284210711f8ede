"""PyTorch custom ops ``torch.ops.mxq.*`` over mxq (``import mxq.torch_ops`` registers them).

mxq itself never imports torch; this module does, and registers with ``torch.library``:

========================================  =========  =====  ===================================
op                                        CPU        CUDA   result
========================================  =========  =====  ===================================
``moe_forward(x, layer, ids?, weights?)``  yes        yes    [T, H] in x's dtype (CUDA: bf16)
``block_fp8_linear(x, w, w_scale, ...)``   yes        yes    [..., N] bf16 or float32
``quantize_fp8_groups(x, group_k, mode)``  yes        yes    (e4m3 [M, K], float32 [M, G])
``quantize_mxfp4`` / ``dequantize_mxfp4``  yes        no     (uint8 [..., G, 16], e8m0 [..., G])
``e4m3_encode`` / ``e4m3_decode``          yes        no     float8_e4m3fn / float32
``quantize_fp8_block`` / ``dequantize_…``  yes        no     (e4m3 [N, K], float32 blocks)
========================================  =========  =====  ===================================

Each op has a fake (shape-only) implementation, so ``torch.compile(fullgraph=True)`` traces
modules calling them (dynamic shapes included); ``torch.library.opcheck`` passes for the ops
without float8 inputs.

* **Autograd.** ``block_fp8_linear`` has a gradient for x and the bias: the straight-through
  estimate grad_x = grad_y W, W dequantized (E4M3 codes times block scales, float32) with torch
  ops on the weight's device (the activation quantization inside the op counts as the
  identity; the weight and scales are frozen, no gradient: LoRA on an FP8 model), and
  grad_bias = grad_y summed over the leading dims. Every other op taking a floating tensor has
  a formula that fails when a backward reaches it (``mxq.Error``, code "unsupported": "mxq.OP
  has no gradient (...)"), so with inputs that require grad their forward runs and compiles
  (``fullgraph=True``); only the backward raises, eager and compiled alike.
* **Tensors in** are read in place through DLPack (no copy); float8 tensors travel as uint8
  views of the same bytes. **Results** on the CPU are NumPy arrays owned by mxq, wrapped by
  ``torch.from_numpy`` (no copy). On CUDA the work is queued on torch's *current stream* of the
  input's device (``torch.cuda.current_stream(x.device).cuda_stream`` goes to the C++ op as its
  ``cudaStream_t``) and nothing synchronizes the host. ``moe_forward`` writes into an output
  that torch allocates; ``block_fp8_linear`` and ``quantize_fp8_groups`` return memory that
  mxq's C++ op allocated (cudaMalloc, handed over through DLPack; freeing it waits for the
  device) until the C++ linear op takes an output buffer.
* **Bad arguments** raise :class:`mxq.DtypeError` (a ``TypeError``; code "dtype_mismatch")
  or :class:`mxq.InvalidArgumentError` (a ``ValueError``; code "shape_mismatch",
  "device_mismatch" or "invalid_argument") naming the argument, in the real and in the fake
  implementation, as mxq's C++ core would.
* **BlockFp8Linear** keeps its buffers' dtypes under ``model.half()`` / ``.to(dtype)``; device
  moves apply.
* **The MoE layer** is not a tensor: its weights live in an :class:`mxq.MoELayer` (every
  simulated rank, plus a copy per CUDA device made on first use, see ``MoELayer.cuda``). The
  op takes the layer's integer ``handle`` (``layer.handle``) — a plain int in the graph, so
  tracing, opcheck and CUDA graphs see only tensors and constants; the registry holds layers
  weakly and never reuses a handle, so a freed layer's handle fails clearly. (A
  ``torch.classes`` custom class would make the layer a graph input but needs a C++ torch
  extension; a handle keeps mxq free of a libtorch build dependency.) :class:`MoE` wraps it.
* Inside :func:`mxq.autotune`, ``block_fp8_linear(..., tactic="auto")`` and ``moe_forward``
  on the tuner's device run the tuner's decisions (tuning the problem first in tune mode; on
  the CPU, ``moe_forward`` tunes each rank's expert tiling as ``MoELayer.forward`` does).
"""

from __future__ import annotations

from ._common import _from_numpy  # noqa: F401  (tests)
from .format_ops import (dequantize_fp8_block, dequantize_mxfp4, e4m3_decode, e4m3_encode,
                      quantize_fp8_block, quantize_fp8_groups, quantize_mxfp4)
from . import format_ops, linear_ops, moe_ops, mxfp4_moe_ops  # noqa: F401  (the ops' modules)
from .linear_ops import BlockFp8Linear, _unpack_ue8m0, block_fp8_linear  # noqa: F401
from .moe_ops import MoE, moe_forward
from .mxfp4_moe_ops import (Mxfp4MoE, moe_route, mxfp4_moe, mxfp4_moe_into, mxfp4_moe_prepare,
                            mxfp4_moe_workspace_bytes, prepared_shapes)

__all__ = [
    "BlockFp8Linear",
    "MoE",
    "Mxfp4MoE",
    "block_fp8_linear",
    "dequantize_fp8_block",
    "dequantize_mxfp4",
    "e4m3_decode",
    "e4m3_encode",
    "moe_forward",
    "moe_route",
    "mxfp4_moe",
    "mxfp4_moe_into",
    "mxfp4_moe_prepare",
    "mxfp4_moe_workspace_bytes",
    "prepared_shapes",
    "quantize_fp8_block",
    "quantize_fp8_groups",
    "quantize_mxfp4",
]

