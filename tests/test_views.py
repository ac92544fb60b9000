"""Zero-copy view ops: values equal NumPy's, storage is shared, and nothing is allocated."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tinygrad_attn.memory import state as ledger_state

SETTINGS = settings(max_examples=60, deadline=None)


# ----------------------------------------------------------------------------- helpers
class AllocCounter:
    """Observer of Storage allocations (registered in tinygrad_attn.memory.state.observers)."""

    def __init__(self):
        self.allocs = []

    def on_alloc(self, storage):
        self.allocs.append(storage)

    def on_free(self, storage):
        pass

    def __getattr__(self, name):
        # other ledger events (on_save, on_release, ...) are not allocations: ignore them
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


@contextlib.contextmanager
def count_allocs():
    obs = AllocCounter()
    ledger_state.observers.append(obs)
    try:
        yield obs.allocs
    finally:
        ledger_state.observers.remove(obs)


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def make(shape, requires_grad=False, dtype=np.float32, device="cpu"):
    """A tensor with distinct values 0..n-1, so that equal values mean equal positions."""
    arr = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    return ta.tensor(arr, requires_grad=requires_grad, device=device)


def host(t):
    return t.detach().cpu().numpy()


def np_view(arr, index):
    """arr[index] as a view (a trailing Ellipsis keeps an all-int index from giving a scalar)."""
    index = index if isinstance(index, tuple) else (index,)
    if not any(i is Ellipsis for i in index):
        index = index + (Ellipsis,)
    return arr[index]


def geometry(arr, base):
    """(strides, offset) in elements of a NumPy view `arr` of the C-contiguous array `base`."""
    item = arr.itemsize
    offset = (arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    return tuple(s // item for s in arr.strides), offset


def assert_same_geometry(t, arr, base):
    """t's strides/offset equal NumPy's. Strides of size-1 dims are free (nothing is ever
    stepped along them), and an empty view has no meaningful offset, so those are skipped."""
    assert tuple(t.shape) == arr.shape
    if arr.size == 0:
        return
    strides, offset = geometry(arr, base)
    assert t.storage_offset() == offset
    for n, a, b in zip(arr.shape, t.stride(), strides):
        if n != 1:
            assert a == b, (t.stride(), strides, arr.shape)


def check_view(x, out, expected, allocs):
    """out (a Tensor or a list of Tensors) is a zero-copy view of x with NumPy's values."""
    outs = out if isinstance(out, (list, tuple)) else [out]
    exps = expected if isinstance(expected, (list, tuple)) else [expected]
    assert len(outs) == len(exps)
    for o, e in zip(outs, exps):
        assert isinstance(o, ta.Tensor)
        assert tuple(o.shape) == e.shape
        np.testing.assert_array_equal(host(o), e)
        assert o.shares_storage(x)
        assert o.untyped_storage() is x.untyped_storage()
    assert allocs == [], f"a view op allocated {allocs}"


@st.composite
def tensors(draw, shape=None):
    shape = draw(shapes) if shape is None else shape
    return make(shape, requires_grad=draw(st.booleans()))


@st.composite
def basic_index(draw, shape):
    """A basic index for `shape`: ints, slices with positive steps, None and Ellipsis."""
    per_dim = []
    for n in shape:
        kind = draw(st.sampled_from(["int", "slice", "full"] if n else ["slice", "full"]))
        if kind == "int":
            per_dim.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            bound = st.none() | st.integers(-n - 2, n + 2)
            step = draw(st.none() | st.integers(1, 3))
            per_dim.append(slice(draw(bound), draw(bound), step))
        else:
            per_dim.append(slice(None))
    a = draw(st.integers(0, len(shape)))
    if draw(st.booleans()):
        b = draw(st.integers(a, len(shape)))
        index = per_dim[:a] + [Ellipsis] + per_dim[b:]
    else:
        index = per_dim[:a]
    for _ in range(draw(st.integers(0, 2))):
        index.insert(draw(st.integers(0, len(index))), None)
    if len(index) == 1 and draw(st.booleans()):
        return index[0]  # a bare (non-tuple) index
    return tuple(index)


@st.composite
def factor_shape(draw, numel):
    """A random shape with `numel` elements (primes of numel grouped, 1s sprinkled in)."""
    primes, n, p = [], numel, 2
    while n > 1:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    primes = draw(st.permutations(primes))
    dims, cur = [], 1
    for q in primes:
        cur *= q
        if draw(st.booleans()):
            dims.append(cur)
            cur = 1
    if cur > 1 or not dims:
        dims.append(cur)
    for _ in range(draw(st.integers(0, 2))):
        dims.insert(draw(st.integers(0, len(dims))), 1)
    if draw(st.booleans()):
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return tuple(dims)


def resolved(shape, numel):
    if -1 not in shape:
        return shape
    known = int(np.prod([s for s in shape if s != -1]))
    return tuple(numel // known if s == -1 else s for s in shape)


def np_can_view(arr, shape) -> bool:
    try:
        arr.reshape(shape, copy=False)
    except (ValueError, AttributeError):
        return False
    return True


# ----------------------------------------------------------------------------- view ops
@SETTINGS
@given(st.data())
def test_view(data):
    x = data.draw(tensors())
    new = data.draw(factor_shape(x.numel()))
    with count_allocs() as allocs:
        y = x.view(new)
    check_view(x, y, host(x).reshape(new), allocs)
    assert y.shape == resolved(new, x.numel())


@SETTINGS
@given(st.data())
def test_reshape_view_compatible(data):
    x = data.draw(tensors())
    perm = data.draw(st.permutations(range(x.ndim)))
    xp = x.permute(perm)
    new = data.draw(factor_shape(x.numel()))
    ref = host(xp)
    with count_allocs() as allocs:
        y = xp.reshape(new)
    np.testing.assert_array_equal(host(y), ref.reshape(new))
    if np_can_view(ref, resolved(new, x.numel())):
        check_view(x, y, ref.reshape(new), allocs)
    else:  # not expressible as a view: exactly one copy, recorded as such
        assert len(allocs) == 1 and allocs[0].copy_reason == "reshape-copy"
        assert allocs[0].nbytes == x.numel() * x.itemsize
        assert not y.shares_storage(x) and y.is_contiguous()


def test_reshape_oracle_agrees_with_torch():
    """np_can_view (used above) is PyTorch's view rule on the cases the property test meets."""
    torch = pytest.importorskip("torch")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for perm, new in [((1, 0, 2), (3, 8)), ((0, 2, 1), (2, 12)), ((0, 2, 1), (8, 3)),
                      ((2, 1, 0), (24,)), ((0, 1, 2), (6, 4)), ((1, 0, 2), (3, 2, 2, 2))]:
        t = torch.from_numpy(a).permute(perm)
        try:
            t.view(new)
            torch_ok = True
        except RuntimeError:
            torch_ok = False
        assert np_can_view(a.transpose(perm), new) == torch_ok


@SETTINGS
@given(st.data())
def test_transpose(data):
    x = data.draw(tensors())
    d0 = data.draw(st.integers(-x.ndim, x.ndim - 1))
    d1 = data.draw(st.integers(-x.ndim, x.ndim - 1))
    with count_allocs() as allocs:
        y = x.transpose(d0, d1)
    check_view(x, y, np.swapaxes(host(x), d0, d1), allocs)


@SETTINGS
@given(st.data())
def test_permute(data):
    x = data.draw(tensors())
    perm = data.draw(st.permutations(range(x.ndim)))
    neg = data.draw(st.booleans())
    dims = [p - x.ndim if neg else p for p in perm]
    with count_allocs() as allocs:
        y = x.permute(*dims)
    check_view(x, y, host(x).transpose(perm), allocs)


@SETTINGS
@given(st.data())
def test_T_and_mT(data):
    x = data.draw(tensors())
    with count_allocs() as allocs:
        y = x.T
    check_view(x, y, host(x).T, allocs)
    if x.ndim >= 2:
        with count_allocs() as allocs:
            z = x.mT
        check_view(x, z, np.swapaxes(host(x), -2, -1), allocs)


@SETTINGS
@given(st.data())
def test_basic_indexing(data):
    x = data.draw(tensors())
    index = data.draw(basic_index(x.shape))
    with count_allocs() as allocs:
        y = x[index]
    check_view(x, y, np_view(host(x), index), allocs)
    assert_same_geometry(y, np_view(host(x), index), host(x))


def _pieces(arr, d, sizes):
    out, start = [], 0
    for s in sizes:
        out.append(arr[(slice(None),) * d + (slice(start, start + s),)])
        start += s
    return out


@SETTINGS
@given(st.data())
def test_split(data):
    x = data.draw(tensors())
    d = data.draw(st.integers(-x.ndim, x.ndim - 1))
    n = x.shape[d]
    if data.draw(st.booleans()):
        size = data.draw(st.integers(1, n + 1))
        arg = size
        sizes = [min(size, n - s) for s in range(0, n, size)]
    else:
        cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
        arg = sizes
    with count_allocs() as allocs:
        parts = x.split(arg, d)
    check_view(x, list(parts), _pieces(host(x), d % x.ndim, sizes), allocs)


@SETTINGS
@given(st.data())
def test_chunk(data):
    x = data.draw(tensors())
    d = data.draw(st.integers(-x.ndim, x.ndim - 1))
    chunks = data.draw(st.integers(1, 6))
    n = x.shape[d]
    step = -(-n // chunks)  # PyTorch: pieces of ceil(n / chunks), the last one shorter
    sizes = [min(step, n - s) for s in range(0, n, step)]
    with count_allocs() as allocs:
        parts = x.chunk(chunks, d)
    check_view(x, list(parts), _pieces(host(x), d % x.ndim, sizes), allocs)


def test_chunk_sizes_agree_with_torch():
    """The sizes test_chunk expects are PyTorch's, including chunk counts that leave fewer
    pieces than asked for (6 into 4 chunks: 2, 2, 2)."""
    torch = pytest.importorskip("torch")
    for n in range(1, 13):
        for chunks in range(1, 8):
            step = -(-n // chunks)
            sizes = [min(step, n - s) for s in range(0, n, step)]
            assert [len(p) for p in torch.arange(n).chunk(chunks)] == sizes, (n, chunks)
            assert [p.shape[0] for p in ta.arange(n).chunk(chunks)] == sizes, (n, chunks)


@SETTINGS
@given(st.data())
def test_unbind(data):
    x = data.draw(tensors())
    d = data.draw(st.integers(-x.ndim, x.ndim - 1))
    with count_allocs() as allocs:
        parts = x.unbind(d)
    arr = host(x)
    expected = [np_view(arr, (slice(None),) * (d % x.ndim) + (i,)) for i in range(x.shape[d])]
    check_view(x, list(parts), expected, allocs)


@SETTINGS
@given(st.data())
def test_expand_and_broadcast_to(data):
    x = data.draw(tensors())
    lead = data.draw(st.lists(st.integers(1, 5), max_size=2))
    target = list(lead)
    for n in x.shape:
        new = st.integers(1, 5) if n == 1 else st.sampled_from([n, -1])
        target.append(data.draw(new))
    full = tuple(lead) + tuple(n if t == -1 else t for n, t in zip(x.shape, target[len(lead):]))
    expected = np.broadcast_to(host(x), full)
    with count_allocs() as allocs:
        y = x.expand(*target)
        z = x.broadcast_to(full)
    check_view(x, [y, z], [expected, expected], allocs)
    assert_same_geometry(y, expected, host(x))


@SETTINGS
@given(st.data())
def test_squeeze(data):
    x = data.draw(tensors())
    arr = host(x)
    how = data.draw(st.sampled_from(["none", "int", "tuple"]))
    if how == "none":
        dim, expected = None, np.squeeze(arr)
    elif how == "tuple":
        dims = data.draw(st.lists(st.integers(0, x.ndim - 1), unique=True, max_size=x.ndim))
        dim = tuple(dims)
        expected = np.squeeze(arr, tuple(d for d in dims if x.shape[d] == 1))
    else:
        dim = data.draw(st.integers(-x.ndim, x.ndim - 1))
        expected = np.squeeze(arr, dim) if x.shape[dim] == 1 else arr  # PyTorch: a no-op
    with count_allocs() as allocs:
        y = x.squeeze(dim)
    check_view(x, y, expected, allocs)


@SETTINGS
@given(st.data())
def test_unsqueeze(data):
    x = data.draw(tensors())
    dim = data.draw(st.integers(-x.ndim - 1, x.ndim))
    with count_allocs() as allocs:
        y = x.unsqueeze(dim)
    check_view(x, y, np.expand_dims(host(x), dim), allocs)


@SETTINGS
@given(st.data())
def test_flatten(data):
    x = data.draw(tensors())
    s = data.draw(st.integers(0, x.ndim - 1))
    e = data.draw(st.integers(s, x.ndim - 1))
    shape = x.shape[:s] + (int(np.prod(x.shape[s:e + 1])),) + x.shape[e + 1:]
    s_arg = s - x.ndim if data.draw(st.booleans()) else s
    with count_allocs() as allocs:
        y = x.flatten(s_arg, e)
    check_view(x, y, host(x).reshape(shape), allocs)


@SETTINGS
@given(st.data())
def test_narrow(data):
    x = data.draw(tensors())
    d = data.draw(st.integers(-x.ndim, x.ndim - 1))
    n = x.shape[d]
    start = data.draw(st.integers(0, n))
    length = data.draw(st.integers(0, n - start))
    with count_allocs() as allocs:
        y = x.narrow(d, start, length)
    expected = host(x)[(slice(None),) * (d % x.ndim) + (slice(start, start + length),)]
    check_view(x, y, expected, allocs)


@SETTINGS
@given(st.data())
def test_as_strided(data):
    base = data.draw(tensors())
    # as_strided is relative to the storage, so start from a view with an offset
    x = base[tuple(slice(data.draw(st.integers(0, n - 1)), None) for n in base.shape)]
    buf = base.untyped_storage().buffer
    size = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    stride = data.draw(st.lists(st.integers(0, 3), min_size=len(size), max_size=len(size)))
    while sum((n - 1) * s for n, s in zip(size, stride)) + 1 > buf.size:
        i = max(range(len(size)), key=lambda k: (size[k] - 1) * stride[k])
        stride[i] = 0
    need = sum((n - 1) * s for n, s in zip(size, stride)) + 1
    if data.draw(st.booleans()):
        offset = data.draw(st.integers(0, buf.size - need))
        start = offset
    else:
        offset = None
        start = x.storage_offset()
        size[-1] = 1 if start + need > buf.size else size[-1]
        need = sum((n - 1) * s for n, s in zip(size, stride)) + 1
        if start + need > buf.size:
            stride = [0] * len(stride)
    with count_allocs() as allocs:
        y = x.as_strided(size, stride, offset)
    item = buf.itemsize
    expected = np.lib.stride_tricks.as_strided(
        buf[start:], shape=tuple(size), strides=tuple(s * item for s in stride)
    )
    check_view(base, y, expected, allocs)
    assert y.stride() == tuple(stride) and y.storage_offset() == start


# ----------------------------------------------------------------------------- composition
def _random_view_step(data, t, arr):
    """One random view op applied to both the tensor and its NumPy mirror."""
    kind = data.draw(st.sampled_from(
        ["permute", "transpose", "index", "unsqueeze", "squeeze", "expand", "narrow", "mT"]
    ))
    nd = t.ndim
    if kind == "permute" and nd:
        perm = data.draw(st.permutations(range(nd)))
        return t.permute(perm), arr.transpose(perm)
    if kind == "transpose" and nd:
        d0, d1 = data.draw(st.integers(0, nd - 1)), data.draw(st.integers(0, nd - 1))
        return t.transpose(d0, d1), np.swapaxes(arr, d0, d1)
    if kind == "index" and nd:
        index = data.draw(basic_index(t.shape))
        return t[index], np_view(arr, index)
    if kind == "unsqueeze" and nd < 5:
        d = data.draw(st.integers(0, nd))
        return t.unsqueeze(d), np.expand_dims(arr, d)
    if kind == "squeeze" and 1 in t.shape:
        d = t.shape.index(1)
        return t.squeeze(d), np.squeeze(arr, d)
    if kind == "expand" and 1 in t.shape:
        d = t.shape.index(1)
        n = data.draw(st.integers(1, 4))
        shape = t.shape[:d] + (n,) + t.shape[d + 1:]
        return t.expand(shape), np.broadcast_to(arr, shape)
    if kind == "narrow" and nd and t.shape[0]:
        start = data.draw(st.integers(0, t.shape[0] - 1))
        length = data.draw(st.integers(1, t.shape[0] - start))
        return t.narrow(0, start, length), arr[start:start + length]
    if kind == "mT" and nd >= 2:
        return t.mT, np.swapaxes(arr, -2, -1)
    return t, arr


@SETTINGS
@given(st.data())
def test_views_of_views_compose(data):
    x = data.draw(tensors())
    base = host(x)
    t, arr = x, base
    with count_allocs() as allocs:
        for _ in range(data.draw(st.integers(2, 5))):
            t, arr = _random_view_step(data, t, arr)
            assert_same_geometry(t, arr, base)
    check_view(x, t, arr, allocs)
    assert t.data_ptr() == arr.__array_interface__["data"][0] or arr.size == 0


# ----------------------------------------------------------------------------- copies
@SETTINGS
@given(st.data())
def test_contiguous_copies_once_or_returns_self(data):
    x = data.draw(tensors())
    perm = data.draw(st.permutations(range(x.ndim)))
    xp = x.permute(perm)
    ref = host(xp)
    with count_allocs() as allocs:
        y = xp.contiguous()
    np.testing.assert_array_equal(host(y), ref)
    assert y.is_contiguous()
    if ref.flags.c_contiguous:  # permuting only size-1 dims leaves it contiguous
        assert xp.is_contiguous()
        assert y is xp and allocs == []
    else:
        assert not xp.is_contiguous()
        assert len(allocs) == 1
        assert allocs[0].nbytes == x.numel() * x.itemsize
        assert allocs[0].copy_reason == "contiguous"
        assert y.untyped_storage() is allocs[0] and not y.shares_storage(x)
        assert y.stride() == tuple(s // ref.itemsize for s in np.ascontiguousarray(ref).strides)


@SETTINGS
@given(st.data())
def test_contiguous_of_any_view(data):
    x = data.draw(tensors())
    t, arr = x, host(x)
    for _ in range(data.draw(st.integers(1, 4))):
        t, arr = _random_view_step(data, t, arr)
    if arr.size == 0:  # empty tensors: see test_empty_tensor_is_contiguous
        return
    with count_allocs() as allocs:
        y = t.contiguous()
    np.testing.assert_array_equal(host(y), arr)
    assert y.is_contiguous()
    if arr.flags.c_contiguous:
        assert y is t and allocs == []
    else:
        assert [(s.nbytes, s.copy_reason) for s in allocs] == [
            (arr.size * x.itemsize, "contiguous")
        ]
        assert not y.shares_storage(x)


def test_empty_tensor_is_contiguous(device):
    # as in PyTorch (and NumPy's flags), a tensor with no elements is contiguous whatever
    # its strides, so contiguous() has nothing to copy
    x = make((2, 3), device=device)
    for e in (x[:, :0], x.T[:, :0], x[:0]):
        assert e.numel() == 0
        assert e.is_contiguous()
        with count_allocs() as allocs:
            y = e.contiguous()
        assert y.is_contiguous() and y.shape == e.shape
        assert y is e and allocs == []


def test_contiguous_returns_self_when_contiguous(device):
    x = make((2, 3, 4), device=device)
    with count_allocs() as allocs:
        assert x.contiguous() is x
        v = x[1]
        assert v.contiguous() is v
    assert allocs == []


def test_contiguous_on_transpose_allocates_exactly_numel_bytes(device):
    x = make((3, 5), dtype=np.float64, device=device)
    with count_allocs() as allocs:
        y = x.T.contiguous()
    assert [(s.nbytes, s.copy_reason) for s in allocs] == [(15 * 8, "contiguous")]
    np.testing.assert_array_equal(host(y), np.arange(15.0).reshape(3, 5).T)
    assert y.stride() == (3, 1)


def test_reshape_of_non_viewable_copies_once(device):
    x = make((2, 3, 4), device=device)
    xt = x.transpose(0, 2)  # (4, 3, 2), strides (1, 4, 12)
    with count_allocs() as allocs:
        y = xt.reshape(12, 2)
    assert len(allocs) == 1
    assert allocs[0].copy_reason == "reshape-copy"
    assert allocs[0].nbytes == 24 * 4
    assert not y.shares_storage(x)
    np.testing.assert_array_equal(host(y), host(xt).reshape(12, 2))
    with count_allocs() as allocs:
        z = x.transpose(1, 2).reshape(2, 12)  # (2, 4, 3), strides (12, 1, 4): no merge
    assert [s.copy_reason for s in allocs] == ["reshape-copy"]
    np.testing.assert_array_equal(host(z), host(x).transpose(0, 2, 1).reshape(2, 12))
    # a reshape that is a view does not copy, even from a transposed tensor
    with count_allocs() as allocs:
        z = x.transpose(0, 1).reshape(3, 2, 2, 2)  # splits the contiguous last dim only
    assert allocs == [] and z.shares_storage(x)
    np.testing.assert_array_equal(host(z), host(x).transpose(1, 0, 2).reshape(3, 2, 2, 2))


def test_view_on_incompatible_strides_raises(device):
    x = make((2, 3, 4), device=device)
    with pytest.raises(ta.ShapeError, match=r"view.*reshape.*contiguous") as info:
        x.transpose(0, 2).view(24)
    msg = str(info.value)
    assert "(4, 3, 2)" in msg and "(24,)" in msg
    with pytest.raises(ta.ShapeError, match=r"reshape.*contiguous"):
        x.mT.view(2, 12)
    # the advertised fixes work
    assert x.transpose(0, 2).contiguous().view(24).shape == (24,)
    assert x.transpose(0, 2).reshape(24).shape == (24,)


# ----------------------------------------------------------------------------- slice grads
B, T, C = 2, 5, 4
# Byte sizes (float32): qkv (B,T,3C) = 480. Every other buffer backward may make has a
# different size: (B,T,C) grads of q, k, v, x = 160, (B,T,T) attention grads = 200, w's
# grad (C,3C) = 192 and, if matmul computes it batched, the (B,C,3C) x^T @ g summed over
# the batch afterwards = 384. So a buffer of exactly 480 bytes can only be the one
# base-sized gradient of qkv into which the three slice gradients are written.
QKV_BYTES = B * T * 3 * C * 4


def _attention_loss(q, k, v, r):
    att = (q @ k.mT).softmax(-1)
    return ((att @ v) * r).sum()


def _torch_grads(x, w, r):
    torch = pytest.importorskip("torch")
    xt = torch.from_numpy(host(x)).requires_grad_()
    wt = torch.from_numpy(host(w)).requires_grad_()
    qkv = xt @ wt
    q, k, v = qkv.split(C, -1)
    _attention_loss(q, k, v, torch.from_numpy(host(r))).backward()
    return xt.grad.numpy(), wt.grad.numpy()


@pytest.mark.parametrize("how", ["slices", "split", "chunk", "narrow"])
def test_slices_of_one_base_share_one_gradient_buffer(how, device):
    assert len({QKV_BYTES, B * T * C * 4, B * T * T * 4, B * C * 3 * C * 4, C * 3 * C * 4}) == 5
    ta.manual_seed(0)
    x = ta.randn(B, T, C, requires_grad=True, device=device)
    w = ta.randn(C, 3 * C, requires_grad=True, device=device)
    r = ta.randn(B, T, C, device=device)
    qkv = x @ w
    assert qkv.nbytes == QKV_BYTES
    if how == "slices":
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    elif how == "split":
        q, k, v = qkv.split(C, -1)
    elif how == "chunk":
        q, k, v = qkv.chunk(3, -1)
    else:
        q, k, v = (qkv.narrow(-1, i * C, C) for i in range(3))
    for p in (q, k, v):
        assert p.shares_storage(qkv)
    loss = _attention_loss(q, k, v, r)
    with count_allocs() as allocs:
        loss.backward()
    qkv_sized = [s for s in allocs if s.nbytes == QKV_BYTES]
    # exactly one base-sized buffer receives all three slice gradients (matmul's backward
    # then reads it; it allocates nothing of that size, see the byte sizes above)
    assert len(qkv_sized) == 1, [(s.nbytes, s.op, s.copy_reason) for s in allocs]
    # the same function with no slices of one base: q, k, v each their own matmul
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    q2, k2, v2 = (x2 @ w2[:, i * C:(i + 1) * C].contiguous() for i in range(3))
    _attention_loss(q2, k2, v2, r).backward()
    np.testing.assert_allclose(host(x.grad), host(x2.grad), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(w.grad), host(w2.grad), rtol=1e-5, atol=1e-6)


def test_slice_gradients_match_torch():
    ta.manual_seed(0)
    x = ta.randn(B, T, C, requires_grad=True)
    w = ta.randn(C, 3 * C, requires_grad=True)
    r = ta.randn(B, T, C)
    gx, gw = _torch_grads(x, w, r)
    q, k, v = (x @ w).split(C, -1)
    _attention_loss(q, k, v, r).backward()
    np.testing.assert_allclose(host(x.grad), gx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(host(w.grad), gw, rtol=1e-4, atol=1e-5)


def test_two_overlapping_slices_one_buffer_and_right_values(device):
    base = ta.randn(4, 6, requires_grad=True, device=device)
    h = base * 2  # a non-leaf base of 96 bytes
    a, b, c = h[:, :4], h[:, 2:], h[1:3]
    loss = (a * 1.0).sum() + (b * 2.0).sum() + (c * 3.0).sum()
    with count_allocs() as allocs:
        loss.backward()
    assert sum(1 for s in allocs if s.nbytes == 96 and s.copy_reason == "slice-grad") == 1
    expected = np.zeros((4, 6), np.float32)
    expected[:, :4] += 1
    expected[:, 2:] += 2
    expected[1:3] += 3
    np.testing.assert_array_equal(host(base.grad), 2 * expected)
