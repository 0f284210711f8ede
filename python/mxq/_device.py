"""Where an array lives, which stream its framework is on, and how device results go back.

mxq reads every array through DLPack or the buffer protocol without a copy. Results computed on
a CUDA device come back from the extension as DLPack exporters in their storage dtype (bf16 as
uint16 bits, E4M3 / E8M0 as uint8); :func:`to_framework` hands them to the caller's framework
(``torch.from_dlpack`` / ``cupy.from_dlpack``, no copy) and restores the dtype where the
framework has it. Nothing here imports torch or CuPy unless the caller's array is one.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Tuple

_KDL_CUDA = 2  # DLPack's kDLCUDA


def device_of(x: Any) -> Tuple[str, int]:
    """("cuda", index) for an array in CUDA memory, ("cpu", 0) otherwise (NumPy, host DLPack)."""
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is None:
        return ("cpu", 0)
    kind, index = dlpack_device()
    return ("cuda", int(index)) if int(kind) == _KDL_CUDA else ("cpu", 0)


def is_cuda(x: Any) -> bool:
    return x is not None and device_of(x)[0] == "cuda"


def _framework(x: Any) -> str:
    module = type(x).__module__ or ""
    return module.split(".", 1)[0]


def current_stream(x: Any) -> int:
    """The cudaStream_t (as an integer) that ``x``'s framework queues work on now: torch's
    current stream of x's device, CuPy's current stream; 0 (the default stream) otherwise."""
    framework = _framework(x)
    if framework == "torch":
        import torch

        return int(torch.cuda.current_stream(x.device).cuda_stream)
    if framework == "cupy":
        import cupy

        with x.device:
            return int(cupy.cuda.get_current_stream().ptr)
    return 0


def device_scope(x: Any) -> ContextManager[Any]:
    """Makes x's CUDA device current for a torch tensor (torch exports a CUDA tensor through
    DLPack only while its device is the current one); nothing for other arrays."""
    if _framework(x) == "torch" and x.device.type == "cuda":
        import torch

        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def to_framework(result: Any, like: Any, dtype: str) -> Any:
    """A device result (DLPack exporter holding ``dtype``'s storage) as ``like``'s framework.

    torch gets its own dtype back (bfloat16, float8_e4m3fn); CuPy, which has no bfloat16 or
    float8, gets the storage integers (uint16 / uint8 bit patterns). Other callers get the
    DLPack exporter itself.
    """
    framework = _framework(like)
    if framework == "torch":
        import torch

        tensor = torch.from_dlpack(result)
        view = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
                "e8m0": getattr(torch, "float8_e8m0fnu", torch.uint8)}.get(dtype)
        return tensor.view(view) if view is not None else tensor
    if framework == "cupy":
        import cupy

        return cupy.from_dlpack(result)
    return result
