"""RecordedArray: the NumPy API over a tensor, each call recorded as an engine op.

A backward under create_graph=True runs its first-order text unchanged (docs/design.md,
"Second derivatives"): where it computes `xp.where(B == 0, 0, G * B * A ** (B - 1))` on
arrays, `G`, `A` and `B` are RecordedArrays, and NumPy's dispatch protocols
(backend/protocol.py) bring each ufunc and array function here, where it becomes the engine
op of the same meaning on the tensors behind them: `multiply` is `Mul`, `where` is `where`,
`sum(axis, keepdims)` is `sum(dim, keepdim)`. The result is the backward's value with a
graph, which the next backward differentiates by the same means (to any order).

What a derivative does not flow through (comparisons, `sign`, `floor`, index arithmetic) is
computed on the plain arrays and returned as a plain array: a constant. Anything with no
recorded meaning here (a compiled kernel, `np.add.at` into a plain buffer, `np.asarray`)
raises, naming the backward and the call: a silent conversion would drop the graph.
"""

from __future__ import annotations

from .. import backend
from ..autograd import graph
from ..backend import protocol
from ..memory import state as ledger_state
from ..tensor import Tensor, from_array


class _plain:
    """Inside: ops called on plain tensors return plain tensors (not proxies)."""

    __slots__ = ("prev",)

    def __enter__(self):
        self.prev = graph.recording_state.on
        graph.recording_state.on = False

    def __exit__(self, *exc):
        graph.recording_state.on = self.prev


def _ops():
    from .. import ops

    return ops


def _tensor(x, device=None):
    """An operand as the engine takes it: a tensor, or a Python number. A plain array is a
    constant of the backward (a mask, an index; no graph), put on `device` (the recorded
    operands' device) when it is elsewhere: a device module's function may hand NumPy's
    dispatch the host copy of its operand."""
    if type(x) is RecordedArray or type(x) is graph.Recorded:
        return x.t
    if type(x) is Tensor or isinstance(x, (bool, int, float)):
        return x
    if backend.is_array(x):
        t = from_array(x)
        return t if device is None or t.device == device else t.to(device)
    if hasattr(x, "dtype") and getattr(x, "shape", None) == ():  # a NumPy scalar
        return x.item()
    raise TypeError(f"recorded backward: unsupported operand {type(x).__name__}")


def _raw(x):
    """The plain array (or number) of an operand, for what no derivative flows through."""
    if type(x) is RecordedArray or type(x) is graph.Recorded:
        return x.t._array()
    if type(x) in (tuple, list):
        return type(x)(_raw(v) for v in x)
    return x


def _typing(x):
    """What NumPy's promotion sees of an operand: arrays by dtype, numbers as themselves."""
    if type(x) is RecordedArray or type(x) is graph.Recorded:
        return protocol.np_dtype(x.t.dtype.np)
    if backend.is_array(x):
        return x.dtype
    return x


def _result_dtype(inputs):
    """NumPy's result dtype for these operands (numbers weak, arrays strong, NEP 50)."""
    types = [_typing(x) for x in inputs]
    arrays = [t for t in types if not isinstance(t, (bool, int, float))]
    if not arrays:
        return None
    return protocol.result_type(*types)


def _as(t: Tensor, np_dtype) -> Tensor:
    """t in NumPy's result dtype (the first-order text's dtypes, kept exactly)."""
    if np_dtype is None or t.dtype.np == np_dtype:
        return t
    return t.to(backend.to_dtype(np_dtype))


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        return (axis,)
    return tuple(axis)


def _reduce(kind: str, a: Tensor, axis, keepdims, dtype=None) -> Tensor:
    axes = _axes(axis, a.ndim)
    if not axes:
        out = a
    elif kind == "sum":
        out = a.sum(dim=axes, keepdim=bool(keepdims))
    elif kind == "mean":
        out = a.mean(dim=axes, keepdim=bool(keepdims))
    elif kind == "amax":
        out = a.amax(dim=axes, keepdim=bool(keepdims))
    elif kind == "amin":
        out = a.amin(dim=axes, keepdim=bool(keepdims))
    else:  # prod: one axis at a time, the last first so that the numbers stay right
        out = a
        for ax in sorted((d % a.ndim for d in axes), reverse=True):
            out = out.prod(dim=ax, keepdim=bool(keepdims))
    if dtype is not None:
        out = out.to(backend.to_dtype(protocol.np_dtype(dtype)))
    return out


def _device(*xs):
    """The device of the first recorded operand (None if there is none)."""
    for x in xs:
        if type(x) is RecordedArray or type(x) is graph.Recorded:
            return x.t.device
    return None


def _where(cond, x, y):
    ops = _ops()
    c = _raw(cond)
    device = _device(x, y, cond)
    x, y = _tensor(x, device), _tensor(y, device)
    if type(x) is not Tensor and type(y) is not Tensor:
        return None
    if not backend.is_array(c):  # a Python or NumPy bool: one side, broadcast to the other
        pick, other = (x, y) if bool(c) else (y, x)
        if type(pick) is not Tensor:
            pick = other.new_full(tuple(other.shape), pick)
        return pick
    return ops.where(_tensor(c, device), x, y)


_UNARY = {
    "negative": lambda a: -a, "positive": lambda a: a, "conjugate": lambda a: a,
    "exp": lambda a: a.exp(), "exp2": lambda a: a.exp2(), "expm1": lambda a: a.expm1(),
    "log": lambda a: a.log(), "log1p": lambda a: a.log1p(), "log2": lambda a: a.log2(),
    "log10": lambda a: a.log10(), "sqrt": lambda a: a.sqrt(), "square": lambda a: a * a,
    "reciprocal": lambda a: 1 / a, "tanh": lambda a: a.tanh(), "sinh": lambda a: a.sinh(),
    "cosh": lambda a: a.cosh(), "sin": lambda a: a.sin(), "cos": lambda a: a.cos(),
    "tan": lambda a: a.tan(), "arcsin": lambda a: a.asin(), "arccos": lambda a: a.acos(),
    "arctan": lambda a: a.atan(), "arcsinh": lambda a: a.asinh(),
    "arccosh": lambda a: a.acosh(), "arctanh": lambda a: a.atanh(),
    # |a| as where(a >= 0, a, -a): a backward takes |x| for numerical stability inside a
    # smooth function (sigmoid as (1 or e) / (1 + e), e = exp(-|x|)), and there the
    # derivative at 0 is the chosen branch's, 1; abs's own (sign(0) = 0) would give a
    # wrong second derivative exactly at 0 (a Newton step from w = 0 saw a zero Hessian)
    "absolute": lambda a: _ops().where(a >= 0, a, -a),
    "fabs": lambda a: _ops().where(a >= 0, a, -a),
}
_BINARY = {
    "add": lambda a, b: a + b if type(a) is Tensor else b.__radd__(a),
    "subtract": lambda a, b: a - b if type(a) is Tensor else b.__rsub__(a),
    "multiply": lambda a, b: a * b if type(a) is Tensor else b.__rmul__(a),
    "divide": lambda a, b: a / b if type(a) is Tensor else b.__rtruediv__(a),
    "true_divide": lambda a, b: a / b if type(a) is Tensor else b.__rtruediv__(a),
    "power": lambda a, b: a ** b if type(a) is Tensor else b.__rpow__(a),
    "float_power": lambda a, b: a ** b if type(a) is Tensor else b.__rpow__(a),
    "matmul": lambda a, b: _ops().matmul(a, b),
    # max(a, b) as where(a >= b, a, b), for the reason |a| is where(a >= 0, a, -a): in a
    # backward's stable formula (softplus as max(x, 0) + log1p(exp(-|x|))) the derivative
    # at a tie is the chosen branch's; the maximum op's tie rule (half to each side) would
    # give softplus''(0) and mish''(0) half their values
    "maximum": lambda a, b: _ops().where(_ge(a, b), *_both(a, b)),
    "minimum": lambda a, b: _ops().where(_ge(b, a), *_both(a, b)),
    "fmax": lambda a, b: _ops().where(_ge(a, b), *_both(a, b)),
    "fmin": lambda a, b: _ops().where(_ge(b, a), *_both(a, b)),
    "arctan2": lambda a, b: _ops().atan2(*_both(a, b)),
    "hypot": lambda a, b: _ops().hypot(*_both(a, b)),
    "logaddexp": lambda a, b: _ops().logaddexp(*_both(a, b)),
}
# elementwise functions whose derivative is zero (or that are not differentiable): computed
# on the plain arrays, a constant of the recorded backward
_CONSTANT_UFUNCS = {
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
    "logical_or", "logical_not", "logical_xor", "isfinite", "isnan", "isinf", "signbit",
    "sign", "floor", "ceil", "trunc", "rint", "floor_divide", "bitwise_and", "bitwise_or",
    "bitwise_xor", "invert", "right_shift", "left_shift", "heaviside", "spacing",
}
_CONSTANT_FUNCTIONS = {
    "argmax", "argmin", "argsort", "argwhere", "nonzero", "flatnonzero", "count_nonzero",
    "any", "all", "isclose", "allclose", "array_equal", "shape", "ndim", "size",
    "result_type", "searchsorted", "unravel_index", "ravel_multi_index", "iscomplexobj",
    "isrealobj", "isreal", "iscomplex", "sign", "may_share_memory", "shares_memory",
    "unique", "bincount", "digitize",
}


def _ge(a, b):
    """a >= b as a bool tensor (a constant: no derivative flows through a comparison)."""
    a, b = _both(a, b)
    return (a.detach() >= b.detach())


def _both(a, b):
    """Two operands for an op that takes tensors on both sides."""
    if type(a) is not Tensor:
        a = b.new_tensor(a) if not isinstance(a, Tensor) else a
    if type(b) is not Tensor:
        b = a.new_tensor(b)
    return a, b


def _like(shape, dtype, device):
    return backend.xp_for(device).zeros(shape, dtype=dtype)


class RecordedArray(protocol.ArrayProtocol, graph.TensorHolder):
    """An array of a recorded backward: the NumPy API, recorded (module docstring)."""

    __slots__ = ("t",)

    def __init__(self, t: Tensor):
        self.t = t

    def _as_recorded(self):
        return graph.Recorded(self.t)

    def _xp(self):
        """The array module of this array's device, for what is computed on plain arrays."""
        return backend.xp_for(self.t.device)

    def _refuse(self, what: str) -> RuntimeError:
        op = ledger_state.local.labels.get("op") or "a backward"
        return RuntimeError(
            f"{op}: {what} of an array of shape {tuple(self.t.shape)} recorded for the next "
            "derivative (create_graph=True) has no recorded meaning; the backward needs a "
            "formula the recorded path can follow (docs/adding-an-op.md, 'Double backward')"
        )

    # -- NumPy's hooks ---------------------------------------------------------------------
    def _ufunc(self, name, ufunc, method, inputs, kwargs):
        out = kwargs.pop("out", None)
        if name in _CONSTANT_UFUNCS:
            if out is not None:
                kwargs["out"] = tuple(_raw(o) for o in out)
            own = getattr(self._xp(), name, ufunc)  # the device's own (CuPy's on a GPU)
            return getattr(own, method)(*_raw(list(inputs)), **kwargs)
        if kwargs.get("dtype") is None:
            kwargs.pop("dtype", None)
        if kwargs.pop("casting", "same_kind") != "same_kind" or kwargs:
            raise self._refuse(f"numpy.{name} with {sorted(kwargs)}")
        if method == "__call__":
            result = self._call(name, inputs)
        elif method == "reduce" and name in ("add", "maximum", "minimum", "multiply"):
            result = self._reduce_ufunc(name, inputs)
        elif method == "accumulate" and name in ("add", "multiply"):
            with _plain():
                a = _tensor(inputs[0])
                axis = inputs[1] if len(inputs) > 1 else 0
                result = RecordedArray(a.cumsum(axis) if name == "add" else a.cumprod(axis))
        else:
            raise self._refuse(f"numpy.{name}.{method}")
        if out is not None:
            return self._into(out, result, name)
        return result

    def _call(self, name, inputs):
        if not any(type(x) is RecordedArray or type(x) is graph.Recorded for x in inputs):
            raise self._refuse(f"numpy.{name} of no recorded operand")
        with _plain():
            dtype = _result_dtype(inputs)
            device = _device(*inputs)
            if name in _UNARY and len(inputs) == 1:
                return RecordedArray(_as(_UNARY[name](_tensor(inputs[0])), dtype))
            if name in _BINARY and len(inputs) == 2:
                a, b = _tensor(inputs[0], device), _tensor(inputs[1], device)
                return RecordedArray(_as(_BINARY[name](a, b), dtype))
            if name in ("remainder", "fmod") and len(inputs) == 2:
                # a - b * k with k = floor(a / b) (trunc for fmod), which has no derivative
                xp = self._xp()
                q = xp.true_divide(_raw(inputs[0]), _raw(inputs[1]))
                k = xp.floor(q) if name == "remainder" else xp.trunc(q)
                a, b = _tensor(inputs[0]), _tensor(inputs[1])
                k = _tensor(k, device)
                return RecordedArray(_as(a - _BINARY["multiply"](b, k), dtype))
            if name == "copysign" and len(inputs) == 2 and not _is_recorded(inputs[0]):
                return self._xp().copysign(*_raw(list(inputs)))  # no derivative in b
            if name == "copysign" and len(inputs) == 2:
                sign = self._xp().copysign(1.0, _raw(inputs[1]))  # +-1: no derivative in b
                a = _tensor(inputs[0])
                return RecordedArray(_as(a.abs() * _tensor(sign, device), dtype))
        raise self._refuse(f"numpy.{name}")

    def _reduce_ufunc(self, name, inputs):
        axis = inputs[1] if len(inputs) > 1 else 0
        kind = {"add": "sum", "maximum": "amax", "minimum": "amin", "multiply": "prod"}[name]
        with _plain():
            return RecordedArray(_reduce(kind, _tensor(inputs[0]), axis, False))

    def _into(self, out, result, name):
        """out=(x,): only into a RecordedArray, which then holds the result."""
        target = out[0] if type(out) is tuple else out
        if type(target) is not RecordedArray:
            raise self._refuse(f"numpy.{name}(..., out=<a plain array>)")
        target.t = result.t if type(result) is RecordedArray else from_array(result)
        return target

    def _function(self, name, func, args, kwargs):
        impl = _FUNCTIONS.get(name)
        if impl is not None:
            with _plain():
                result = impl(*args, **kwargs)
            if result is not NotImplemented:
                return _rewrap(result)
        if name in _CONSTANT_FUNCTIONS:
            own = getattr(self._xp(), name, func)
            return own(*_raw(list(args)), **{k: _raw(v) for k, v in kwargs.items()})
        raise self._refuse(f"numpy.{name}")

    # -- the ndarray attributes a backward reads ------------------------------------------
    @property
    def shape(self):
        return tuple(self.t.shape)

    @property
    def ndim(self):
        return self.t.ndim

    @property
    def size(self):
        return self.t.numel()

    @property
    def dtype(self):
        return protocol.np_dtype(self.t.dtype.np)

    @property
    def itemsize(self):
        return self.t.element_size()

    @property
    def nbytes(self):
        return self.t.numel() * self.t.element_size()

    @property
    def T(self):
        return self.transpose()

    @property
    def mT(self):
        return self.swapaxes(-1, -2)

    def __repr__(self):
        return f"RecordedArray({self.t!r})"

    def item(self):
        return self.t.item()

    def tolist(self):
        return self.t.tolist()

    # -- the ndarray methods a backward calls ---------------------------------------------
    def astype(self, dtype, copy=True, **_):
        with _plain():
            target = backend.to_dtype(protocol.np_dtype(dtype))
            return RecordedArray(self.t.to(target) if target is not self.t.dtype
                                 else (self.t.clone() if copy else self.t))

    def reshape(self, *shape, order="C"):
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        with _plain():
            return RecordedArray(self.t.reshape(tuple(shape)))

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else axes
        if not axes:
            axes = tuple(reversed(range(self.t.ndim)))
        with _plain():
            return RecordedArray(self.t.permute(tuple(axes)))

    def swapaxes(self, a, b):
        with _plain():
            return RecordedArray(self.t.transpose(a, b))

    def sum(self, axis=None, dtype=None, out=None, keepdims=False, **_):
        with _plain():
            return RecordedArray(_reduce("sum", self.t, axis, keepdims, dtype))

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, **_):
        with _plain():
            return RecordedArray(_reduce("mean", self.t, axis, keepdims, dtype))

    def max(self, axis=None, out=None, keepdims=False, **_):
        with _plain():
            return RecordedArray(_reduce("amax", self.t, axis, keepdims))

    def min(self, axis=None, out=None, keepdims=False, **_):
        with _plain():
            return RecordedArray(_reduce("amin", self.t, axis, keepdims))

    def prod(self, axis=None, dtype=None, out=None, keepdims=False, **_):
        with _plain():
            return RecordedArray(_reduce("prod", self.t, axis, keepdims, dtype))

    def cumsum(self, axis=None, dtype=None, out=None):
        with _plain():
            t = self.t.reshape(-1) if axis is None else self.t
            return RecordedArray(t.cumsum(0 if axis is None else axis))

    def copy(self, order="C"):
        with _plain():
            return RecordedArray(self.t.clone())

    def ravel(self, order="C"):
        return self.reshape(-1)

    flatten = ravel

    def squeeze(self, axis=None):
        with _plain():
            if axis is None:
                return RecordedArray(self.t.squeeze())
            return RecordedArray(self.t.squeeze(axis))

    def clip(self, min=None, max=None, **_):  # noqa: A002 - NumPy's names
        return _FUNCTIONS["clip"](self, min, max)

    def erf(self):
        """The engine's erf (the reference kernels' erf of a recorded array)."""
        with _plain():
            return RecordedArray(self.t.erf())

    def dot(self, other):
        return _FUNCTIONS["dot"](self, other)

    def argmax(self, *a, **k):  # the plain array's answers (no derivative flows)
        return self.t._array().argmax(*a, **k)

    def argmin(self, *a, **k):
        return self.t._array().argmin(*a, **k)

    def any(self, *a, **k):
        return self.t._array().any(*a, **k)

    def all(self, *a, **k):
        return self.t._array().all(*a, **k)

    def nonzero(self):
        return self.t._array().nonzero()

    def __getitem__(self, index):
        with _plain():
            return RecordedArray(self.t[_index(index)])

    def __setitem__(self, index, value):
        """x[index] = value: x becomes a new recorded tensor (the one it held is untouched:
        a recorded backward never writes into a tensor another node may have saved)."""
        with _plain():
            new = self.t.clone()
            v = _tensor(value)
            new[_index(index)] = v
            self.t = new


def _operator(name: str, reflected: bool = False, inplace: bool = False):
    """A Python operator of RecordedArray, straight to the recorded ufunc (not through
    NumPy's dispatch, which refuses a CuPy operand: a constant of a backward on a GPU)."""
    def method(self, other):
        inputs = (other, self) if reflected else (self, other)
        if name in _CONSTANT_UFUNCS:
            return getattr(self._xp(), name)(*_raw(list(inputs)))
        result = self._call(name, inputs)
        if inplace:  # x += y: x holds the recorded sum (no tensor is written)
            self.t = result.t
            return self
        return result

    method.__name__ = name
    return method


for _op, _ufunc in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                    ("truediv", "divide"), ("pow", "power"), ("matmul", "matmul"),
                    ("mod", "remainder"), ("floordiv", "floor_divide"), ("lt", "less"),
                    ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                    ("eq", "equal"), ("ne", "not_equal"), ("and", "bitwise_and"),
                    ("or", "bitwise_or"), ("xor", "bitwise_xor")):
    setattr(RecordedArray, f"__{_op}__", _operator(_ufunc))
    if _op not in ("lt", "le", "gt", "ge", "eq", "ne"):
        setattr(RecordedArray, f"__r{_op}__", _operator(_ufunc, reflected=True))
        setattr(RecordedArray, f"__i{_op}__", _operator(_ufunc, inplace=True))
RecordedArray.__neg__ = lambda self: self._call("negative", (self,))
RecordedArray.__pos__ = lambda self: self
RecordedArray.__abs__ = lambda self: self._call("absolute", (self,))
RecordedArray.__hash__ = None
del _op, _ufunc


def _index(index):
    """An ndarray index as the engine takes it (index arrays become tensors)."""
    if type(index) is tuple:
        return tuple(_index(i) for i in index)
    if type(index) is RecordedArray:
        return index.t.detach()
    if backend.is_array(index):
        return from_array(index)
    return index


def _rewrap(result):
    if type(result) is Tensor:
        return RecordedArray(result)
    if type(result) in (tuple, list):
        return type(result)(_rewrap(r) for r in result)
    return result


# ----------------------------------------------------------------------------- functions
def _f_sum(a, axis=None, dtype=None, out=None, keepdims=False, **_):
    return _reduce("sum", _tensor(a), axis, keepdims, dtype)


def _f_mean(a, axis=None, dtype=None, out=None, keepdims=False, **_):
    return _reduce("mean", _tensor(a), axis, keepdims, dtype)


def _f_amax(a, axis=None, out=None, keepdims=False, **_):
    return _reduce("amax", _tensor(a), axis, keepdims)


def _f_amin(a, axis=None, out=None, keepdims=False, **_):
    return _reduce("amin", _tensor(a), axis, keepdims)


def _f_prod(a, axis=None, dtype=None, out=None, keepdims=False, **_):
    return _reduce("prod", _tensor(a), axis, keepdims, dtype)


def _f_where(cond, x=None, y=None):
    if x is None and y is None:
        return NotImplemented
    out = _where(cond, x, y)
    return NotImplemented if out is None else out


def _f_reshape(a, shape=None, order="C", newshape=None):
    return _tensor(a).reshape(tuple(shape if shape is not None else newshape)
                              if not isinstance(shape, int) else (shape,))


def _f_transpose(a, axes=None):
    t = _tensor(a)
    return t.permute(tuple(axes) if axes is not None else tuple(reversed(range(t.ndim))))


def _f_moveaxis(a, source, destination):
    return _tensor(a).movedim(source, destination)


def _f_expand_dims(a, axis):
    t = _tensor(a)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    nd = t.ndim + len(axes)
    for ax in sorted(d % nd for d in axes):
        t = t.unsqueeze(ax)
    return t


def _f_squeeze(a, axis=None):
    t = _tensor(a)
    return t.squeeze() if axis is None else t.squeeze(axis)


def _f_broadcast_to(a, shape, subok=False):
    t = _tensor(a)
    if type(t) is not Tensor:
        return NotImplemented
    return t.expand(tuple(shape) if not isinstance(shape, int) else (shape,))


def _f_concatenate(arrays, axis=0, out=None, **_):
    ts = [_tensor(a) for a in arrays]
    if axis is None:
        ts, axis = [t.reshape(-1) for t in ts], 0
    return _ops().cat(ts, axis)


def _f_stack(arrays, axis=0, out=None, **_):
    return _ops().stack([_tensor(a) for a in arrays], axis)


def _f_flip(m, axis=None):
    t = _tensor(m)
    return t.flip(_axes(axis, t.ndim))


def _f_take_along_axis(arr, indices, axis):
    t = _tensor(arr)
    idx = from_array(_raw(indices)) if backend.is_array(_raw(indices)) else _tensor(indices)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return t.take_along_dim(idx, axis)


def _f_clip(a, a_min=None, a_max=None, out=None, **kw):
    a_min = kw.get("min", a_min)
    a_max = kw.get("max", a_max)
    t = _tensor(a)
    lo = from_array(a_min) if backend.is_array(a_min) else _tensor(a_min) if a_min is not None \
        else None
    hi = from_array(a_max) if backend.is_array(a_max) else _tensor(a_max) if a_max is not None \
        else None
    return t.clamp(lo, hi)


def _f_tril(m, k=0):
    return _tensor(m).tril(k)


def _f_triu(m, k=0):
    return _tensor(m).triu(k)


def _f_diagonal(a, offset=0, axis1=0, axis2=1):
    return _tensor(a).diagonal(offset, axis1, axis2)


def _f_swapaxes(a, axis1, axis2):
    return _tensor(a).transpose(axis1, axis2)


def _f_ascontiguousarray(a, dtype=None, **_):
    t = _tensor(a)
    return t if dtype is None else t.to(backend.to_dtype(protocol.np_dtype(dtype)))


def _f_copy(a, order="K", **_):
    return _tensor(a).clone()


def _f_like(kind):
    def like(a, *args, dtype=None, shape=None, **_):
        t = _tensor(a)
        shp = tuple(t.shape) if shape is None else shape
        dt = t.dtype.np if dtype is None else protocol.np_dtype(dtype)
        xp = backend.xp_for(t.device)
        if kind == "full":
            return xp.full(shp, args[0] if args else _["fill_value"], dtype=dt)
        return {"zeros": xp.zeros, "ones": xp.ones, "empty": xp.zeros}[kind](shp, dtype=dt)
    return like


def _f_matmul(a, b, **_):
    return _ops().matmul(_tensor(a), _tensor(b))


def _f_dot(a, b, out=None):
    a, b = _tensor(a), _tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    if b.ndim == 1:
        return _ops().matmul(a, b)
    return _ops().tensordot(a, b, ([a.ndim - 1], [b.ndim - 2])) if hasattr(_ops(), "tensordot") \
        else _ops().matmul(a, b)


def _f_einsum(subscripts, *operands, **_):
    return _ops().einsum(subscripts, *[_tensor(o) for o in operands])


def _f_outer(a, b, out=None):
    return _ops().outer(_tensor(a).reshape(-1), _tensor(b).reshape(-1))


def _f_cumsum(a, axis=None, dtype=None, out=None):
    t = _tensor(a)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return t.cumsum(axis)


def _f_cumprod(a, axis=None, dtype=None, out=None):
    t = _tensor(a)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return t.cumprod(axis)


def _f_ravel(a, order="C"):
    return _tensor(a).reshape(-1)


def _f_tile(a, reps):
    return _tensor(a).tile(tuple(reps) if not isinstance(reps, int) else (reps,))


def _f_repeat(a, repeats, axis=None):
    t = _tensor(a)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return t.repeat_interleave(repeats, axis)


def _f_roll(a, shift, axis=None):
    return _tensor(a).roll(shift, axis)


def _f_split(ary, indices_or_sections, axis=0):
    t = _tensor(ary)
    n = t.shape[axis]
    if isinstance(indices_or_sections, int):
        size = n // indices_or_sections
        return list(t.split(size, axis))
    bounds = [0, *indices_or_sections, n]
    return [t.narrow(axis, lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]


def _f_pad(array, pad_width, mode="constant", constant_values=0, **_):
    if mode != "constant":
        return NotImplemented
    t = _tensor(array)
    pw = protocol.pad_width(pad_width, t.ndim)
    flat = []
    for lo, hi in reversed(pw):
        flat += [lo, hi]
    return _ops().pad(t, tuple(flat), value=constant_values)


def _f_nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    return _tensor(x).nan_to_num(nan, posinf, neginf)


def _f_abs(x, *a, **k):
    return _UNARY["absolute"](_tensor(x))


def _f_copyto(dst, src, casting="same_kind", where=True):
    """np.copyto into a recorded array: it then holds where(where, src, dst), a new recorded
    tensor (the one it held is untouched); into a plain array: refused."""
    if type(dst) is not RecordedArray:
        return NotImplemented
    shape = tuple(dst.t.shape)
    new = _as(_where(where, src, dst), dst.t.dtype.np)
    dst.t = new if tuple(new.shape) == shape else new.expand(shape)


_FUNCTIONS = {
    "sum": _f_sum, "mean": _f_mean, "amax": _f_amax, "max": _f_amax, "amin": _f_amin,
    "min": _f_amin, "prod": _f_prod, "where": _f_where, "reshape": _f_reshape,
    "transpose": _f_transpose, "moveaxis": _f_moveaxis, "expand_dims": _f_expand_dims,
    "squeeze": _f_squeeze, "broadcast_to": _f_broadcast_to, "concatenate": _f_concatenate,
    "stack": _f_stack, "flip": _f_flip, "take_along_axis": _f_take_along_axis,
    "clip": _f_clip, "tril": _f_tril, "triu": _f_triu, "diagonal": _f_diagonal,
    "swapaxes": _f_swapaxes, "ascontiguousarray": _f_ascontiguousarray, "copy": _f_copy,
    "zeros_like": _f_like("zeros"), "ones_like": _f_like("ones"),
    "empty_like": _f_like("empty"), "full_like": _f_like("full"), "matmul": _f_matmul,
    "dot": _f_dot, "einsum": _f_einsum, "outer": _f_outer, "cumsum": _f_cumsum,
    "cumprod": _f_cumprod, "ravel": _f_ravel, "tile": _f_tile, "repeat": _f_repeat,
    "roll": _f_roll, "split": _f_split, "pad": _f_pad, "nan_to_num": _f_nan_to_num,
    "absolute": _f_abs, "copyto": _f_copyto,
}
"""numpy function name -> its recorded implementation (returns a Tensor, a list of them,
a plain array for a constant, or NotImplemented to refuse)."""


# ----------------------------------------------------------------------------- idioms
# The NumPy idioms a backward writes into a buffer it made (np.add.at, put_along_axis, a
# ufunc's out=). On plain arrays each of these writes in place and returns the buffer, the
# first-order path's memory exactly; on a recorded operand it returns the recorded result
# instead, so a backward that assigns what they return (`gx = add_at(gx, index, G)`) is
# one text for both paths.
def _is_recorded(*xs) -> bool:
    return any(type(x) is RecordedArray or type(x) is graph.Recorded for x in xs)


def add_at(target, index, values):
    """target[index] += values with repeated indices summed (np.add.at); returns target,
    or, when target or values is recorded, the recorded sum."""
    if not _is_recorded(target, values):
        backend.kernels.scatter_add(target, index, values)
        return target
    with _plain():
        t = _tensor(target)
        if type(t) is not Tensor:
            t = from_array(t)
        xp = backend.xp_for(t.device)
        positions = xp.arange(t.numel()).reshape(tuple(t.shape))[_raw(index)]
        v = _tensor(values)
        if type(v) is not Tensor:
            v = from_array(xp.asarray(v, dtype=t.dtype.np))
        v = v.expand(positions.shape) if tuple(v.shape) != positions.shape else v
        flat = t.reshape(-1).index_add(0, from_array(positions.reshape(-1)), v.reshape(-1))
        return RecordedArray(flat.reshape(tuple(t.shape)))


def put_along_axis(arr, indices, values, axis):
    """np.put_along_axis that returns the array (recorded: a new one; plain: in place)."""
    if not _is_recorded(arr, values):
        backend.xp_for(backend.device_of(arr)).put_along_axis(arr, indices, values, axis)
        return arr
    with _plain():
        t = _tensor(arr)
        if type(t) is not Tensor:
            t = from_array(t)
        v = _tensor(values)
        idx = from_array(_raw(indices))
        v = v.expand(tuple(idx.shape)) if type(v) is Tensor and tuple(v.shape) != tuple(
            idx.shape) else v
        return RecordedArray(t.scatter(axis, idx, v))


def ufunc_out(ufunc, *inputs, out):
    """ufunc(*inputs, out=out), returning out; recorded operands give the recorded result
    (out untouched), so that `gx = ufunc_out(xp.multiply, g, y, out=gx)` serves both."""
    if not _is_recorded(*inputs):
        return ufunc(*inputs, out=out)
    return ufunc(*inputs)


def constant(arr):
    """A plain array (a mask, a count, a divisor) that a backward combines with its
    gradient: as it is, or in a recorded backward a RecordedArray with no graph (no
    derivative flows into it), so that NumPy's calls that mix it with recorded arrays
    dispatch to the recorded side on every device (a CuPy array refuses NumPy's ufuncs
    before the recorded operand is asked) and it stays on its device."""
    return RecordedArray(from_array(arr)) if graph.recording_state.on else arr


class _RecordedModule:
    """A device's array module for a recorded backward (create_graph): a call with a
    recorded operand goes to NumPy's function of that name, with the device arrays among
    its operands (the backward's masks and counts) as recorded constants, so that NumPy's
    dispatch hands the whole call to the recorded arrays; CuPy's own functions take no
    recorded operand. A call with none, and every attribute, is the module's own."""

    __slots__ = ("xp",)

    def __init__(self, xp):
        self.xp = xp

    def __getattr__(self, name):
        own = getattr(self.xp, name)
        if not callable(own) or isinstance(own, type):
            return own

        def call(*args, **kwargs):
            if not _any_recorded(args) and not _any_recorded(kwargs.values()):
                return own(*args, **kwargs)
            return getattr(backend.xp_for("cpu"), name)(
                *[_as_constant(a) for a in args],
                **{k: _as_constant(v) for k, v in kwargs.items()})

        return call


def _any_recorded(args) -> bool:
    return any(_is_recorded(a) or (type(a) in (tuple, list) and _is_recorded(*a))
               for a in args)


def _as_constant(a):
    """A device array as a recorded constant (no graph); anything else as it is."""
    if type(a) in (tuple, list):
        return type(a)(_as_constant(v) for v in a)
    return constant(a) if backend.is_array(a) else a


def backward_xp(device):
    """The array module a backward computes with on `device`: its own, or, recording
    (create_graph) off the CPU, one that records calls on recorded arrays
    (_RecordedModule). On the CPU NumPy's dispatch already does."""
    xp = backend.xp_for(device)
    if not graph.recording_state.on or xp is backend.xp_for("cpu"):
        return xp
    return _RecordedModule(xp)


graph.recorded_array = RecordedArray
