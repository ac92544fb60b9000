"""A test-only stand-in for CuPy, built on NumPy, that fails where CuPy fails.

CI has no GPU, so the code paths that only run on CuPy arrays would go untested. This module
is a `cupy` (plus the parts of `cupyx` the backend uses) whose arrays live in host memory but
behave like device arrays in the ways that catch mistakes:

* `FakeArray` is not a NumPy array: implicit conversion (`np.asarray(a)`, `np.exp(a)`,
  `np.add.at(a, ...)`, `float(np_func(a))`) raises TypeError, as it does for a CuPy array;
  mixing a FakeArray with a NumPy array in an operator or a function raises, as CuPy does.
* reductions and scalar indexing return 0-d FakeArrays (CuPy returns 0-d device arrays,
  never NumPy scalars); `.item()`, `float()`, `int()`, `bool()`, `.tolist()`, `.get()` and
  `cupy.asnumpy` work, as they do on CuPy (with a synchronizing copy).
* arrays report `.device.id == 0`, `.data.ptr` (a pointer object that `+ offset` moves and
  `cupy.ndarray(shape, dtype, memptr, strides)` accepts), and `__dlpack_device__` says CUDA.
* the RNG is a `cupy.random.Generator` look-alike: its bit generator has no readable state
  (CuPy's `state()` is a method returning a device pointer).

Everything else is delegated generically to NumPy: a method or module function is called on
the unwrapped arrays and its array results are wrapped again. Names that CuPy does not have
are refused (`NUMPY_ONLY`, `HOST_ONLY_ATTRS`).

Install it with `tinygrad_attn.backend._install_array_module(fake_cupy)` (the `device`
fixture in conftest.py does, for its "fake-cuda" parameter).
"""

from __future__ import annotations

import math
import sys
import threading
import types
import weakref

import numpy as np

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")

# ndarray attributes that CuPy's ndarray does not have (host memory only).
HOST_ONLY_ATTRS = frozenset({
    "ctypes", "__array_interface__", "__array_struct__", "itemset", "resize", "setfield",
    "getfield", "byteswap", "newbyteorder", "tostring", "tofile", "dump", "dumps",
})
# numpy module names that cupy does not provide (or provides only for host data).
NUMPY_ONLY = frozenset({
    "frompyfunc", "vectorize", "errstate", "seterr", "geterr", "add_newdoc", "ctypeslib",
    "memmap", "recarray", "rec", "char", "ma", "polynomial", "fromfile", "fromstring",
    "frombuffer", "from_dlpack", "asanyarray", "asmatrix", "matrix", "genfromtxt", "loadtxt",
    "save", "load", "savez", "array_repr", "array_str", "set_printoptions", "nditer",
    "lib", "random", "linalg", "fft", "testing",
})


def _unsupported(x, where):
    return TypeError(f"Unsupported type {type(x)} (fake cupy: {where} got a host array)")


def _unwrap(x, where, allow_host=False):
    """FakeArray -> its host array; a NumPy array is refused (CuPy does not transfer
    implicitly); lists/tuples/dicts are unwrapped element by element."""
    if type(x) is FakeArray:
        return x._a
    if isinstance(x, np.ndarray):
        if allow_host:
            return x
        raise _unsupported(x, where)
    if isinstance(x, (list, tuple)):
        items = [_unwrap(v, where, allow_host) for v in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        return {k: _unwrap(v, where, allow_host) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_unwrap(x.start, where, True), _unwrap(x.stop, where, True),
                     _unwrap(x.step, where, True))
    return x


def _wrap(x):
    """NumPy results -> FakeArrays; NumPy scalars -> 0-d FakeArrays (as CuPy returns)."""
    if isinstance(x, np.ndarray):
        return FakeArray(x)
    if isinstance(x, np.generic):
        return FakeArray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _call(fn, where, args, kwargs, allow_host=False):
    a = _unwrap(args, where, allow_host)
    k = _unwrap(kwargs, where, allow_host)
    return _wrap(fn(*a, **k))


# ----------------------------------------------------------------------------- memory
class MemoryPointer:
    """`a.data`: the device pointer of an array; `+ n` moves it by n bytes."""

    __slots__ = ("_owner", "_offset")

    def __init__(self, owner: np.ndarray, offset: int = 0):
        self._owner = owner
        self._offset = offset

    @property
    def ptr(self) -> int:
        return self._owner.__array_interface__["data"][0] + self._offset

    def __add__(self, nbytes: int) -> MemoryPointer:
        if not isinstance(nbytes, (int, np.integer)):
            raise TypeError(f"MemoryPointer + {type(nbytes).__name__}")
        return MemoryPointer(self._owner, self._offset + int(nbytes))

    def __int__(self):
        raise TypeError("a MemoryPointer is not an int; use .ptr")


class _Pool:
    """cupy.get_default_memory_pool(): bytes held by live FakeArray allocations."""

    def __init__(self):
        self._live: dict[int, tuple] = {}

    def _track(self, arr: np.ndarray) -> None:
        root = arr
        while isinstance(root.base, np.ndarray):
            root = root.base
        key = id(root)
        if key not in self._live:
            size = root.nbytes
            mem_size = -(-max(size, 1) // 512) * 512  # CuPy rounds allocations up to 512 B

            def freed(_ref, k=key):
                if self._live.pop(k, None) is not None:
                    for hook in list(_hooks):
                        hook.free_postprocess(device_id=0, mem_size=mem_size, mem_ptr=k,
                                              pmem_id=k)

            self._live[key] = (weakref.ref(root, freed), size)
            for hook in list(_hooks):
                hook.malloc_postprocess(device_id=0, size=size, mem_size=mem_size,
                                        mem_ptr=key, pmem_id=key)

    def used_bytes(self) -> int:
        return sum(n for _, n in self._live.values())

    def total_bytes(self) -> int:
        return self.used_bytes()

    def free_all_blocks(self) -> None:
        pass


_pool = _Pool()
_hooks: list = []


class MemoryHook:
    """cupy.cuda.MemoryHook: `with hook:` registers it (by its `name`); the pool calls
    malloc_postprocess / free_postprocess(**kwargs) as CuPy's does (device_id, size,
    mem_size, mem_ptr, pmem_id; mem_size rounded up to 512 bytes)."""

    name = "MemoryHook"

    def __enter__(self):
        if any(h.name == self.name for h in _hooks):
            raise RuntimeError(f"memory hook {self.name!r} already exists")
        _hooks.append(self)
        return self

    def __exit__(self, *exc):
        _hooks.remove(self)

    def alloc_preprocess(self, **kw): pass
    def alloc_postprocess(self, **kw): pass
    def malloc_preprocess(self, **kw): pass
    def malloc_postprocess(self, **kw): pass
    def free_preprocess(self, **kw): pass
    def free_postprocess(self, **kw): pass


def get_default_memory_pool() -> _Pool:
    return _pool


# ----------------------------------------------------------------------------- devices
_current = [0]


class _Runtime:
    class CUDARuntimeError(RuntimeError):
        pass

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - CuPy's spelling
        return 1

    @staticmethod
    def getDevice() -> int:  # noqa: N802
        return _current[0]


class Device:
    """cupy.cuda.Device(n): a context manager that makes device n current."""

    def __init__(self, device=None):
        self.id = _current[0] if device is None else int(device)
        self._prev = []

    def __enter__(self):
        if not 0 <= self.id < _Runtime.getDeviceCount():
            raise _Runtime.CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        self._prev.append(_current[0])
        _current[0] = self.id
        return self

    def __exit__(self, *exc):
        _current[0] = self._prev.pop()

    def use(self):
        _current[0] = self.id

    def synchronize(self):
        pass

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


cuda = types.ModuleType("cupy.cuda")
cuda.Device = Device
cuda.runtime = _Runtime
cuda.get_device_id = _Runtime.getDevice
cuda.MemoryHook = MemoryHook


# ----------------------------------------------------------------------------- arrays
class FakeArray:
    """A device array look-alike over a host ndarray (see the module docstring)."""

    __slots__ = ("_a", "__weakref__")
    __array_ufunc__ = None  # numpy ufuncs on a FakeArray raise (and ndarray ops defer to it)
    __array_priority__ = 100
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if isinstance(shape, np.ndarray):  # internal: wrap a host array
            self._a = shape
            _pool._track(shape)
            return
        if memptr is None:
            self._a = np.empty(shape, dtype=dtype, order=order)
            _pool._track(self._a)
            return
        if not isinstance(memptr, MemoryPointer):
            raise TypeError(f"memptr must be a MemoryPointer, not {type(memptr).__name__}")
        owner = memptr._owner
        base = owner
        while isinstance(base.base, np.ndarray):
            base = base.base
        start = owner.__array_interface__["data"][0] + memptr._offset
        base_start = base.__array_interface__["data"][0]
        if base.flags.c_contiguous:
            flat = base.reshape(-1).view(np.uint8)
        else:  # a dense allocation in another axis order (an F-ordered ufunc result)
            if any(st < 0 for st in base.strides) or base.size == 0:
                raise NotImplementedError("fake cupy: memptr into a negatively strided array")
            extent = base.itemsize + sum((n - 1) * st for n, st in zip(base.shape, base.strides))
            if extent != base.nbytes:
                raise NotImplementedError("fake cupy: memptr into a non-dense allocation")
            flat = np.lib.stride_tricks.as_strided(
                base, (base.size,), (base.itemsize,)).view(np.uint8)
        self._a = np.ndarray(shape, dtype, flat, start - base_start, strides)

    # -- what CuPy refuses
    def __array__(self, *args, **kwargs):
        raise TypeError(IMPLICIT)

    def __array_function__(self, func, types, args, kwargs):
        raise TypeError(f"{IMPLICIT} (numpy.{func.__name__} called on a device array)")

    def __getattr__(self, name):
        if name == "_a":  # not yet constructed
            raise AttributeError(name)
        if name in HOST_ONLY_ATTRS:
            raise AttributeError(f"'cupy.ndarray' object has no attribute '{name}'")
        attr = getattr(self._a, name)
        if callable(attr):
            def method(*args, **kwargs):
                return _call(attr, f"ndarray.{name}", args, kwargs)
            return method
        return _wrap(attr)

    # -- CuPy's own
    @property
    def device(self) -> Device:
        return Device(0)

    @property
    def data(self) -> MemoryPointer:
        return MemoryPointer(self._a)

    @property
    def base(self):
        b = self._a.base
        return FakeArray(b) if isinstance(b, np.ndarray) else None

    def get(self, stream=None, order="C", out=None):
        return np.array(self._a, order=order, copy=True)

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, *args, **kwargs):
        raise BufferError("fake cupy: a device array cannot be exported to a host library")

    # -- scalars: CuPy converts size-1 arrays with a synchronizing copy
    def item(self, *args):
        return self._a.item(*args)

    def tolist(self):
        return self._a.tolist()

    def __float__(self):
        return float(self._a)

    def __int__(self):
        return int(self._a)

    def __complex__(self):
        return complex(self._a)

    def __bool__(self):
        return bool(self._a)

    def __index__(self):
        if self._a.ndim != 0 or self._a.dtype.kind not in "iu":
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(self._a)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (FakeArray(np.asarray(self._a[i])) for i in range(len(self._a)))

    def __repr__(self):
        return repr(self._a).replace("array", "fake_cupy.array", 1)

    def __str__(self):
        return str(self._a)

    def __format__(self, spec):
        return format(self._a.item() if self._a.ndim == 0 else self._a, spec)

    def __copy__(self):
        return FakeArray(self._a.copy())

    def __deepcopy__(self, memo):
        return FakeArray(self._a.copy())

    def __reduce__(self):
        return (_rebuild, (self._a.copy(),))

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key, "indexing", allow_host=True)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key, "indexing", allow_host=True)] = _unwrap(value, "setitem")


def _rebuild(host):
    return FakeArray(np.array(host))


def _binary(name):
    def op(self, other):
        if isinstance(other, np.ndarray):
            raise _unsupported(other, name)
        if type(other) is FakeArray:
            other = other._a
        elif not isinstance(other, (int, float, complex, bool, np.generic)):
            return NotImplemented
        return _wrap(getattr(self._a, name)(other))
    op.__name__ = name
    return op


def _inplace(name):
    def op(self, other):
        if isinstance(other, np.ndarray):
            raise _unsupported(other, name)
        getattr(self._a, name)(other._a if type(other) is FakeArray else other)
        return self
    op.__name__ = name
    return op


def _unary(name):
    def op(self):
        return _wrap(getattr(self._a, name)())
    op.__name__ = name
    return op


for _n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
           "xor", "lshift", "rshift"):
    for _form in (f"__{_n}__", f"__r{_n}__"):
        setattr(FakeArray, _form, _binary(_form))
    setattr(FakeArray, f"__i{_n}__", _inplace(f"__i{_n}__"))
for _n in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(FakeArray, f"__{_n}__", _binary(f"__{_n}__"))
for _n in ("neg", "pos", "abs", "invert"):
    setattr(FakeArray, f"__{_n}__", _unary(f"__{_n}__"))

ndarray = FakeArray


# ----------------------------------------------------------------------------- creation
def asarray(a, dtype=None, order=None, *, blocking=False):
    if type(a) is FakeArray:
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    return FakeArray(np.array(_unwrap(a, "asarray", True), dtype=dtype, order=order or "K"))


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    if type(obj) is FakeArray:
        return FakeArray(np.array(obj._a, dtype=dtype, copy=copy, order=order, ndmin=ndmin))
    return FakeArray(np.array(_unwrap(obj, "array", True), dtype=dtype, order=order,
                              ndmin=ndmin))


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    if type(a) is FakeArray:
        return np.array(a._a, order=order, copy=True)
    return np.asarray(a, order=order)


def from_dlpack(obj):
    if type(obj) is FakeArray:
        return FakeArray(obj._a)
    dev = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else None
    raise BufferError(f"fake cupy: cannot import a DLPack tensor of device type {dev}")


# ----------------------------------------------------------------------------- module
class _Ufunc:
    """cupy.<ufunc>: callable on device arrays; no `.at` (cupyx.scatter_add does that)."""

    def __init__(self, uf):
        self._uf = uf
        self.__name__ = uf.__name__

    def __call__(self, *args, **kwargs):
        out = kwargs.get("out")
        res = _call(self._uf, self.__name__, args, kwargs)
        if out is not None:
            return out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return res

    def reduce(self, *args, **kwargs):
        return _call(self._uf.reduce, f"{self.__name__}.reduce", args, kwargs)

    def accumulate(self, *args, **kwargs):
        return _call(self._uf.accumulate, f"{self.__name__}.accumulate", args, kwargs)

    def outer(self, *args, **kwargs):
        return _call(self._uf.outer, f"{self.__name__}.outer", args, kwargs)

    @property
    def nin(self):
        return self._uf.nin


def _function(fn, name):
    def f(*args, **kwargs):
        out = kwargs.get("out")
        res = _call(fn, name, args, kwargs)
        return out if out is not None else res
    f.__name__ = name
    return f


def __getattr__(name):
    if name in NUMPY_ONLY or name.startswith("_"):
        raise AttributeError(f"module 'cupy' has no attribute '{name}'")
    attr = getattr(np, name)
    if isinstance(attr, np.ufunc):
        return _Ufunc(attr)
    if isinstance(attr, (type, int, float, complex, str, np.dtype)) or attr is None:
        return attr  # dtypes (cupy.float32 is numpy.float32), constants
    if callable(attr):
        return _function(attr, name)
    raise AttributeError(f"module 'cupy' has no attribute '{name}'")


# ----------------------------------------------------------------------------- cupy.lib
lib = types.ModuleType("cupy.lib")
lib.stride_tricks = types.ModuleType("cupy.lib.stride_tricks")


def _as_strided(x, shape=None, strides=None):
    if type(x) is not FakeArray:
        raise _unsupported(x, "as_strided")
    return FakeArray(np.lib.stride_tricks.as_strided(x._a, shape, strides))


lib.stride_tricks.as_strided = _as_strided


# ----------------------------------------------------------------------------- random
class _BitGenerator:
    """cupy.random.XORWOW look-alike: state lives on the device; `state()` is a method
    returning a device pointer (there is no readable/settable `state` as in NumPy)."""

    def __init__(self, seed):
        self.lock = threading.Lock()
        self._np = np.random.default_rng(seed)
        self._state = FakeArray(np.zeros(48, np.int8))

    def state(self):
        return self._state.data.ptr

    def random_raw(self, size=None, output=True):
        return FakeArray(self._np.integers(0, 2**31, size=size, dtype=np.int32))


class _Generator:
    def __init__(self, bit_generator):
        self.bit_generator = bit_generator

    def _rng(self):
        return self.bit_generator._np

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        return FakeArray(np.asarray(self._rng().standard_normal(size, dtype=dtype)))

    def random(self, size=None, dtype=np.float64, out=None):
        return FakeArray(np.asarray(self._rng().random(size, dtype=dtype)))

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        return FakeArray(np.asarray(self._rng().integers(low, high, size=size, dtype=dtype,
                                                         endpoint=endpoint)))


random = types.ModuleType("cupy.random")
random.default_rng = lambda seed=None: _Generator(_BitGenerator(seed))
random.Generator = _Generator
random.XORWOW = _BitGenerator


# ----------------------------------------------------------------------------- cupyx
cupyx = types.ModuleType("cupyx")
cupyx.scipy = types.ModuleType("cupyx.scipy")
cupyx.scipy.special = types.ModuleType("cupyx.scipy.special")
_erf = np.frompyfunc(math.erf, 1, 1)


def _scatter_add(a, slices, value):
    if type(a) is not FakeArray:
        raise _unsupported(a, "cupyx.scatter_add")
    np.add.at(a._a, _unwrap(slices, "scatter_add", allow_host=True),
              _unwrap(value, "cupyx.scatter_add"))


def _special_erf(x):
    if type(x) is not FakeArray:
        raise _unsupported(x, "cupyx.scipy.special.erf")
    if x.dtype.kind != "f":
        return FakeArray(_erf(x._a).astype(np.float64))
    return FakeArray(np.asarray(_erf(x._a).astype(x.dtype)))


cupyx.scatter_add = _scatter_add
cupyx.scipy.special.erf = _special_erf

MODULES = {
    "cupy": sys.modules[__name__], "cupy.cuda": cuda, "cupy.lib": lib,
    "cupy.lib.stride_tricks": lib.stride_tricks, "cupy.random": random, "cupyx": cupyx,
    "cupyx.scipy": cupyx.scipy, "cupyx.scipy.special": cupyx.scipy.special,
}
"""What `sys.modules` should map while the fake is installed (the backend imports cupyx
lazily inside its functions)."""
