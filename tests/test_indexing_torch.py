"""x[index] and x[index] = v against torch 2.13's rules: where advanced-index dims go, bool
masks checked against the indexed shape, index dtypes, bounds, tuples and lists; and the
bounds checks of gather, index_select and embedding."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinygrad_attn as ta
import tinygrad_attn.functional as F


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _both(torch, shape):
    data = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return ta.tensor(data), torch.tensor(data)


def _to(lib, item):
    """An index item for `lib` (ta or torch): arrays become that library's tensors."""
    if isinstance(item, np.ndarray):
        return ta.tensor(item) if lib == "ta" else __import__("torch").from_numpy(item)
    if isinstance(item, tuple):
        return tuple(_to(lib, i) for i in item)
    return item


IDX = np.array([0, 1])
CASES = [  # (shape, index): each read against torch for shape and values
    ((2, 5, 6, 5), (1, slice(None), IDX, 0)),  # NumPy gives (2, 5); torch (5, 2)
    ((2, 5, 6, 5), (IDX, None, IDX)),
    ((2, 5, 6, 5), (IDX, slice(None), 0, IDX)),
    ((2, 5, 6, 5), (slice(None), IDX, IDX)),
    ((2, 5, 6, 5), (0, slice(1, None, 2), IDX)),
    ((2, 5, 6, 5), (Ellipsis, IDX, 1)),
    ((2, 5, 6, 5), (True,)),
    ((2, 5, 6, 5), (False,)),
    ((2, 5, 6, 5), (IDX, True)),
    ((2, 5, 6, 5), (IDX, slice(None), True, IDX)),
    ((3, 4), (np.array([True, False, True]),)),
    ((3, 4), (slice(1, None), np.array([True, False, True, True]))),
    ((3, 4), (np.ones((3, 4), dtype=bool),)),
    ((2, 3, 4), (0, np.eye(3, 4, dtype=bool))),
    ((3, 4), (np.array([[0], [2]]), np.array([0, 1, 3]))),
    ((3, 4), (np.array([1, 0, 1], dtype=np.int32),)),
    ((3, 4), (np.array([1, 0, 1], dtype=np.uint8),)),  # uint8 is a mask, as in torch
    ((3, 4), (np.array(True),)),
    ((3, 4), (np.array(2), slice(None), None)),  # a 0-d int tensor is an int
    ((3, 4), (np.array([-1, -3]),)),
    ((3, 4), (np.array([], dtype=np.int64),)),
]


@pytest.mark.parametrize("shape, index", CASES, ids=[str(i) for i in range(len(CASES))])
def test_getitem_matches_torch(torch, shape, index):
    x, tx = _both(torch, shape)
    y, ty = x[_to("ta", index)], tx[_to("torch", index)]
    assert y.shape == tuple(ty.shape)
    np.testing.assert_array_equal(y.numpy(), ty.numpy())


@pytest.mark.parametrize("index", [
    ((0, 1),), (0, (0, 1)), [0, 1], [[0, 1], [1, 2]], [True, False, True], [],
    [0, slice(None)], (0, [2, 0]), [(0, 1)], [None], [[0, 1], [1]],
])
def test_tuples_and_lists_read_as_torch_reads_them(torch, index):
    x, tx = _both(torch, (3, 4))
    y, ty = x[index], tx[index]
    assert y.shape == tuple(ty.shape)
    np.testing.assert_array_equal(y.numpy(), ty.numpy())


def test_int_with_non_adjacent_array_keeps_the_array_dim_in_place():
    y = ta.ones(2, 5, 6, 5)[1, :, ta.tensor([0, 1]), 0]
    assert y.shape == (5, 2)


def test_basic_indexing_is_a_view_that_allocates_nothing():
    x = ta.randn(4, 5, 6)
    before = ta.memory.live_bytes()
    y = x[1, None, ::2, ta.tensor(3)]
    assert y.shares_storage(x) and y.shape == (1, 3)
    assert ta.memory.live_bytes() == before


@pytest.mark.parametrize("index, message", [
    (1.7, "valid indices (got float)"),
    ((0, 2.0), "valid indices (got float)"),
    (1j, "valid indices (got complex)"),
    ([0.5], "list of floats"),
    (ta.tensor([1.0]), "long, int, byte or bool tensors, got float32"),
    (ta.tensor([1], dtype=ta.int8), "long, int, byte or bool tensors, got int8"),
    (ta.tensor([True, False]), "mask (2,) at index 0 does not match the shape of the indexed "
                               "tensor (3, 4) at index 0"),
    ((slice(None), ta.tensor([True, False, True])), "mask (3,) at index 0 does not match the "
                                                   "shape of the indexed tensor (3, 4) at index 1"),
    (ta.ones(3, 3, dtype=ta.bool), "mask (3, 3) at index 1"),
    (ta.tensor([3]), "index 3 is out of bounds for dim 0 with size 3"),
    (ta.tensor([-4]), "index -4 is out of bounds for dim 0 with size 3"),
    ((ta.tensor([0, 1]), ta.tensor([0, 1, 2])), "could not be broadcast together"),
    ((0, 0, 0), "too many indices"),
    ((Ellipsis, Ellipsis), "single ellipsis"),
])
def test_bad_indices_raise_index_error(torch, index, message):
    x = ta.randn(3, 4)
    with pytest.raises(IndexError, match="getitem: " + ".*" + _esc(message)):
        x[index]
    with pytest.raises(IndexError, match="setitem: " + ".*" + _esc(message)):
        x[index] = 1.0
    if not (isinstance(index, tuple) and any(i is Ellipsis for i in index)):  # torch allows ...,...
        tindex = _torch_index(torch, index)
        if not isinstance(tindex, list):  # torch truncates a list of floats; we refuse
            with pytest.raises(IndexError):
                torch.randn(3, 4)[tindex]


def _esc(text):
    import re

    return re.escape(text)


def _torch_index(torch, index):
    if type(index) is ta.Tensor:
        return torch.from_numpy(index.numpy().copy())
    if isinstance(index, tuple):
        return tuple(_torch_index(torch, i) for i in index)
    return index


def test_string_index_is_a_type_error(torch):
    with pytest.raises(TypeError, match="getitem"):
        ta.randn(3)["a"]
    with pytest.raises(TypeError):
        torch.randn(3)["a"]


def test_setitem_out_of_range_is_index_error(torch):
    x = ta.zeros(3, 2)
    with pytest.raises(IndexError, match="setitem: index 5 is out of bounds for dim 0"):
        x[5] = 1.0
    with pytest.raises(IndexError):
        torch.zeros(3, 2)[5] = 1.0


def test_setitem_places_value_as_torch_does(torch):
    x, tx = _both(torch, (2, 3, 4))
    x[0, :, [0, 1]] = ta.ones(3, 2)  # the array dim stays in place: (3, 2), not (2, 3)
    tx[0, :, [0, 1]] = torch.ones(3, 2, dtype=torch.float64)
    np.testing.assert_array_equal(x.numpy(), tx.numpy())
    with pytest.raises(ta.ShapeError, match="setitem"):
        x[0, :, [0, 1]] = ta.ones(2, 3)
    mask = np.array([[True, False, True, False]] * 3)
    x[1, ta.tensor(mask)] = -1.0
    tx[1, torch.from_numpy(mask)] = -1.0
    np.testing.assert_array_equal(x.numpy(), tx.numpy())


def test_gradient_of_mixed_index_matches_torch(torch):
    data = np.random.default_rng(0).standard_normal((2, 5, 6, 5))
    x = ta.tensor(data, requires_grad=True)
    tx = torch.tensor(data, requires_grad=True)
    index = (1, slice(None), np.array([0, 2, 0]), slice(0, 4, 3))
    y, ty = x[_to("ta", index)], tx[_to("torch", index)]
    w = np.random.default_rng(1).standard_normal(tuple(ty.shape))
    (y * ta.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


# ----------------------------------------------------------------------------- gather & co
def test_gather_refuses_negative_and_out_of_range_indices(torch):
    x = ta.randn(3, 4)
    for bad in ([[3]], [[-1]]):
        with pytest.raises(RuntimeError, match=r"gather: index -?\d is out of range for dim 0"):
            x.gather(0, ta.tensor(bad))
        with pytest.raises(RuntimeError):
            torch.randn(3, 4).gather(0, torch.tensor(bad))
    with pytest.raises(RuntimeError, match="gather: expected dtype int32 or int64"):
        x.gather(0, ta.tensor([[1.0]]))
    assert x.gather(0, ta.tensor([[2]], dtype=ta.int32)).item() == x[2, 0].item()


def test_index_select_refuses_negative_indices(torch):
    x = ta.randn(3, 4)
    with pytest.raises(IndexError, match="index_select: index -1 is out of range"):
        x.index_select(0, ta.tensor([-1]))
    with pytest.raises(IndexError):
        torch.randn(3, 4).index_select(0, torch.tensor([-1]))
    with pytest.raises(RuntimeError, match="index_select: expected dtype int32 or int64"):
        x.index_select(0, ta.tensor([True]))


@pytest.mark.parametrize("bad", [[3], [-1], [[0, 5]]])
def test_embedding_refuses_out_of_range_indices(torch, bad):
    import nn

    weight = ta.randn(3, 4)
    with pytest.raises(IndexError, match="embedding: index -?\\d is out of range"):
        F.embedding(ta.tensor(bad), weight)
    with pytest.raises(IndexError, match="embedding"):
        nn.Embedding(3, 4)(ta.tensor(bad))
    with pytest.raises(IndexError):
        torch.nn.functional.embedding(torch.tensor(bad), torch.randn(3, 4))


def test_embedding_refuses_float_indices():
    with pytest.raises(RuntimeError, match="embedding: expected dtype int32 or int64"):
        F.embedding(ta.tensor([1.0]), ta.randn(3, 4))


# ----------------------------------------------------------------------------- properties
@st.composite
def _index_for(draw, shape):
    """A random index for `shape`: ints, slices with steps, None, one Ellipsis, int lists,
    int tensors and bool masks, in torch's grammar."""
    items, dim = [], 0
    used_ellipsis = False
    while dim < len(shape) and draw(st.booleans()):
        n = shape[dim]
        kind = draw(st.sampled_from(["int", "slice", "none", "list", "tensor", "mask",
                                     "ellipsis"]))
        if kind == "none":
            items.append(None)
            continue
        if kind == "ellipsis":
            if used_ellipsis:
                continue
            used_ellipsis = True
            items.append(Ellipsis)
            dim = len(shape) - sum(1 for i in items if i is not None and i is not Ellipsis)
            dim = max(dim, 0)
            # what follows indexes the last dims: keep them all free by stopping here
            break
        if kind == "int":
            items.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            start = draw(st.none() | st.integers(-n - 1, n + 1))
            stop = draw(st.none() | st.integers(-n - 1, n + 1))
            items.append(slice(start, stop, draw(st.none() | st.integers(1, 3))))
        elif kind == "list":
            items.append(draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3)))
        elif kind == "tensor":
            items.append(np.array(draw(st.lists(st.integers(-n, n - 1), min_size=2,
                                                max_size=2)), dtype=np.int64))
        else:
            items.append(np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))))
        dim += 1
    return tuple(items)


@st.composite
def _case(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    return shape, draw(_index_for(shape))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_random_indices_match_torch_in_value_shape_and_gradient(case):
    torch = pytest.importorskip("torch")
    shape, index = case
    data = np.random.default_rng(len(shape)).standard_normal(shape)
    tx = torch.tensor(data, requires_grad=True)
    try:
        ty = tx[_to("torch", index)]
    except IndexError:  # e.g. two list indices that do not broadcast: we must refuse too
        with pytest.raises(IndexError):
            ta.tensor(data)[_to("ta", index)]
        return
    x = ta.tensor(data, requires_grad=True)
    y = x[_to("ta", index)]
    assert y.shape == tuple(ty.shape)
    np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
    w = np.random.default_rng(7).standard_normal(tuple(ty.shape))
    (y * ta.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
