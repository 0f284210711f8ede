"""Python exception classes for mxq::Error (the C++ library's one exception type).

Every mxq error is an :class:`Error` (a ``RuntimeError``) with a ``code`` naming its
``mxq::ErrorCode``. Errors about an argument are also ``ValueError`` (bad value, shape, range,
device) or ``TypeError`` (wrong dtype), so ordinary Python handlers catch them.
"""

from __future__ import annotations


class Error(RuntimeError):
    """An error raised by mxq's C++ core; ``code`` is the mxq::ErrorCode, e.g. "io"."""

    code: str = "internal"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgumentError(Error, ValueError):
    """An argument's value, shape, range or device is not acceptable."""

    code = "invalid_argument"


class DtypeError(Error, TypeError):
    """An argument has the wrong element type (or is not an array at all)."""

    code = "dtype_mismatch"


# mxq::to_string(ErrorCode) -> (Python code, class). One table, in ErrorCode order.
_CODES = {
    "invalid argument": ("invalid_argument", InvalidArgumentError),
    "shape mismatch": ("shape_mismatch", InvalidArgumentError),
    "dtype mismatch": ("dtype_mismatch", DtypeError),
    "device mismatch": ("device_mismatch", InvalidArgumentError),
    "out of range": ("out_of_range", InvalidArgumentError),
    "I/O error": ("io", Error),
    "format error": ("format", Error),
    "unsupported": ("unsupported", Error),
    "CUDA error": ("cuda", Error),
    "internal error": ("internal", Error),
}

CODES = tuple(code for code, _ in _CODES.values())


def from_code(cpp_code: str, message: str) -> Error:
    """The exception for a C++ error (called by the extension's exception translator)."""
    code, cls = _CODES.get(cpp_code, ("internal", Error))
    return cls(message, code)
