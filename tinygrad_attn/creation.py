"""Tensor factories and the seeded random generator."""

from __future__ import annotations

from . import backend
from . import shape as shp
from .backend.dtypes import checked_scalar
from .tensor import Tensor, from_array

Generator = backend.Generator
# the engine's default generator: one stream per device, seeded with 0 at import
default_generator = backend.Generator(device=None).manual_seed(0)


def manual_seed(seed: int) -> backend.Generator:
    """Seed the random streams of every device; returns the default generator (as torch)."""
    return default_generator.manual_seed(seed)


def get_rng_state() -> dict:
    """The default generator's state (every device's stream): JSON-able, for set_rng_state."""
    return default_generator.get_state()


def set_rng_state(state: dict) -> None:
    default_generator.set_state(state)


def _shape(op: str, args, dtype) -> tuple:
    """The shape a factory was given, checked as torch checks it: a negative size is a
    RuntimeError naming it, and a shape past what an array can address (2**63 - 1 bytes)
    a ShapeError, before anything is allocated."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    shape = tuple(int(s) for s in args)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"{op}: trying to create a tensor with a negative dimension: "
                           f"{list(shape)}")
    shp.check_view(op, shape, shp.contiguous_strides(shape), 0, shp.numel(shape),
                   dtype.itemsize)
    return shape


def _finish(arr, requires_grad: bool) -> Tensor:
    t = from_array(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _dtype(dtype, default=None):
    if dtype is None:
        return default or backend.get_default_dtype()
    return backend.to_dtype(dtype)


def _float_dtype(op: str, dtype):
    """Random floats need a floating dtype: torch refuses rather than truncate them."""
    dtype = _dtype(dtype)
    if not dtype.is_floating_point:
        raise RuntimeError(f"{op}: dtype {dtype.name} is not supported; {op} samples need a "
                           "floating-point dtype (float16, float32 or float64)")
    return dtype


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, scalars, NumPy arrays, Tensors).

    Python floats become the default dtype (float32) and Python ints int64, as in PyTorch.
    """
    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def _filled(kind, shape, dtype, device, requires_grad, value=None):
    device = backend.canonical_device(device)
    dtype = _dtype(dtype)
    shape = _shape(kind, shape, dtype)
    xp = backend.xp_for(device)
    with backend.on_device(device):
        if kind == "full":  # the value must fit the dtype, as torch checks it
            arr = xp.full(shape, checked_scalar("full", value, dtype), dtype=dtype.np)
        else:
            arr = getattr(xp, kind)(shape, dtype=dtype.np)
    return _finish(arr, requires_grad)


def zeros(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    return _filled("zeros", shape, dtype, device, requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    return _filled("ones", shape, dtype, device, requires_grad)


def empty(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    return _filled("empty", shape, dtype, device, requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    if dtype is None and isinstance(fill_value, bool):
        dtype = backend.bool_
    elif dtype is None and isinstance(fill_value, int):
        dtype = backend.int64
    return _filled("full", (shape,), dtype, device, requires_grad, fill_value)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False) -> Tensor:
    if end is None:
        start, end = 0, start
    if dtype is None:
        is_int = all(isinstance(v, int) for v in (start, end, step))
        dtype = backend.int64 if is_int else backend.get_default_dtype()
    dtype = backend.to_dtype(dtype)
    _no_bool_range("arange", dtype)
    device = backend.canonical_device(device)
    xp = backend.xp_for(device)
    with backend.on_device(device):
        arr = xp.arange(start, end, step).astype(dtype.np)
    return _finish(arr, requires_grad)


def _no_bool_range(op: str, dtype) -> None:
    if dtype is backend.bool_:  # torch has no bool kernel for a range of values
        raise NotImplementedError(f"{op}: not implemented for bool; make the range in an "
                                  "integer dtype and compare it")


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False) -> Tensor:
    dtype, device = _dtype(dtype), backend.canonical_device(device)
    _no_bool_range("linspace", dtype)
    for value in (start, end):  # the end points must fit the dtype, as torch checks them
        checked_scalar("linspace", value, dtype)
    xp = backend.xp_for(device)
    with backend.on_device(device):
        arr = xp.linspace(start, end, steps).astype(dtype.np)
    return _finish(arr, requires_grad)


def eye(n, m=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    dtype, device = _dtype(dtype), backend.canonical_device(device)
    xp = backend.xp_for(device)
    with backend.on_device(device):
        arr = xp.eye(n, m, dtype=dtype.np)
    return _finish(arr, requires_grad)


def _generator(generator, device: str):
    """The generator a draw uses: the given one (a ta.Generator) or the default."""
    if generator is None:
        return default_generator
    if not isinstance(generator, backend.Generator):
        raise TypeError(f"generator must be a ta.Generator, got {type(generator).__name__}")
    return generator


def _sized(op: str, shape, size):
    """The size of a factory given as *size or size= (not both), as torch reads it."""
    if size is not None:
        if shape:
            raise TypeError(f"{op}(): got the size both as positional arguments and size=")
        return (size,)
    return shape


def randn(*shape, size=None, generator=None, dtype=None, device=None, requires_grad=False,
          pin_memory=False) -> Tensor:
    """Standard normal samples from the seeded generator (see manual_seed)."""
    dtype, device = _float_dtype("randn", dtype), backend.canonical_device(device)
    gen = _generator(generator, device)
    with backend.on_device(device):
        arr = gen.normal(_shape("randn", _sized("randn", shape, size), dtype), dtype, device)
    return _finish(arr, requires_grad)


def rand(*shape, size=None, generator=None, dtype=None, device=None, requires_grad=False,
         pin_memory=False) -> Tensor:
    """Uniform samples in [0, 1) from the seeded generator."""
    dtype, device = _float_dtype("rand", dtype), backend.canonical_device(device)
    gen = _generator(generator, device)
    with backend.on_device(device):
        arr = gen.uniform(_shape("rand", _sized("rand", shape, size), dtype), dtype, device)
    return _finish(arr, requires_grad)


def _int_arg(op: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if hasattr(value, "item") and getattr(value, "shape", None) == ():
            return _int_arg(op, name, value.item())  # a 0-d tensor reads as its number
        raise TypeError(f"{op}(): argument '{name}' must be int, not {type(value).__name__}")
    return value


def _is_size(x) -> bool:
    return isinstance(x, (tuple, list)) or (hasattr(x, "__len__") and not hasattr(x, "shape"))


def _randint_args(args, low, high, size) -> tuple:
    """(low, high, size) from torch's forms: randint(high, size), randint(low, high, size),
    any of them by keyword."""
    args = list(args)
    if size is None and args and _is_size(args[-1]):
        size = args.pop()
    elif size is None and len(args) >= 2:
        raise TypeError(f"randint(): argument 'size' must be tuple of ints, not "
                        f"{type(args[-1]).__name__}")
    if len(args) == 2:
        if low is not None or high is not None:
            raise TypeError("randint(): got low/high both by position and by keyword")
        low, high = args
    elif len(args) == 1:
        if high is None:
            high = args[0]
        elif low is None:
            low = args[0]
        else:
            raise TypeError("randint(): got low/high both by position and by keyword")
    elif args:
        raise TypeError(f"randint(): takes low, high and size; got {len(args)} positional "
                        "arguments besides the size")
    if high is None:
        raise TypeError("randint(): missing the required argument 'high'")
    if size is None:
        raise TypeError("randint(): missing the required argument 'size' (a tuple of ints)")
    if not _is_size(size):
        raise TypeError(f"randint(): argument 'size' must be tuple of ints, not "
                        f"{type(size).__name__}")
    low = 0 if low is None else _int_arg("randint", "low", low)
    return low, _int_arg("randint", "high", high), tuple(size)


def randint(*args, low=None, high=None, size=None, generator=None, dtype=None, device=None,
            requires_grad=False, pin_memory=False) -> Tensor:
    """Integers uniform in [low, high): randint(high, size) or randint(low, high, size), as
    torch (int64 unless dtype= says otherwise)."""
    low, high, size = _randint_args(args, low, high, size)
    dtype, device = _dtype(dtype, backend.int64), backend.canonical_device(device)
    shape = _shape("randint", (size,), dtype)
    backend.random.check_range("randint", low, high, dtype)
    gen = _generator(generator, device)
    with backend.on_device(device):
        arr = gen.integers(low, high, shape, dtype, device)
    return _finish(arr, requires_grad)


def randint_like(t, *args, low=None, high=None, generator=None, dtype=None, device=None,
                 requires_grad=False, memory_format=None) -> Tensor:
    """randint of t's shape (and dtype and device unless given): randint_like(t, high) or
    randint_like(t, low, high)."""
    low, high, _ = _randint_args(args, low, high, ())
    dtype = t.dtype if dtype is None else dtype
    device = t.device if device is None else device
    return randint(low, high, tuple(t.shape), generator=generator, dtype=dtype,
                   device=device, requires_grad=requires_grad)


def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False,
             pin_memory=False) -> Tensor:
    """A random permutation of 0 .. n-1 (int64 unless dtype= says otherwise)."""
    n = _int_arg("randperm", "n", n)
    dtype, device = _dtype(dtype, backend.int64), backend.canonical_device(device)
    _shape("randperm", (n,), dtype)
    if n > 0:
        checked_scalar("randperm", n - 1, dtype)  # the largest entry must fit, as torch
    gen = _generator(generator, device)
    with backend.on_device(device):
        arr = gen.permutation(n, dtype, device)
    return _finish(arr, requires_grad)


def _normal_of_size(mean: float, std: float, size, *, generator=None, dtype=None,
                    device=None, requires_grad=False) -> Tensor:
    """torch.normal(mean, std, size): numbers for mean and std, a new tensor of `size`
    (ta.normal's fourth form; its tensor forms are ops, in ops/random.py)."""
    if std < 0:
        raise RuntimeError(f"normal: normal expects std >= 0.0, but found std {std}")
    dtype, device = _float_dtype("normal", dtype), backend.canonical_device(device)
    gen = _generator(generator, device)
    with backend.on_device(device):
        arr = gen.normal(_shape("normal", (size,), dtype), dtype, device, mean, std)
    return _finish(arr, requires_grad)


def _like(kind, t: Tensor, dtype, device, requires_grad, value=None, generator=None):
    dtype = t.dtype if dtype is None else dtype
    device = t.device if device is None else device
    if kind == "full":
        return full(t.shape, value, dtype=dtype, device=device, requires_grad=requires_grad)
    if kind in ("randn", "rand"):
        _float_dtype(f"{kind}_like", dtype)
        fn = randn if kind == "randn" else rand
        return fn(t.shape, dtype=dtype, device=device, requires_grad=requires_grad,
                  generator=generator)
    return _filled(kind, t.shape, dtype, device, requires_grad)


def zeros_like(t, dtype=None, device=None, requires_grad=False):
    return _like("zeros", t, dtype, device, requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False):
    return _like("ones", t, dtype, device, requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False):
    return _like("empty", t, dtype, device, requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    return _like("full", t, dtype, device, requires_grad, fill_value)


def randn_like(t, dtype=None, device=None, requires_grad=False, *, generator=None,
               memory_format=None):
    return _like("randn", t, dtype, device, requires_grad, generator=generator)


def rand_like(t, dtype=None, device=None, requires_grad=False, *, generator=None,
              memory_format=None):
    return _like("rand", t, dtype, device, requires_grad, generator=generator)


def from_numpy(arr) -> Tensor:
    """A tensor sharing the memory of a NumPy array (no copy)."""
    return from_dlpack(arr)


def from_dlpack(obj) -> Tensor:
    """A tensor sharing the memory of any DLPack producer (NumPy, PyTorch, CuPy): no copy.

    The producer's memory becomes one Storage; strided producers keep their strides.
    """
    from .storage import Storage
    from .tensor import _make

    arr = backend.from_dlpack(obj)
    span = backend.span_view(arr)
    if span is None:
        raise ValueError(
            f"from_dlpack: arrays with negative strides are not supported (strides "
            f"{arr.strides}); make a copy first"
        )
    flat, strides, offset = span
    storage = Storage(flat, backend.device_of(arr), backend.dtype_of(arr), shape=arr.shape)
    return _make(storage, arr.shape, strides, offset)
