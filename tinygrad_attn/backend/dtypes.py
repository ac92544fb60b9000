"""Element types: DType, the table of the eight the engine supports, and conversions.

A DType wraps a NumPy dtype (CuPy uses the same ones); `to_dtype` accepts what a user may
write (a DType, 'float32', float, np.float32). Type promotion is torch's, not NumPy's:
`promote_types` is torch's pairwise table and `promote` the result dtype of an op over its
operands (docs/dtypes.md has both as tables). Every op asks `promote`; none asks NumPy.
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
int16 = DType("int16", np.int16)
int32 = DType("int32", np.int32)
int64 = DType("int64", np.int64)
int8 = DType("int8", np.int8)
uint8 = DType("uint8", np.uint8)
bool_ = DType("bool", np.bool_)
DTYPES = (float16, float32, float64, int8, uint8, int16, int32, int64, bool_)
_BY_NP = {d.np: d for d in DTYPES}
_BY_NAME = {d.name: d for d in DTYPES}


def _dtype_by_name(name: str) -> DType:
    return _BY_NAME[name]


class UnsupportedDType:
    """A torch dtype the engine names but does not implement: code that mentions it (a
    config table of dtypes, `dtype == ta.bfloat16`) imports and compares, and making a tensor
    of it raises a TypeError that names it (`to_dtype` refuses it)."""

    __slots__ = ("name", "itemsize", "is_floating_point", "reason")

    def __init__(self, name: str, itemsize: int, is_floating_point: bool, reason: str) -> None:
        self.name = name
        self.itemsize = itemsize
        self.is_floating_point = is_floating_point
        self.reason = reason

    def __repr__(self) -> str:
        return f"tinygrad_attn.{self.name}"

    def __reduce__(self):
        return (_unsupported_by_name, (self.name,))


bfloat16 = UnsupportedDType("bfloat16", 2, True, "NumPy, the engine's array library, has no "
                            "bfloat16 type")
_UNSUPPORTED = {bfloat16.name: bfloat16}


def _unsupported_by_name(name: str) -> UnsupportedDType:
    return _UNSUPPORTED[name]


def _refuse(d: UnsupportedDType):
    raise TypeError(f"dtype {d.name} is not supported by the engine ({d.reason}); use one of "
                    f"{[t.name for t in DTYPES]} (float32 or float16 in its place)")


def to_dtype(x) -> DType:
    """A DType from a DType, a name ('float32'), a Python type or a NumPy/CuPy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    if isinstance(x, UnsupportedDType) or (isinstance(x, str) and x in _UNSUPPORTED):
        _refuse(_UNSUPPORTED[x] if isinstance(x, str) else x)
    if x is float:
        return _default[0]
    if x is int:
        return int64
    if x is bool:
        return bool_
    try:
        return _BY_NP[np.dtype(x)]
    except (TypeError, KeyError):
        raise TypeError(f"unsupported dtype {x!r}; use one of {[d.name for d in DTYPES]}") from None


class finfo:  # noqa: N801 - torch's name
    """torch.finfo(dtype=default): the limits of a floating dtype (bits, eps, max, min, tiny,
    smallest_normal, resolution), as Python floats; `dtype` is its name."""

    def __init__(self, dtype=None) -> None:
        d = _default[0] if dtype is None else to_dtype(dtype)
        if not d.is_floating_point:
            raise TypeError(f"finfo: {d.name} is not a floating point dtype; use iinfo")
        info = np.finfo(d.np)
        self.bits, self.dtype = int(info.bits), d.name
        self.eps, self.max, self.min = float(info.eps), float(info.max), float(info.min)
        self.tiny = self.smallest_normal = float(info.tiny)
        self.resolution = 10.0 ** -int(info.precision)  # torch gives the decimal, unrounded

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution}, min={self.min}, max={self.max}, "
                f"eps={self.eps}, smallest_normal={self.smallest_normal}, tiny={self.tiny}, "
                f"dtype={self.dtype})")


class iinfo:  # noqa: N801 - torch's name
    """torch.iinfo(dtype): the limits of an integer dtype (bits, max, min)."""

    def __init__(self, dtype) -> None:
        d = to_dtype(dtype)
        if d.is_floating_point or d is bool_:
            raise TypeError(f"iinfo: {d.name} is not an integer dtype"
                            + ("; use finfo" if d.is_floating_point else ""))
        info = np.iinfo(d.np)
        self.bits, self.dtype = int(info.bits), d.name
        self.max, self.min = int(info.max), int(info.min)

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"


def dtype_of(arr) -> DType:
    try:
        return _BY_NP[arr.dtype]
    except KeyError:
        raise TypeError(f"unsupported array dtype {arr.dtype}") from None


_default = [float32]  # the default floating dtype: a list, so that it stays one object


def get_default_dtype() -> DType:
    """The dtype Python floats become (in creation and in promotion); float32 unless set."""
    return _default[0]


def set_default_dtype(dtype) -> None:
    """Make `dtype` (float32 or float64, as torch allows) the default floating dtype."""
    d = to_dtype(dtype)
    if d not in (float32, float64):
        raise TypeError(f"set_default_dtype: only float32 and float64 may be the default, got "
                        f"{d.name}")
    _default[0] = d


def category(dtype: DType) -> int:
    """0 bool, 1 integer, 2 floating: the order in which a higher category wins."""
    return 2 if dtype.is_floating_point else 0 if dtype is bool_ else 1


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types: the smallest dtype both a and b convert to without leaving
    their category. Unlike NumPy, a float wins over any integer whatever its size
    (int64 with float16 is float16), and uint8 with int8 is int16."""
    if a is b:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        return a if ca > cb else b
    if ca == 1 and (a is uint8 or b is uint8):
        signed = b if a is uint8 else a
        return int16 if signed is int8 else signed
    return a if a.itemsize >= b.itemsize else b


def _wrapped(value) -> DType:
    """The dtype a Python scalar counts as: bool, int64, or the default float."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int64
    if isinstance(value, float):
        return _default[0]
    raise TypeError(f"unsupported operand type {type(value).__name__} for a tensor op")


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    """torch's combine_categories: a lower-priority participant counts only when it is of a
    higher category (a float under an integer or a bool, anything under a bool)."""
    if higher is None:
        return lower
    if lower is None or higher.is_floating_point:
        return higher
    if higher is bool_ or lower.is_floating_point:
        return promote_types(higher, lower)
    return higher


def promote(*operands) -> DType:
    """The dtype of an op's result over its operands, as torch computes it.

    Each operand is a tensor (anything with a DType `.dtype` and an `.ndim`), a DType
    (counted as a dimensioned tensor), a Python bool/int/float, or None (ignored). Three
    tiers promote separately with `promote_types`: dimensioned tensors, 0-d tensors, Python
    scalars (a float counts as the default dtype); then a lower tier changes the result only
    when it is of a higher category (bool < integer < floating):

        promote(float32 tensor, 0.5) -> float32      promote(int64 tensor, 0.5) -> default
        promote(float32 (2,), float64 0-d) -> float32  promote(int8 (2,), int64 0-d) -> int8
        promote(float16 (2,), float32 0-d) -> float16  promote(bool (2,), 3) -> int64

    A result dtype is computed in directly: cast the operands to it before the array call
    (a 0-d float64 operand would otherwise make NumPy compute a float32 array in float64).
    """
    tiers: list[DType | None] = [None, None, None]  # dimensioned, 0-d, Python scalars
    for x in operands:
        if x is None:
            continue
        if isinstance(x, DType):
            tier, d = 0, x
        else:
            d = getattr(x, "dtype", None)
            if isinstance(d, DType) and hasattr(x, "ndim"):
                tier = 0 if x.ndim > 0 else 1
            else:
                tier, d = 2, _wrapped(x)
        known = tiers[tier]
        tiers[tier] = d if known is None or known is d else promote_types(known, d)
    if tiers[1] is None and tiers[2] is None:  # tensors only: no lower tier to weigh
        out = tiers[0]
    else:
        out = _combine(tiers[0], _combine(tiers[1], tiers[2]))
    if out is None:
        raise TypeError("promote: no operand to take a dtype from")
    return out


_INT64_MIN, _UINT64_END = -(1 << 63), 1 << 64


def scalar_as(value, dtype: DType):
    """A Python number operand as a NumPy scalar of the op's compute dtype, read as torch
    reads it: an int must fit in 64 bits ([-2**63, 2**64), else OverflowError, "int too big
    to convert") and then wraps into an integer dtype's width, two's complement (int8: 300
    is 44, 0xFFFFFFFF is -1 in int32), where NumPy would raise OverflowError. A float or a
    bool is converted as it is."""
    if type(value) is int:
        if not _INT64_MIN <= value < _UINT64_END:
            raise OverflowError(f"int too big to convert: {value} does not fit in 64 bits")
        kind = dtype.np.kind
        if kind in "iu":
            bits = 8 * dtype.itemsize
            value &= (1 << bits) - 1
            if kind == "i" and value >> (bits - 1):
                value -= 1 << bits
    return dtype.np.type(value)


_LIMITS: dict = {}  # dtype -> (lowest, highest) number a stored value may be
_INF = float("inf")


def _limits(dtype: DType) -> tuple:
    kind = dtype.np.kind
    if kind in "iu":
        info = np.iinfo(dtype.np)
        return (-int(info.max) if kind == "u" else int(info.min)), int(info.max)
    if kind == "f":
        top = float(np.finfo(dtype.np).max)
        return -top, top
    return -_INF, _INF


def checked_scalar(op: str, value, dtype: DType):
    """A Python number that an op stores into a tensor of `dtype` as a value (fill_,
    masked_fill_, setitem, clamp's bounds, full, add_'s alpha): unlike an arithmetic
    operand (scalar_as) it must fit, as torch checks it: RuntimeError "value cannot be
    converted to type ... without overflow". torch lets an unsigned dtype take -max..-1 too,
    wrapped (uint8: -1 is 255); infinities and nan fit every float dtype."""
    if type(value) is bool or not isinstance(value, (int, float)):
        return value
    limits = _LIMITS.get(dtype)
    if limits is None:
        limits = _LIMITS[dtype] = _limits(dtype)
    low, high = limits
    kind = dtype.np.kind
    # nan fits (numpy's cast decides); so do the infinities in a float dtype
    overflows = not low <= value <= high and not (kind == "f" and abs(value) == _INF)
    if overflows and value == value:
        raise RuntimeError(f"{op}: value {value} cannot be converted to type {dtype.name} "
                           "without overflow")
    if kind in "iu" and isinstance(value, float):
        return dtype.np.type(int(value)) if value == value else dtype.np.type(value)
    return scalar_as(value, dtype)


def floating(dtype: DType) -> DType:
    """The result dtype of a floating op (exp, sqrt, true division) on `dtype`: itself if
    floating, otherwise the default dtype (as torch: an int tensor's exp is float32)."""
    return dtype if dtype.is_floating_point else _default[0]


def accumulating(dtype: DType) -> DType:
    """The result dtype of a sum-like op (sum, prod, cumsum, cumprod) without a dtype=:
    a floating dtype stays, bool and every integer accumulate in int64 (as torch; NumPy
    would keep uint8 as uint64 and int32 as int32 on some platforms)."""
    return dtype if dtype.is_floating_point else int64


def errstate(**kwargs):
    """A context in which NumPy's floating-point warnings are set as `kwargs` say
    (np.errstate): torch computes log(0) = -inf and 0/0 = nan without a word, so the ops
    run their kernels under errstate(all="ignore"). CuPy never warns; the context only
    touches NumPy's state. Function.apply and the backward engine use the cheaper pair
    below for that one setting."""
    return np.errstate(**kwargs)


# NumPy 2 keeps a thread's floating-point error settings in one context variable, which
# np.errstate sets on entering and resets on leaving; building the settings object is most
# of its microsecond, paid twice per op (forward and backward). quiet_fp_errors sets the same
# variable to the same "ignore all" settings, built once per settings it replaces (their
# callback and buffer size carried over, as np.errstate(all="ignore") does), and skips the
# set when they are already in force (an op applied inside another op or inside a backward).
try:
    from numpy._core._ufunc_config import _extobj_contextvar as _fp_settings
    from numpy._core.umath import _make_extobj
except ImportError:  # pragma: no cover - another NumPy layout: np.errstate itself
    _fp_settings = None
_quiet_for = [(None, None)]  # (settings replaced last, their "ignore all" twin)


def quiet_fp_errors():
    """Make NumPy ignore floating-point errors in this thread, as errstate(all="ignore")
    does; returns the token `restore_fp_errors` takes to put the previous settings back
    (None when nothing changed). Call the pair in a try/finally."""
    if _fp_settings is None:  # pragma: no cover
        state = np.errstate(all="ignore")
        state.__enter__()
        return state
    current = _fp_settings.get()
    seen, quiet = _quiet_for[0]
    if current is quiet:
        return None
    if current is not seen:
        quiet = _make_extobj(all="ignore")  # from the settings in force: keeps their call
        _quiet_for[0] = (current, quiet)
    return _fp_settings.set(quiet)


def restore_fp_errors(token) -> None:
    """Undo quiet_fp_errors (its token)."""
    if token is None:
        return
    if _fp_settings is None:  # pragma: no cover
        token.__exit__(None, None, None)
        return
    _fp_settings.reset(token)


def result_type(*dtypes: DType) -> DType:
    """torch's promotion of dtypes of equal standing (a fold of `promote_types`)."""
    out = dtypes[0]
    for d in dtypes[1:]:
        out = promote_types(out, d)
    return out
