"""PyTorch custom ops ``torch.ops.mxq.*`` over mxq (``import mxq.torch_ops`` registers them).

mxq itself never imports torch; this module does, and registers with ``torch.library``:

========================================  =========  =====  ===================================
op                                        CPU        CUDA   result
========================================  =========  =====  ===================================
``mxfp4_moe_prepare(w13, ..., rank)``      yes        yes    one rank's prepared tensors
``mxfp4_moe(x, prepared..., routing)``     yes        yes    the rank's partial [T, H] bf16/f32
``mxfp4_moe_into(..., out, workspace)``    yes        yes    None (writes ``out``)
``moe_route(x, router_weight, bias, k)``   yes        yes    (int32 ids, float32 weights) [T, k]
``block_fp8_linear(x, w, w_scale, ...)``   yes        yes    [..., N] bf16 or float32
``block_fp8_linear_out(x, w, w_s, out)``   yes        yes    None (writes ``out``)
``fp8_gemm_nt(x_q, x_s, w, w_s, out)``     yes        yes    None (writes ``out``)
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
  ``cudaStream_t``) and nothing synchronizes the host. The MoE and linear ops write into
  outputs that torch allocates (or the caller's: ``mxfp4_moe_into``, ``block_fp8_linear_out``,
  ``fp8_gemm_nt``), their temporaries come from torch's caching allocator or the caller's
  workspace, so they can be captured in a CUDA graph; ``quantize_fp8_groups`` returns memory
  that mxq's C++ op allocated (cudaMalloc, handed over through DLPack; freeing it waits for the
  device).
* **Bad arguments** raise :class:`mxq.DtypeError` (a ``TypeError``; code "dtype_mismatch")
  or :class:`mxq.InvalidArgumentError` (a ``ValueError``; code "shape_mismatch",
  "device_mismatch" or "invalid_argument") naming the argument, in the real and in the fake
  implementation, as mxq's C++ core would.
* **BlockFp8Linear** keeps its buffers' dtypes under ``model.half()`` / ``.to(dtype)``; device
  moves apply.
* **The MoE** is one rank's op on tensors (docs/engines.md): ``mxfp4_moe_prepare`` turns a
  checkpoint's expert tensors into the rank's prepared tensors, ``mxfp4_moe`` runs the rank and
  returns its partial (the engine sums the ranks' partials), :class:`Mxfp4MoE` holds the
  prepared tensors as buffers (``Mxfp4MoE.from_checkpoint`` reads a checkpoint with mxq's own
  reader). :class:`mxq.MoELayer` (every rank simulated in one object) is not a torch op.
* Inside :func:`mxq.autotune`, ``block_fp8_linear(..., tactic="auto")`` on the tuner's device
  runs the tuner's decisions (tuning the problem first in tune mode).
"""

from __future__ import annotations

from ._common import _from_numpy  # noqa: F401  (tests)
from .format_ops import (dequantize_fp8_block, dequantize_mxfp4, e4m3_decode, e4m3_encode,
                      quantize_fp8_block, quantize_fp8_groups, quantize_mxfp4)
from . import format_ops, linear_ops, mxfp4_moe_ops  # noqa: F401  (the ops' modules)
from .linear_ops import (BlockFp8Linear, _unpack_ue8m0, block_fp8_linear,  # noqa: F401
                         block_fp8_linear_out, fp8_gemm_nt)
from .mxfp4_moe_ops import (Mxfp4MoE, moe_route, mxfp4_moe, mxfp4_moe_into, mxfp4_moe_prepare,
                            mxfp4_moe_workspace_bytes, prepared_shapes)

__all__ = [
    "BlockFp8Linear",
    "Mxfp4MoE",
    "block_fp8_linear",
    "block_fp8_linear_out",
    "dequantize_fp8_block",
    "dequantize_mxfp4",
    "e4m3_decode",
    "e4m3_encode",
    "fp8_gemm_nt",
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

