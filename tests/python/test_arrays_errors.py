"""The array boundary (no copies, clear errors naming the argument) and mxq.Error mapping."""

from __future__ import annotations

import ctypes
import gc

import ml_dtypes
import numpy as np
import pytest

import mxq
from mxq import _mxq, formats


def data_pointer(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int32, ml_dtypes.bfloat16,
                                   ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu])
def test_inputs_are_not_copied(dtype):
    base = np.zeros((6, 64), dtype)
    for a in (base, base[2:]):  # a contiguous slice keeps its offset pointer
        seen = _mxq._inspect_array(a)
        assert seen["data"] == data_pointer(a)
        assert seen["shape"] == a.shape and seen["device"] == "cpu"
    assert _mxq._inspect_array(base)["dtype"] == {
        np.float32: "f32", np.uint8: "u8", np.int32: "i32", ml_dtypes.bfloat16: "bf16",
        ml_dtypes.float8_e4m3fn: "e4m3", ml_dtypes.float8_e8m0fnu: "e8m0"}[dtype]


def test_strided_view_is_seen_with_its_strides():
    a = np.zeros((4, 8), np.float32)[:, ::2]
    seen = _mxq._inspect_array(a)
    assert seen["strides"] == (8, 2) and seen["data"] == data_pointer(a)


def test_outputs_round_trip_without_copies():
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    blocks, scales = formats.quantize_mxfp4(x)
    # The outputs own mxq tensors; feeding them back reads the same memory.
    assert _mxq._inspect_array(blocks)["data"] == data_pointer(blocks)
    assert _mxq._inspect_array(scales)["data"] == data_pointer(scales)
    # The owner keeps the memory alive after every other reference is gone.
    keep = scales.view(np.uint8)
    pointer = data_pointer(keep)
    expect = keep.copy()
    del blocks, scales
    gc.collect()
    _ = [np.ones(1 << 16) for _ in range(8)]  # churn the allocator
    assert data_pointer(keep) == pointer and np.array_equal(keep, expect)
    assert np.ascontiguousarray(keep).ctypes.data == pointer


def test_outputs_are_writable_numpy_arrays():
    q, scale = formats.quantize_fp8_block(np.ones((4, 4), np.float32), (2, 2))
    assert isinstance(q, np.ndarray) and q.flags.writeable and q.flags.c_contiguous
    q[0, 0] = 0  # owned by the caller now


def test_wrong_dtype_is_type_error_naming_argument():
    with pytest.raises(TypeError, match=r"^x: expected f32 or bf16.*found float64"):
        formats.quantize_mxfp4(np.ones((2, 32), np.float64))
    with pytest.raises(TypeError, match=r"^scales: expected e8m0"):
        formats.dequantize_mxfp4(np.zeros((1, 1, 16), np.uint8), np.zeros((1, 1), np.float32))


def test_non_array_is_type_error():
    with pytest.raises(TypeError, match="^x: expected an array"):
        formats.quantize_mxfp4([[1.0] * 32])


def test_non_contiguous_is_value_error_naming_argument():
    x = np.ones((4, 64), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=r"^x: expected a C-contiguous"):
        formats.quantize_mxfp4(x)
    with pytest.raises(ValueError, match=r"^x: expected a C-contiguous"):
        formats.e4m3_encode(np.ones((8, 8), np.float32).T)


def test_wrong_rank_is_value_error():
    with pytest.raises(ValueError, match=r"^x: expected 2 dimensions"):
        formats.quantize_fp8_block(np.ones(8, np.float32), (1, 8))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class FakeCudaArray:
    """A DLPack (0.x) exporter claiming CUDA memory: enough to test the device check without a
    GPU (mxq must refuse it before touching the data)."""

    def __init__(self, shape=(2, 32), dtype=(2, 32)):
        self.shape = tuple(shape)
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = 0x1000  # never dereferenced
        t.device = _DLDevice(2, 0)  # kDLCUDA
        t.ndim = len(shape)
        t.dtype = _DLDataType(dtype[0], dtype[1], 1)  # (2, 32): float32; (4, 16): bfloat16
        t.shape = self._shape

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kwargs):
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(self._managed), b"dltensor", None)


def test_device_array_on_host_only_op_is_value_error():
    fake = FakeCudaArray()
    assert _mxq._inspect_array(fake)["device"] == "cuda:0"
    with pytest.raises(ValueError, match=r"^x: expected a host \(CPU\) array, found one on cuda:0"):
        formats.quantize_mxfp4(fake)


def test_device_array_with_a_host_weight_is_value_error():
    """A CUDA array meets a host weight: refused (naming x) before its memory is touched, on the
    path that CUDA input takes in Python (device and stream detection)."""
    lin = mxq.BlockFp8Linear.quantize(np.ones((64, 32), np.float32), (64, 32))
    fake = FakeCudaArray((2, 32), dtype=(4, 16))
    assert _mxq._inspect_array(fake)["dtype"] == "bf16"
    with pytest.raises(ValueError, match=r"^x is on cuda:0 but the weight is on cpu"):
        lin.forward(fake)
    with pytest.raises(TypeError, match=r"^x: expected bf16"):
        lin.forward(FakeCudaArray((2, 32)))


@pytest.mark.parametrize("code,cls,base", [
    ("invalid argument", mxq.InvalidArgumentError, ValueError),
    ("shape mismatch", mxq.InvalidArgumentError, ValueError),
    ("dtype mismatch", mxq.DtypeError, TypeError),
    ("device mismatch", mxq.InvalidArgumentError, ValueError),
    ("out of range", mxq.InvalidArgumentError, ValueError),
    ("I/O error", mxq.Error, RuntimeError),
    ("format error", mxq.Error, RuntimeError),
    ("unsupported", mxq.Error, RuntimeError),
    ("CUDA error", mxq.Error, RuntimeError),
    ("internal error", mxq.Error, RuntimeError),
])
def test_cpp_errors_map_to_python_classes(code, cls, base):
    with pytest.raises(mxq.Error) as info:
        _mxq._raise_error(code, "what: expected a, found b")
    error = info.value
    assert type(error) is cls and isinstance(error, base) and isinstance(error, RuntimeError)
    assert str(error) == "what: expected a, found b"
    assert error.code == code.replace(" error", "").replace(" ", "_").lower().replace("i/o", "io")


def test_library_error_carries_code():
    with pytest.raises(mxq.Error) as info:
        mxq.MoELayer.from_checkpoint("/nonexistent/checkpoint")
    assert info.value.code == "io" and "/nonexistent/checkpoint" in str(info.value)


@pytest.mark.torch
def test_torch_cpu_tensors_are_not_copied():
    import torch

    x = torch.randn(8, 64)
    assert _mxq._inspect_array(x)["data"] == x.data_ptr()
    xb = x.to(torch.bfloat16)
    assert _mxq._inspect_array(xb)["dtype"] == "bf16"
    got = formats.quantize_mxfp4(xb)
    want = formats.quantize_mxfp4(xb.float().numpy())
    assert np.array_equal(got[0], want[0])
    with pytest.raises(ValueError, match="^x: expected a C-contiguous"):
        formats.quantize_mxfp4(x.t())


@pytest.mark.cuda
def test_torch_cuda_tensor_on_host_op_is_value_error():
    import torch

    x = torch.randn(8, 64, device="cuda")
    assert _mxq._inspect_array(x)["data"] == x.data_ptr()
    with pytest.raises(ValueError, match="^x: expected a host"):
        formats.quantize_mxfp4(x)


def test_empty_arrays_are_contiguous():
    """An array with a zero extent has no element to address: whatever strides its exporter
    gives, it is accepted (as the torch ops accept empty tensors)."""
    blocks, scales = formats.quantize_mxfp4(np.ones((0, 64), np.float32))
    assert blocks.shape == (0, 2, 16) and scales.shape == (0, 2)


def test_reversed_views_are_named_as_not_contiguous():
    with pytest.raises(ValueError, match=r"^x: expected a C-contiguous .*strides \[64, -1\]"):
        formats.quantize_mxfp4(np.ones((1, 64), np.float32)[:, ::-1])



def _raise(call):
    with pytest.raises(mxq.Error) as info:
        call()
    return info.value


@pytest.mark.parametrize("call,cls,code,message", [
    (lambda: formats.quantize_mxfp4([[1.0] * 32]), mxq.DtypeError, "dtype_mismatch",
     "x: expected an array"),
    (lambda: formats.quantize_mxfp4(np.ones((2, 32), np.float64)), mxq.DtypeError,
     "dtype_mismatch", "x: expected f32 or bf16"),
    (lambda: formats.quantize_fp8_block(np.ones(8, np.float32), (1, 8)),
     mxq.InvalidArgumentError, "shape_mismatch", "x: expected 2 dimensions"),
    (lambda: formats.quantize_mxfp4(np.ones((4, 64), np.float32)[:, ::2]),
     mxq.InvalidArgumentError, "invalid_argument", "x: expected a C-contiguous"),
    (lambda: formats.quantize_mxfp4(FakeCudaArray()), mxq.InvalidArgumentError,
     "device_mismatch", "x: expected a host (CPU) array"),
    (lambda: mxq.BlockShape.parse(1.5), mxq.DtypeError, "dtype_mismatch",
     "block: expected a BlockShape"),
    (lambda: mxq.autotune(mode="sometimes"), mxq.InvalidArgumentError, "invalid_argument",
     "mode: expected one of"),
    (lambda: mxq.autotune(device="tpu"), mxq.InvalidArgumentError, "invalid_argument",
     "device: expected"),
])
def test_boundary_errors_are_mxq_errors_with_a_code(call, cls, code, message):
    """Every argument error mxq raises, from the array bridge or from Python, is an mxq.Error
    with its code, and still the builtin ValueError / TypeError that ordinary handlers catch."""
    error = _raise(call)
    assert type(error) is cls and error.code == code and str(error).startswith(message)
    assert isinstance(error, TypeError if cls is mxq.DtypeError else ValueError)


def test_block_shape_compares_unequal_to_other_things():
    block = mxq.BlockShape(128, 128)
    assert block == (128, 128) and block == "128x128"
    assert not block == None  # noqa: E711 (the comparison itself is under test)
    assert block != None  # noqa: E711
    assert block != 3 and block != (128,) and block != "dog"
    assert None != block  # noqa: E711
