"""The bounds rule of views (shape.check_view), against torch: every view a constructor
accepts reads only its own storage, every one it refuses raises the error torch raises
(naming the op and the geometry), and an empty view touches nothing, so it is valid at any
offset and with any strides."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
from tinygrad_attn import shape as shp
from tinygrad_attn.errors import ShapeError

SETTINGS = settings(max_examples=150, deadline=None)


def _extent_inside(t) -> bool:
    """Whether every position the view reads lies in its storage (empty views read none)."""
    if t.numel() == 0:
        return t.storage_offset() >= 0
    low = high = t.storage_offset()
    for n, s in zip(t.shape, t.stride()):
        if s > 0:
            high += (n - 1) * s
        else:
            low += (n - 1) * s
    return 0 <= low and high < t.untyped_storage().size


def _same_view(ours, theirs, steps=()) -> None:
    assert tuple(ours.shape) == tuple(theirs.shape), steps
    # torch counts strides in int64, which wraps (unfold with a huge step on a size-1 dim);
    # the engine's are Python ints: the same modulo 2**64
    assert all((a - b) % 2**64 == 0 for a, b in zip(ours.stride(), theirs.stride())), (
        ours.stride(), theirs.stride(), steps)
    assert ours.storage_offset() == theirs.storage_offset(), steps
    assert _extent_inside(ours), steps
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def _both(fn):
    """fn(lib) in torch and here: the same view, or the same kind of error."""
    torch = pytest.importorskip("torch")
    try:
        theirs = fn(torch)
    except (RuntimeError, IndexError, ValueError) as e:
        kind = IndexError if isinstance(e, IndexError) else RuntimeError
        with pytest.raises(kind) as info:
            fn(ta)
        return None, info.value
    ours = fn(ta)
    _same_view(ours, theirs)
    return ours, None


def _arange(lib, n):
    return lib.arange(n, dtype=lib.float32)


def _empty(lib, *shape):
    """An empty tensor made as a view of an empty arange (with torch's contiguous strides,
    as the factories' empty tensors have them too)."""
    return _arange(lib, 1)[:0].view(*shape)


# ----------------------------------------------------------------------------- fixed cases
ACCEPTED = {
    # an empty view touches nothing: any offset, any strides, any sizes beside the 0
    "as_strided_empty_far_offset": lambda lib: _arange(lib, 4).as_strided((0,), (1,), 100),
    "as_strided_empty_huge_stride": lambda lib: _arange(lib, 4).as_strided((0, 3), (2**40, 7),
                                                                          9),
    "as_strided_size1_huge_stride": lambda lib: _arange(lib, 4).as_strided((1,), (2**62,), 3),
    "as_strided_stride0": lambda lib: _arange(lib, 4).as_strided((2, 3), (0, 1), 1),
    "as_strided_last_element": lambda lib: _arange(lib, 4).as_strided((2,), (1,), 2),
    "slice_huge_step": lambda lib: _arange(lib, 4)[::2**62],
    "slice_huge_start": lambda lib: _arange(lib, 4)[2**62:],
    "slice_huge_stop": lambda lib: _arange(lib, 4)[1:2**62],
    "empty_slice_keeps_offset": lambda lib: _arange(lib, 12).view(3, 4)[3:, 1:],
    "empty_slice_of_empty": lambda lib: _arange(lib, 12).view(3, 4)[:, 4:],
    "split_piece_of_empty": lambda lib: _empty(lib, 0, 8, 48).split(16, dim=2)[1],
    "narrow_at_end": lambda lib: _arange(lib, 4).narrow(0, 4, 0),
    "expand_to_zero": lambda lib: _arange(lib, 1).expand(0),
    "expand_keep_empty": lambda lib: _empty(lib, 0).expand(-1),
    "expand_empty_lead": lambda lib: _arange(lib, 3).expand(0, 3),
    "view_empty": lambda lib: _empty(lib, 0).view(0, 2**40),
    "view_empty_inferred": lambda lib: _empty(lib, 4, 0).view(-1),
    "unfold_huge_step": lambda lib: _arange(lib, 4).unfold(0, 2, 2**62),
    "unfold_empty_window": lambda lib: _arange(lib, 4).unfold(0, 0, 1),
    "diagonal_past_the_corner": lambda lib: _arange(lib, 12).view(3, 4).diagonal(5),
    "diagonal_of_empty": lambda lib: _empty(lib, 0, 3, 4).diagonal(1, 1, 2),
}

REFUSED = {
    # (fn, op named in the message, what else the message names)
    "as_strided_negative_offset": (lambda lib: _arange(lib, 4).as_strided((3,), (1,), -1),
                                   "as_strided", "offset -1"),
    "as_strided_empty_negative_offset": (
        lambda lib: _arange(lib, 4).as_strided((0,), (1,), -1), "as_strided", "offset -1"),
    "as_strided_past_the_end": (lambda lib: _arange(lib, 4).as_strided((3,), (2,), 0),
                                "as_strided", "storage of 4 elements"),
    "as_strided_offset_past_the_end": (lambda lib: _arange(lib, 4).as_strided((2,), (1,), 3),
                                       "as_strided", "offset 3"),
    "as_strided_huge": (lambda lib: _arange(lib, 4).as_strided((2**62, 2**62), (1, 1)),
                        "as_strided", "(4611686018427387904, 4611686018427387904)"),
    "as_strided_huge_offset": (lambda lib: _arange(lib, 4).as_strided((2,), (1,), 2**63 - 1),
                               "as_strided", "storage of 4 elements"),
    "as_strided_negative_size": (lambda lib: _arange(lib, 4).as_strided((-1,), (1,)),
                                 "as_strided", "(-1,)"),
    "as_strided_negative_stride": (lambda lib: _arange(lib, 4).as_strided((3,), (-1,), 2),
                                   "as_strided", "(-1,)"),
    "as_strided_ranks_differ": (lambda lib: _arange(lib, 4).as_strided((2, 3), (1,)),
                                "as_strided", "(2, 3)"),
    "expand_negative": (lambda lib: _arange(lib, 1).expand(-5), "expand", "-5"),
    "expand_negative_existing": (lambda lib: _arange(lib, 2).expand(-5), "expand", "-5"),
    "expand_minus_one_leading": (lambda lib: _arange(lib, 1).expand(-1, 2), "expand", "-1"),
    "expand_negative_leading": (lambda lib: _arange(lib, 1).expand(-2, 1), "expand", "-2"),
    "view_empty_ambiguous": (lambda lib: _empty(lib, 4, 0).view(-1, 3, 0), "view",
                             "(-1, 3, 0)"),
    "view_negative": (lambda lib: _arange(lib, 4).view(-2, 2), "view", "(-2, 2)"),
    "unfold_too_big": (lambda lib: _arange(lib, 4).unfold(0, 5, 1), "unfold", "5"),
    "narrow_start_out_of_range": (lambda lib: _arange(lib, 4).narrow(0, 5, 0), "narrow", "5"),
    "index_out_of_range": (lambda lib: _arange(lib, 4)[4], "getitem", "4"),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_views_match_torch(name):
    ours, error = _both(ACCEPTED[name])
    assert error is None, f"refused where torch accepts: {error}"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_views_raise_torchs_error_naming_the_op(name):
    fn, op_name, detail = REFUSED[name]
    ours, error = _both(fn)
    assert ours is None, "accepted where torch refuses"
    assert op_name in str(error) and detail in str(error), str(error)


def test_empty_views_compute_like_torch():
    """The cases that raised NumPy's errors: an empty view far past its storage, an empty
    split piece through an op, a huge step, all give torch's results."""
    torch = pytest.importorskip("torch")
    assert _arange(ta, 4).as_strided((0,), (1,), 100).sum().item() == 0.0
    piece = (ta.randn(0, 8, 16) @ ta.randn(16, 48)).split(16, dim=2)[1] + 1
    ref = (torch.randn(0, 8, 16) @ torch.randn(16, 48)).split(16, dim=2)[1] + 1
    assert piece.shape == tuple(ref.shape) == (0, 8, 16)
    assert _arange(ta, 4)[::2**62].tolist() == [0.0]
    # a gradient through an empty view far past the end: zeros of the leaf's shape
    x = ta.zeros(0, 8, 48, requires_grad=True)
    x.split(16, dim=2)[1].sum().backward()
    assert x.grad.shape == (0, 8, 48)
    y = ta.arange(12.0, requires_grad=True)
    y.as_strided((0, 3), (1, 2**40), 11).sum().backward()
    assert y.grad.tolist() == [0.0] * 12
    h = ta.arange(4, dtype=ta.float16).requires_grad_()  # 2**60 int64 positions: too many
    h.as_strided((0, 2**60), (1, 1), 2).sum().backward()
    assert h.grad.tolist() == [0.0] * 4


def test_empty_results_have_contiguous_strides():
    assert ta.zeros(0, 3, 4).stride() == (12, 4, 1)
    assert (ta.randn(3, 0) + 1).stride() == (1, 1)


def test_empty_views_too_large_for_an_array_are_refused_clearly():
    """NumPy cannot hold an array whose nonzero sizes times the itemsize pass 2**63 bytes:
    the view is refused at the call, naming the op and the size (a deliberate difference:
    torch accepts these shapes)."""
    with pytest.raises(ShapeError, match=r"view: size \(0, 4611686018427387904\) is too large"):
        ta.zeros(0).view(0, 2**62)
    with pytest.raises(RuntimeError, match=r"expand: size \(4611686018427387904,\) is too"):
        ta.zeros(1).expand(2**62)
    assert ta.zeros(0, dtype=ta.uint8).view(0, 2**62).shape == (0, 2**62)  # fits in bytes


def test_check_view_is_the_rule():
    check = shp.check_view
    check("op", (0, 5), (10**30, -7), 10**6, 0, 4)  # empty: touches nothing
    check("op", (2, 2), (-1, 2), 1, 4, 4)  # positions 0..3
    with pytest.raises(ShapeError, match="op: size"):
        check("op", (2, 2), (-2, 2), 1, 4, 4)  # position -1
    with pytest.raises(ShapeError, match="invalid storage offset -1"):
        check("op", (0,), (1,), -1, 4, 4)
    with pytest.raises(ShapeError, match="invalid size -1"):
        check("op", (2, -1), (1, 1), 0, 4, 4)
    with pytest.raises(ShapeError, match="elements 2 to 4, out of bounds for a storage of 4"):
        check("op", (3,), (1,), 2, 4, 4)


# ----------------------------------------------------------------------------- hypothesis
@SETTINGS
@given(st.integers(0, 12), st.data())
def test_as_strided_random_geometry_matches_torch(storage, data):
    ndim = data.draw(st.integers(0, 3))
    size = tuple(data.draw(st.lists(st.integers(-1, 4), min_size=ndim, max_size=ndim)))
    stride = tuple(data.draw(st.lists(st.integers(-2, 6), min_size=ndim, max_size=ndim)))
    offset = data.draw(st.integers(-2, 16))
    if any(n < 0 for n in size) and 0 in size:
        # torch makes a tensor of shape (0, -1) here (it skips its size check when the
        # element count is 0); a negative size is refused whatever the other sizes
        with pytest.raises(ShapeError, match=r"as_strided: (invalid|negative)"):
            _arange(ta, storage).as_strided(size, stride, offset)
        return
    ours, error = _both(lambda lib: _arange(lib, storage).as_strided(size, stride, offset))
    if error is not None:
        assert "as_strided" in str(error) and (str(size) in str(error) or
                                                str(stride) in str(error))


# One random step of a chain of view ops, the same in both libraries: (name, fn(lib, t)).
def _step(data, shape):
    ndim = len(shape)
    kinds = ["as_strided", "expand", "view", "unsqueeze"]
    if ndim:
        kinds += ["slice", "narrow", "transpose", "split", "unfold", "squeeze", "index"]
    if ndim >= 2:
        kinds.append("diagonal")
    kind = data.draw(st.sampled_from(kinds))
    dim = data.draw(st.integers(-ndim, ndim - 1)) if ndim else 0
    n = shape[dim] if ndim else 1
    if kind == "slice":
        start = data.draw(st.one_of(st.none(), st.integers(-6, 6), st.just(2**62)))
        stop = data.draw(st.one_of(st.none(), st.integers(-6, 6), st.just(2**62)))
        step = data.draw(st.one_of(st.none(), st.integers(1, 4), st.just(2**62)))
        index = (slice(None),) * (dim % ndim) + (slice(start, stop, step),)
        return f"getitem {index}", lambda lib, t: t[index]
    if kind == "index":
        i = data.draw(st.integers(-n - 1, n))
        index = (slice(None),) * (dim % ndim) + (i,)
        return f"getitem {index}", lambda lib, t: t[index]
    if kind == "narrow":
        start = data.draw(st.integers(-n - 1, n + 1))
        # start + length past the end is torch's RuntimeError and the engine's IndexError:
        # the chains keep to lengths that fit
        length = data.draw(st.integers(0, max(0, n - (start % (n + 1) if start < 0 else start))))
        return f"narrow {dim, start, length}", lambda lib, t: t.narrow(dim, start, length)
    if kind == "transpose":
        other = data.draw(st.integers(-ndim, ndim - 1))
        return f"transpose {dim, other}", lambda lib, t: t.transpose(dim, other)
    if kind == "split":
        size = data.draw(st.integers(1, 4))
        pieces = -(-n // size) if n else 1
        k = data.draw(st.integers(0, pieces - 1))
        return f"split {size, dim}[{k}]", lambda lib, t: t.split(size, dim=dim)[k]
    if kind == "unfold":
        size = data.draw(st.integers(0, n + 1))
        step = data.draw(st.one_of(st.integers(1, 3), st.just(2**62)))
        return f"unfold {dim, size, step}", lambda lib, t: t.unfold(dim, size, step)
    if kind == "squeeze":
        return f"squeeze {dim}", lambda lib, t: t.squeeze(dim)
    if kind == "unsqueeze":
        d = data.draw(st.integers(-ndim - 1, ndim))
        return f"unsqueeze {d}", lambda lib, t: t.unsqueeze(d)
    if kind == "diagonal":
        k = data.draw(st.integers(-4, 4))
        d2 = data.draw(st.integers(-ndim, ndim - 1).filter(lambda d: d % ndim != dim % ndim))
        return f"diagonal {k, dim, d2}", lambda lib, t: t.diagonal(k, dim, d2)
    if kind == "expand":
        sizes = []
        for s in shape:
            sizes.append(data.draw(st.sampled_from([s, -1, 0, 2, -3]) if s == 1 else
                                   st.sampled_from([s, -1, s + 1])))
        lead = data.draw(st.lists(st.integers(-2, 2), max_size=2))
        new = tuple(lead) + tuple(sizes)
        return f"expand {new}", lambda lib, t: t.expand(new)
    if kind == "view":
        numel = shp.numel(shape)
        new = data.draw(st.sampled_from([(numel,), (-1,), (1, numel), (numel, -1), (0, -1),
                                         (-2, 1)] + ([(0, 5)] if numel == 0 else [])))
        return f"view {new}", lambda lib, t: t.view(new)
    ndim_new = data.draw(st.integers(0, 3))
    size = tuple(data.draw(st.lists(st.integers(0, 3), min_size=ndim_new, max_size=ndim_new)))
    stride = tuple(data.draw(st.lists(st.integers(0, 5), min_size=ndim_new,
                                      max_size=ndim_new)))
    offset = data.draw(st.one_of(st.none(), st.integers(-1, 14)))
    return (f"as_strided {size, stride, offset}",
            lambda lib, t: t.as_strided(size, stride, offset))


@SETTINGS
@given(st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple), st.data())
def test_random_chains_of_views_stay_inside_their_storage(shape, data):
    """Each step: torch and the engine give the same view (shape, strides, offset, values)
    and the engine's reads stay in its storage, or both refuse it and the engine's error
    names the op. The chain stops at the first refusal."""
    torch = pytest.importorskip("torch")
    numel = shp.numel(shape)
    ours, theirs = (_arange(lib, max(numel, 1))[:numel].view(shape) for lib in (ta, torch))
    steps = []
    for _ in range(data.draw(st.integers(1, 5))):
        name, fn = _step(data, tuple(ours.shape))
        steps.append(name)
        try:
            theirs = fn(torch, theirs)
        except (RuntimeError, IndexError, ValueError) as e:
            if str(2**62) in name:
                # torch's strides are int64: a huge step times a stride past 2**63 overflows
                # (an error, or a negative stride); the engine's are Python ints, and the
                # dim the step made has size 1, so it never moves
                try:
                    ours = fn(ta, ours)
                except (RuntimeError, IndexError) as ours_error:
                    assert name.split()[0] in str(ours_error), (steps, str(ours_error))
                    return
                assert _extent_inside(ours), steps
                assert ours.numpy().shape == ours.shape
                return
            kind = IndexError if isinstance(e, IndexError) else RuntimeError
            try:
                fn(ta, ours)
            except kind as ours_error:
                assert name.split()[0] in str(ours_error), (steps, str(ours_error))
                return
            raise AssertionError(f"{steps} on {tuple(ours.shape)}: torch raised {e!r}, "
                                 "the engine did not") from None
        if any(n < 0 for n in theirs.shape):
            # torch skips its size checks when a 0 is among the sizes and makes a tensor
            # of shape (0, -1); the engine refuses a negative size whatever the others
            with pytest.raises(ShapeError, match="invalid size"):
                fn(ta, ours)
            return
        ours = fn(ta, ours)
        _same_view(ours, theirs, steps)
        if str(2**62) in name:  # torch's int64 strides may have wrapped: stop comparing
            return
