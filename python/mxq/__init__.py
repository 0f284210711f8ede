"""mxq: quantized LLM layers (MXFP4 MoE, block-FP8 linear, bit-exact formats).

Arrays go in and out without copies where layout and device allow (DLPack / buffer protocol:
NumPy, PyTorch, CuPy). Host outputs are NumPy arrays that own mxq tensors; bf16 / E4M3 / E8M0
results use ml_dtypes' NumPy dtypes. CUDA inputs (torch, CuPy) run on the GPU on the caller's
stream and come back in the caller's framework. Errors from the C++ core are
:class:`mxq.Error`. ``mxq.autotune()`` makes an autotuner current for the ops;
``import mxq.torch_ops`` registers ``torch.ops.mxq.*``. See docs/python.md.
"""

from __future__ import annotations

# ml_dtypes registers bfloat16 / float8 with NumPy: mxq's outputs use them, and files that hold
# them (a checkpoint's bf16 router read with safetensors.numpy) load only once it is imported.
import ml_dtypes  # noqa: F401

from . import _mxq
from ._errors import DtypeError, Error, InvalidArgumentError
from ._mxq import BlockShape
from . import formats
from .linear import BlockFp8Linear
from .moe import MoELayer
from .tune import autotune

__version__: str = _mxq.__version__
with_cuda: bool = _mxq.with_cuda

__all__ = [
    "BlockFp8Linear",
    "BlockShape",
    "MoELayer",
    "autotune",
    "DtypeError",
    "Error",
    "InvalidArgumentError",
    "formats",
    "with_cuda",
]
