"""Element types: DType, the table of the eight the engine supports, and conversions.

A DType wraps a NumPy dtype (CuPy uses the same ones); `to_dtype` accepts what a user may
write (a DType, 'float32', float, np.float32), `result_type` follows NumPy's promotion.
"""

from __future__ import annotations

import numpy as np


class DType:
    """An element type: a name, an item size and whether it is floating point."""

    __slots__ = ("name", "np", "itemsize", "is_floating_point")

    def __init__(self, name: str, np_dtype) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.itemsize = self.np.itemsize
        self.is_floating_point = self.np.kind == "f"

    def __repr__(self) -> str:
        return f"tinygrad_attn.{self.name}"

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))


float16 = DType("float16", np.float16)
float32 = DType("float32", np.float32)
float64 = DType("float64", np.float64)
int32 = DType("int32", np.int32)
int64 = DType("int64", np.int64)
int8 = DType("int8", np.int8)
uint8 = DType("uint8", np.uint8)
bool_ = DType("bool", np.bool_)
DTYPES = (float16, float32, float64, int8, uint8, int32, int64, bool_)
_BY_NP = {d.np: d for d in DTYPES}
_BY_NAME = {d.name: d for d in DTYPES}


def _dtype_by_name(name: str) -> DType:
    return _BY_NAME[name]


def to_dtype(x) -> DType:
    """A DType from a DType, a name ('float32'), a Python type or a NumPy/CuPy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    if x is float:
        return float32
    if x is int:
        return int64
    if x is bool:
        return bool_
    try:
        return _BY_NP[np.dtype(x)]
    except (TypeError, KeyError):
        raise TypeError(f"unsupported dtype {x!r}; use one of {[d.name for d in DTYPES]}") from None


def dtype_of(arr) -> DType:
    try:
        return _BY_NP[arr.dtype]
    except KeyError:
        raise TypeError(f"unsupported array dtype {arr.dtype}") from None


def result_type(*dtypes: DType) -> DType:
    return _BY_NP[np.result_type(*(d.np for d in dtypes))]
