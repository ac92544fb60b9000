"""Tensor: a strided view (shape, strides, storage offset, dtype, device) over one Storage.

A Tensor never owns memory; its Storage does. View ops make a new Tensor over the same
Storage with other (shape, strides, offset) — see shape.py for the arithmetic — so they
allocate nothing. Its op methods are the op layer's registered functions (`ops`, where the
forward and backward of every op live side by side), attached at the bottom of this file.
"""

from __future__ import annotations

import copy
import copyreg

from . import backend
from . import shape as shp
from .backend import DType
from .storage import Storage, wrap_array


class Tensor:
    """An n-dimensional array that can record the ops applied to it for autodiff."""

    # Defaults shared by every tensor; _init sets only what differs (a hot path: every op
    # result and every view is a new Tensor).
    requires_grad = False
    _grad = None
    grad_fn = None
    _output_nr = 0
    _base = None
    _view_version = 0
    _acc = None
    _hooks = None
    _post_acc_hooks = None
    _retains_grad = False
    _no_grad_view = False  # a view made under no_grad of a tensor that requires grad

    __array_priority__ = 1000  # so numpy scalars on the left defer to Tensor's operators

    def __init__(self, data, dtype=None, device=None, requires_grad: bool = False):
        """Same as ta.tensor(data, ...): a new tensor with a copy of `data`."""
        device = backend.canonical_device(device)
        dtype = None if dtype is None else backend.to_dtype(dtype)
        if isinstance(data, Tensor):
            data = data._array()
        arr = backend.asarray(data, dtype, device)
        storage, shape, strides, offset = wrap_array(arr)
        _init(self, storage, tuple(shape), tuple(strides), offset, None)
        if requires_grad:
            self.requires_grad_(True)

    # ------------------------------------------------------------------ geometry
    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def dim(self) -> int:
        return len(self._shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return self._shape
        return self._shape[shp.normalize_dim(dim, self.ndim, "size")]

    def nelement(self) -> int:
        return shp.numel(self._shape)

    def ndimension(self) -> int:
        return len(self._shape)

    def get_device(self) -> int:
        """-1 on the CPU, the GPU's index on a GPU (torch's convention)."""
        return -1 if self.device == "cpu" else int(self.device.partition(":")[2] or 0)

    def stride(self, dim: int | None = None):
        if dim is None:
            return self._strides
        return self._strides[shp.normalize_dim(dim, self.ndim, "stride")]

    def storage_offset(self) -> int:
        return self._offset

    def is_contiguous(self) -> bool:
        return shp.is_contiguous(self._shape, self._strides)

    def untyped_storage(self) -> Storage:
        return self._storage

    def storage(self) -> Storage:
        return self._storage

    def shares_storage(self, other: Tensor) -> bool:
        """True if both tensors view the same Storage (the same allocation)."""
        return self._storage is other._storage

    def data_ptr(self) -> int:
        return backend.data_ptr(self._storage.buffer, self._offset)

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    @property
    def grad(self) -> Tensor | None:
        """The accumulated gradient (None until a backward reaches this tensor)."""
        return self._grad

    @grad.setter
    def grad(self, value) -> None:
        # checked at the assignment, as torch: a wrong .grad would otherwise surface later
        # as a broadcast error in backward's accumulation or be broadcast by an optimizer
        if value is not None:
            _check_grad(self, value)
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        self._grad = None

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def is_cuda(self) -> bool:
        return self.device != "cpu"

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def retains_grad(self) -> bool:
        """True for a non-leaf whose .grad backward keeps (retain_grad() was called)."""
        return self._retains_grad

    @property
    def _version(self) -> int:
        return self._storage.version

    @property
    def T(self) -> Tensor:
        return _ops.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> Tensor:
        return _ops.transpose(self, -2, -1)

    @property
    def data(self) -> Tensor:
        return self.detach()

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    # ------------------------------------------------------------------ host values
    def _array(self):
        """The numpy/cupy array viewing this tensor's memory (no copy)."""
        arr = self._data
        if arr is None:
            arr = self._data = backend.strided(
                self._storage.buffer, self._shape, self._strides, self._offset
            )
        return arr

    def numpy(self):
        """A NumPy array sharing this tensor's memory (CPU tensors only)."""
        if self.device != "cpu":
            raise TypeError(
                f"numpy(): tensor is on {self.device}; call .cpu() first to copy it to the host"
            )
        if self.requires_grad:
            raise RuntimeError(
                "numpy(): can't call numpy() on a tensor that requires grad; use "
                "tensor.detach().numpy()"
            )
        return self._array()

    def __array__(self, dtype=None, copy=None):
        if self.device != "cpu":
            raise TypeError(
                f"implicit conversion of a {self.device} tensor to a host array; "
                "use .cpu().numpy() explicitly"
            )
        arr = self._array()
        return arr if dtype is None else arr.astype(dtype)

    def item(self):
        if self.numel() != 1:
            raise ValueError(
                f"item(): only a tensor with one element can be converted to a Python "
                f"scalar; got shape {tuple(self.shape)}"
            )
        return backend.to_host(self._array()).reshape(()).item()

    def tolist(self):
        return backend.to_host(self._array()).tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(
                f"bool(): the truth value of a tensor of shape {tuple(self.shape)} is "
                "ambiguous; use .any() or .all()"
            )
        return bool(self.item())

    def __index__(self) -> int:
        if self.dtype.is_floating_point or self.numel() != 1:
            raise TypeError("only one-element integer tensors can be used as an index")
        return int(self.item())

    def __format__(self, spec: str) -> str:
        """f"{loss:.4f}" formats a 0-d tensor's number, as torch's; another tensor takes only
        the empty spec (its repr)."""
        if self.ndim == 0:
            return format(self.item(), spec)
        return object.__format__(self, spec)

    def __repr__(self) -> str:
        arr = backend.to_host(self._array())
        body = repr(arr)
        body = body[body.index("(") + 1 : body.rindex(")")] if "(" in body else body
        body = body.split(", dtype=")[0]
        extra = []
        if self.device != "cpu":
            extra.append(f"device='{self.device}'")
        if self.dtype.name not in ("float32", "int64", "bool"):
            extra.append(f"dtype={self.dtype.name}")
        if self.grad_fn is not None:
            extra.append(f"grad_fn=<{self.grad_fn.name}>")
        elif self.requires_grad:
            extra.append("requires_grad=True")
        body = body.replace("\n", "\n ")
        return "tensor(" + ", ".join([body] + extra) + ")"

    # ------------------------------------------------------------------ new tensors like this
    # torch's new_* factories: this tensor's dtype and device unless given (new_empty: zeros)
    def new_zeros(self, *size, **kw): return _new_full(self, "new_zeros", size, 0, **kw)
    def new_ones(self, *size, **kw): return _new_full(self, "new_ones", size, 1, **kw)
    def new_empty(self, *size, **kw): return _new_full(self, "new_empty", size, 0, **kw)
    def new_full(self, size, fill_value, **kw):
        return _new_full(self, "new_full", (size,), fill_value, **kw)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False) -> Tensor:
        """A copy of `data` as a new leaf, in this tensor's dtype and device by default."""
        return Tensor(data, dtype=self.dtype if dtype is None else dtype,
                      device=self.device if device is None else device,
                      requires_grad=requires_grad)

    # ------------------------------------------------------------------ copy and pickle
    def __deepcopy__(self, memo) -> Tensor:
        """A leaf over a deep copy of this tensor's Storage, with the same shape, strides and
        offset: tensors deep-copied together (one call, one memo) that shared a Storage share
        the copy's one Storage, so an in-place write to the copy is seen by its views.

        requires_grad and .grad are kept, as torch's Tensor; a parameter (its Storage tagged
        "parameter", as nn.Parameter does) does not take its .grad along, as torch's Parameter.
        """
        if self.grad_fn is not None:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the "
                f"deepcopy protocol at the moment (this one, of shape {tuple(self.shape)}, has "
                f"grad_fn {self.grad_fn.name}); deep-copy a detach()ed tensor instead"
            )
        new = _make(copy.deepcopy(self._storage, memo), self._shape, self._strides,
                    self._offset)
        memo[id(self)] = new
        if self.requires_grad:
            new.requires_grad = True
        if self._grad is not None and self._storage.category != "parameter":
            new._grad = copy.deepcopy(self._grad, memo)
        return new

    def __reduce_ex__(self, protocol):
        """Pickled as (Storage, shape, strides, offset, requires_grad), as torch pickles a
        tensor: views pickled together keep sharing one Storage (pickle's memo), the device
        is kept, the graph and .grad are not (an unpickled tensor is a leaf)."""
        return _rebuild_tensor, (self._storage, self._shape, self._strides, self._offset,
                                 self.requires_grad)

    # ------------------------------------------------------------------ DLPack
    def __dlpack__(self, *args, **kwargs):
        return self._array().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array().__dlpack_device__()

    # ------------------------------------------------------------------ autograd
    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and not self.dtype.is_floating_point:
            raise RuntimeError(
                f"requires_grad_: only floating point tensors can require gradients; this "
                f"tensor of shape {tuple(self.shape)} has dtype {self.dtype.name}"
            )
        if not requires_grad and self.grad_fn is not None:
            raise RuntimeError(
                "requires_grad_(False): only leaves can stop requiring grad; use detach()"
            )
        self.requires_grad = requires_grad
        return self

    def detach(self) -> Tensor:
        """A tensor over the same memory with no history (shares the version counter)."""
        return _make(self._storage, self._shape, self._strides, self._offset, self._data)

    def detach_(self) -> Tensor:
        self.grad_fn = None
        self.requires_grad = False
        return self

    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs=None) -> None:
        from .autograd import backward

        backward([self], None if gradient is None else [gradient], retain_graph=retain_graph,
                 create_graph=create_graph, inputs=inputs)

    def register_hook(self, hook):
        """hook(grad) -> None or a replacement grad; runs when this tensor's grad is computed."""
        if not self.requires_grad:
            raise RuntimeError(
                "register_hook: cannot register a hook on a tensor that doesn't require grad"
            )
        if self.grad_fn is not None:
            return self.grad_fn.register_prehook(self._output_nr, hook)
        from .autograd import _HookHandle

        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)
        return _HookHandle(self._hooks, hook)

    def register_post_accumulate_grad_hook(self, hook):
        """hook(tensor) -> None, run after backward has added this leaf's gradient into its
        .grad (the .grad is final for this backward; the hook may change it in place)."""
        if not self.requires_grad:
            raise RuntimeError("register_post_accumulate_grad_hook: cannot register a hook on "
                               "a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            raise RuntimeError("register_post_accumulate_grad_hook: post accumulate grad hooks "
                               "cannot be registered on non-leaf tensors")
        from .autograd import _HookHandle

        if self._post_acc_hooks is None:
            self._post_acc_hooks = []
        self._post_acc_hooks.append(hook)
        return _HookHandle(self._post_acc_hooks, hook)

    def retain_grad(self) -> None:
        """Keep .grad for this non-leaf tensor after backward (taken after its hooks)."""
        if self.grad_fn is None or self._retains_grad:
            return
        import weakref

        self._retains_grad = True
        node = self.grad_fn
        if node._retained is None:
            node._retained = {}
        node._retained[self._output_nr] = weakref.ref(self)

    # ------------------------------------------------------------------ operators
    def __add__(self, other): return _ops.add(self, other)
    def __radd__(self, other): return _ops.add(self, other)
    def __sub__(self, other): return _ops.sub(self, other)
    def __rsub__(self, other): return _ops.sub(other, self)
    def __mul__(self, other): return _ops.mul(self, other)
    def __rmul__(self, other): return _ops.mul(self, other)
    def __truediv__(self, other): return _ops.div(self, other)
    def __rtruediv__(self, other): return _ops.div(other, self)
    def __pow__(self, other): return _ops.pow(self, other)
    def __rpow__(self, other): return _ops.pow(other, self)
    def __mod__(self, other): return _ops.remainder(self, other)
    def __rmod__(self, other): return _ops.remainder(other, self)
    def __floordiv__(self, other): return _ops.floor_divide(self, other)
    def __rfloordiv__(self, other): return _ops.floor_divide(other, self)
    def __neg__(self): return _ops.neg(self)
    def __abs__(self): return _ops.abs(self)
    def __matmul__(self, other): return _ops.matmul(self, other)
    def __rmatmul__(self, other): return _ops.matmul(other, self)
    def __eq__(self, other): return _ops.compare(self, other, "eq")  # type: ignore[override]
    def __ne__(self, other): return _ops.compare(self, other, "ne")  # type: ignore[override]
    def __lt__(self, other): return _ops.compare(self, other, "lt")
    def __le__(self, other): return _ops.compare(self, other, "le")
    def __gt__(self, other): return _ops.compare(self, other, "gt")
    def __ge__(self, other): return _ops.compare(self, other, "ge")
    def __invert__(self): return _ops.bitwise_not(self)
    # bitwise on integers, logical on bool (as torch); a float operand is an error
    def __and__(self, other): return _ops.bitwise_and(self, other)
    def __rand__(self, other): return _ops.bitwise_and(other, self)
    def __or__(self, other): return _ops.bitwise_or(self, other)
    def __ror__(self, other): return _ops.bitwise_or(other, self)
    def __xor__(self, other): return _ops.bitwise_xor(self, other)
    def __rxor__(self, other): return _ops.bitwise_xor(other, self)
    def __lshift__(self, other): return _ops.bitwise_left_shift(self, other)
    def __rlshift__(self, other): return _ops.bitwise_left_shift(other, self)
    def __rshift__(self, other): return _ops.bitwise_right_shift(self, other)
    def __rrshift__(self, other): return _ops.bitwise_right_shift(other, self)
    def __getitem__(self, index): return _ops.getitem(self, index)
    def __setitem__(self, index, value): _ops.setitem(self, index, value)
    def __iter__(self): return iter(_ops.unbind(self, 0))
    __hash__ = object.__hash__

    # ------------------------------------------------------------------ op methods
    # An op's method is its registered function itself (`@op(Exp, method=True)` in
    # ops/elementwise.py makes x.exp() call ops.exp(x)), attached at the bottom of this
    # file. Written out here are only the methods whose signature is not the function's.
    def where(self, condition, other): return _ops.where(condition, self, other)

    # torch's varargs forms: x.view(2, 3), x.view((2, 3)) and its keyword: x.view(size=...)
    def view(self, *shape, **kw): return _ops.view(self, _sizes("view", shape, kw, "size"))
    def view_as(self, other): return _ops.view(self, other.shape)
    def reshape(self, *shape, **kw):
        return _ops.reshape(self, _sizes("reshape", shape, kw, "shape"))
    def reshape_as(self, other): return _ops.reshape(self, other.shape)
    def permute(self, *dims, **kw): return _ops.permute(self, _sizes("permute", dims, kw, "dims"))
    def flip(self, *dims, **kw): return _ops.flip(self, _sizes("flip", dims, kw, "dims"))
    def tile(self, *dims, **kw): return _ops.tile(self, _sizes("tile", dims, kw, "dims"))
    def squeeze(self, *dim, **kw):  # x.squeeze(), (0), (0, 1), ((0, 1)), (dim=(0, 1))
        if kw:
            return _ops.squeeze(self, _sizes("squeeze", dim, kw, "dim", as_shape=False))
        return _ops.squeeze(self, *dim) if len(dim) <= 1 else _ops.squeeze(self, dim)
    def expand(self, *shape, **kw):
        if not shape and not kw:  # torch: the sizes are required (expand(()) is the 0-d form)
            raise TypeError('expand() missing 1 required positional argument: "size"')
        return _ops.expand(self, _sizes("expand", shape, kw, "size"))
    def expand_as(self, other): return _ops.expand(self, other.shape)

    def cpu(self): return _ops.to(self, "cpu")
    def cuda(self, device=None, non_blocking=False):
        return _ops.to(self, "cuda" if device is None else f"cuda:{int(device)}")
    def float(self): return _ops.to(self, backend.float32)
    def double(self): return _ops.to(self, backend.float64)
    def half(self): return _ops.to(self, backend.float16)
    def long(self): return _ops.to(self, backend.int64)
    def int(self): return _ops.to(self, backend.int32)
    def bool(self): return _ops.to(self, backend.bool_)
    def byte(self): return _ops.to(self, backend.uint8)
    def char(self): return _ops.to(self, backend.int8)
    def short(self): return _ops.to(self, backend.int16)
    def type_as(self, other): return _ops.to(self, other.dtype)
    def type(self, dtype=None, non_blocking=False):
        """x.type(): torch's type string ('torch.FloatTensor', what scripts compare against);
        x.type(dtype) or x.type('torch.DoubleTensor'): x.to(dtype)."""
        if dtype is None:
            return _type_string(self)
        if isinstance(dtype, str) and dtype.endswith("Tensor"):
            dtype = _dtype_of_type_string(dtype)
        return _ops.to(self, dtype)

    # in place: one registered function, `inplace`, with the kind of write
    def add_(self, other, alpha=1): return _ops.inplace(self, "add", other, alpha)
    def sub_(self, other, alpha=1): return _ops.inplace(self, "add", other, -alpha)
    def mul_(self, other): return _ops.inplace(self, "mul", other)
    def div_(self, other, *, rounding_mode=None):
        if rounding_mode is None:
            return _ops.inplace(self, "div", other)
        return _ops.inplace(self, "rounded_div", other, rounding_mode)
    def zero_(self): return _ops.inplace(self, "fill", 0)
    def fill_(self, value): return _ops.inplace(self, "fill", value)
    def copy_(self, src): return _ops.inplace(self, "copy", src)
    def masked_fill_(self, mask, value): return _ops.inplace(self, "masked_fill", mask, value)
    def clamp_(self, min=None, max=None):  # noqa: A002
        return _ops.inplace(self, "clamp", min, max)


def _check_grad(t: Tensor, g) -> None:
    """torch's checks on `t.grad = g`: a Tensor of t's shape, dtype and device, not t."""
    if type(g) is not Tensor:
        raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type "
                        f"{type(g).__name__}")
    if g is t:
        raise RuntimeError("can't assign a tensor as its own grad")
    if g.dtype is not t.dtype:
        raise RuntimeError(f"attempting to assign a gradient with dtype {g.dtype.name} to a "
                           f"tensor with dtype {t.dtype.name} (shape {tuple(t.shape)}); the "
                           "gradient must have the tensor's dtype")
    if g._shape != t._shape:
        raise RuntimeError(f"attempting to assign a gradient of size {list(g.shape)} to a "
                           f"tensor of size {list(t.shape)}. Please ensure that the gradient "
                           "and the tensor are the same size")
    if g.device != t.device:
        raise RuntimeError(f"attempting to assign a gradient on {g.device} to a tensor on "
                           f"{t.device} (shape {tuple(t.shape)}); the gradient must be on the "
                           "tensor's device")


def _shape_arg(args) -> tuple:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _sizes(method: str, args: tuple, kw: dict, key: str, as_shape: bool = True):
    """The sizes or dims of a varargs method, given as torch takes them: x.view(2, 3),
    x.view((2, 3)) or x.view(size=(2, 3)) (the keyword is torch's name for it)."""
    if kw:
        if args or set(kw) != {key}:
            raise TypeError(f"{method}() got unexpected arguments {sorted(kw)}; it takes "
                            f"the {key} as positional ints, one sequence or {key}=...")
        return _shape_arg((kw[key],)) if as_shape else kw[key]
    return _shape_arg(args)


# x.type(): torch's legacy type names, by dtype
_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
               "int64": "LongTensor", "int32": "IntTensor", "int16": "ShortTensor",
               "int8": "CharTensor", "uint8": "ByteTensor", "bool": "BoolTensor"}


def _type_string(t: Tensor) -> str:
    return ("torch." if t.device == "cpu" else "torch.cuda.") + _TYPE_NAMES[t.dtype.name]


def _dtype_of_type_string(name: str) -> DType:
    short = name.removeprefix("torch.").removeprefix("cuda.")
    found = [d for d, type_name in _TYPE_NAMES.items() if type_name == short]
    if not found:
        raise ValueError(f"type(): invalid type {name!r}; expected a dtype or one of "
                         f"{sorted('torch.' + n for n in _TYPE_NAMES.values())}")
    return backend.to_dtype(found[0])


def _new_full(t: Tensor, method: str, size: tuple, value, *, dtype=None, device=None,
              requires_grad: bool = False) -> Tensor:
    size = _shape_arg(size)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in size):
        raise TypeError(f"{method}(): size must be ints, got {size!r}")
    if any(n < 0 for n in size):
        raise RuntimeError(f"{method}(): trying to create tensor with negative dimension "
                           f"(size {list(size)})")
    dtype = t.dtype if dtype is None else backend.to_dtype(dtype)
    device = t.device if device is None else backend.canonical_device(device)
    with backend.on_device(device):
        out = from_array(backend.xp_for(device).full(size, value, dtype=dtype.np))
    return out.requires_grad_(True) if requires_grad else out


def _init(t: Tensor, storage: Storage, shape, strides, offset, data) -> None:
    t._storage = storage
    t._shape = shape
    t._strides = strides
    t._offset = offset
    t._data = data
    t.dtype = storage.dtype
    t.device = storage.device


_new = object.__new__


def _make(storage: Storage, shape, strides, offset: int, data=None, base=None) -> Tensor:
    """A Tensor over an existing storage: this is how every view is born (no allocation)."""
    t = _new(Tensor)
    t._storage = storage  # _init's work, written out: every op result and view comes here
    t._shape = shape
    t._strides = strides
    t._offset = offset
    t._data = data
    t.dtype = storage.dtype
    t.device = storage.device
    if base is not None:
        t._base = base if base._base is None else base._base
        t._view_version = storage.version
    return t


def from_array(arr, copy_reason: str | None = None) -> Tensor:
    """Wrap a freshly computed numpy/cupy array as a Tensor over a new Storage (no copy)."""
    if type(arr) is not _HOST_ARRAY and not backend.is_array(arr):
        # numpy returns scalars from reductions of 0-d arrays
        recorded = getattr(arr, "_as_recorded", None)
        if recorded is not None:  # inside a create_graph backward: the array records ops
            return recorded()
        arr = backend.ensure_array(arr)
    storage, shape, strides, offset = wrap_array(arr, copy_reason)
    return _make(storage, shape, strides, offset, arr if offset == 0 else None)


_HOST_ARRAY = backend.ndarray_types[0]  # NumPy's array type (the first of them, always)


def _rebuild_tensor(storage: Storage, shape, strides, offset, requires_grad) -> Tensor:
    t = _make(storage, tuple(shape), tuple(strides), offset)
    if requires_grad:
        t.requires_grad = True
    return t


def _reduce_storage(storage: Storage):
    """A Storage pickles (and deep-copies: copy.deepcopy reads copyreg's table too) as its
    values on the host, its device and what the ledger knows of it."""
    return _rebuild_storage, (backend.to_host(storage.buffer), storage.device,
                              storage.dtype.name, storage.shape, storage.category)


def _rebuild_storage(host, device: str, dtype_name: str, shape, category) -> Storage:
    """A new Storage through the one allocation path (the ledger counts it), on `device`.
    `host` is already a fresh array (unpickled, or deep-copied), so the CPU keeps it."""
    flat = host.reshape(-1) if device == "cpu" else backend.to_device(host, device)
    storage = Storage(flat, device, backend.to_dtype(dtype_name), None, shape)
    if category is not None:
        storage.category = category  # a parameter stays a parameter, state stays state
    return storage


copyreg.pickle(Storage, _reduce_storage)


def _zeros_array(shape, dtype: DType, device: str):
    xp = backend.xp_for(device)
    with backend.on_device(device):
        return xp.zeros(shape, dtype=dtype.np)


def _ones_like_array(t: Tensor):
    xp = backend.xp_for(t.device)
    with backend.on_device(t.device):
        return xp.ones(t.shape, dtype=t.dtype.np)


from . import ops as _ops  # noqa: E402  (the op layer; methods above forward to it at call time)
from .autograd import GradMode  # noqa: E402  (read by the in-place forms below)


def _result_inplace(name: str):
    """x.exp_(), x.scatter_(...): the method `name` run out of place, its result written
    into x. While recording, the op runs on a copy of x: what its backward saves of x
    must keep the values from before the write (torch saves the original too)."""
    def method(self, *args, **kwargs):
        recording = GradMode.enabled and (self.requires_grad or any(
            isinstance(a, Tensor) and a.requires_grad for a in args))
        src = _ops.clone(self) if recording else self
        result = getattr(src, name)(*args, **kwargs)
        return _ops.inplace(self, "result", f"{name}_", result)

    method.__name__ = method.__qualname__ = f"{name}_"
    return method


for _name, _fn in _ops.names("method").items():
    if _name in Tensor.__dict__:  # written out above: a signature of its own
        continue
    if _fn is _ops.inplace:  # the in-place form of another op (exp_ of exp)
        _fn = _result_inplace(_name[:-1])
    setattr(Tensor, _name, _fn)
