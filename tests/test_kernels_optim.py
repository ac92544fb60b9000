"""The optimizer kernel, AdamW (one array, and a whole parameter group in one call),
compiled (numba) against the NumPy reference, and what calls it (adamw_update_ on tensors
and lists, nn.optim.AdamW) on both paths; and the gradient of split, whose buffer is no
longer zero-filled when the pieces tile the input.

The compiled AdamW does the reference's arithmetic in its order, so it is checked bit for
bit. Linear and split are gradchecked on the numba path, and a GPT's forward, backward and
optimizer steps must allocate the same Storages on both paths. Everything here that needs
numba skips without it (numba is never imported at module level).
"""

from __future__ import annotations

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from tinygrad_attn.backend import kernels
from tinygrad_attn.backend.kernels import reference
from tinygrad_attn.memory import state as ledger_state

HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8)
SIZES = [1, 7, 16384 + 3, 3 * 16384 + 5]  # 16384: the compiled AdamW's chunk





def _adamw_arrays(shape, dtype, seed=0):
    """p, g, m, v: v non-negative; a few exact zeros and tiny values among the gradients."""
    rng = np.random.default_rng(seed)
    p, g, m = (rng.standard_normal(shape) for _ in range(3))
    v = np.abs(rng.standard_normal(shape)) * 1e-2
    g.reshape(-1)[:3] = [0.0, -0.0, 1e-30][:g.size]
    return [a.astype(dtype) for a in (p, g, m * 0.1, v)]


# ----------------------------------------------------------------------------- AdamW
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("step", [1, 1000])
@pytest.mark.parametrize("n", SIZES)
def test_adamw_is_bit_identical_to_the_reference(compiled, dtype, weight_decay, step, n):
    ours = _adamw_arrays((n,), dtype)
    ref = [a.copy() for a in ours]
    assert compiled.adamw_update(*ours, weight_decay=weight_decay, step=step, **HYPER) is None
    reference.adamw_update(*ref, weight_decay=weight_decay, step=step, **HYPER)
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b, strict=True)
    assert not np.array_equal(ours[0], _adamw_arrays((n,), dtype)[0])  # p moved


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_group_is_bit_identical_to_one_at_a_time(compiled, dtype):
    shapes = [(65, 384), (384,), (3, 5, 7), (1,), (0,), (2 * 16384 + 1,)]
    ours = [_adamw_arrays(s, dtype, seed=i) for i, s in enumerate(shapes)]
    ref = [[a.copy() for a in quad] for quad in ours]
    compiled.adamw_update_many(*zip(*ours), weight_decay=0.1, step=7, **HYPER)
    for quad in ref:
        reference.adamw_update(*quad, weight_decay=0.1, step=7, **HYPER)
    for a, b in zip(ours, ref):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y, strict=True)


def test_adamw_group_declines_mismatched_sizes(compiled):
    p, g, m, v = _adamw_arrays((5,), np.float32)
    before = p.copy()
    out = compiled.adamw_update_many([p], [g[:4]], [m], [v], weight_decay=0.0, step=1, **HYPER)
    assert out is NotImplemented
    np.testing.assert_array_equal(p, before)


def test_adamw_dispatch_runs_the_reference_for_what_the_kernel_does_not_take(numba_mode):
    """A strided parameter (a transposed view) goes to the reference, the rest of its group
    to the compiled kernel, and both give the same bits as the reference alone."""
    dense = _adamw_arrays((40, 30), np.float32, seed=1)
    strided = [a.T for a in _adamw_arrays((30, 40), np.float32, seed=2)]
    ref = [[a.copy() for a in q] for q in (dense, strided)]
    kernels.calls.clear()
    kernels.adamw_update_many(*zip(dense, strided), weight_decay=0.1, step=3, **HYPER)
    assert kernels.calls["adamw_update_many", "numba"] == 1
    assert kernels.calls["adamw_update_many", "numpy"] == 1
    for quad in ref:
        reference.adamw_update(*quad, weight_decay=0.1, step=3, **HYPER)
    for a, b in zip(dense + strided, ref[0] + ref[1]):
        np.testing.assert_array_equal(a, b)


def _tensors(shape, dtype, seed, layout="contiguous"):
    arrays = _adamw_arrays(shape, np.float64, seed)
    if layout == "transposed":
        return [ta.tensor(a.T.copy(), dtype=dtype).T for a in arrays]
    return [ta.tensor(a, dtype=dtype) for a in arrays]


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [ta.float32, ta.float64])
def test_adamw_op_gives_the_same_bits_on_both_paths(layout, dtype):
    pytest.importorskip("numba")
    results = {}
    for path in ("numpy", "numba"):
        before = kernels.get_kernels()
        kernels.set_kernels(path)
        kernels.calls.clear()
        try:
            quads = [_tensors(s, dtype, i, layout) for i, s in enumerate([(40, 30), (30, 3)])]
            with ta.no_grad():
                for step in (1, 2):
                    ta.functional.adamw_update_(*(list(c) for c in zip(*quads)), step=step,
                                                weight_decay=0.1, **HYPER)
        finally:
            kernels.set_kernels(before)
        results[path] = [t.numpy() for q in quads for t in q]
        expect = 0 if path == "numpy" or layout == "transposed" else 2
        assert kernels.calls["adamw_update_many", "numba"] == expect
    for a, b in zip(results["numpy"], results["numba"]):
        np.testing.assert_array_equal(a, b)


def test_adamw_op_on_lists_matches_one_call_per_parameter(mode):
    singles = [_tensors(s, ta.float32, i) for i, s in enumerate([(8, 3), (5,), (2, 2, 2)])]
    group = [_tensors(s, ta.float32, i) for i, s in enumerate([(8, 3), (5,), (2, 2, 2)])]
    versions = [t.untyped_storage().version for q in group for t in q]
    with ta.no_grad():
        for quad in singles:
            assert ta.functional.adamw_update_(*quad, step=4, weight_decay=0.1, **HYPER) \
                is quad[0]
        ps = [q[0] for q in group]
        out = ta.functional.adamw_update_(ps, [q[1] for q in group], [q[2] for q in group],
                                          [q[3] for q in group], step=4, weight_decay=0.1,
                                          **HYPER)
    assert out is ps
    for a, b in zip(singles, group):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    moved = [t.untyped_storage().version - n
             for t, n in zip((t for q in group for t in q), versions)]
    assert moved == [1, 0, 1, 1] * 3  # p, m, v written; g only read


def test_adamw_op_on_lists_refuses_before_writing_anything(mode):
    p1, g1, m1, v1 = _tensors((4, 3), ta.float32, 0)
    p2, g2, m2, v2 = _tensors((5,), ta.float32, 1)
    before = [p1.numpy().copy(), p2.numpy().copy()]
    with pytest.raises(ta.ShapeError, match=r"adamw_update_: grad has shape \(4,\)"):
        ta.functional.adamw_update_([p1, p2], [g1, g2[:4]], [m1, m2], [v1, v2], step=1,
                                    weight_decay=0.0, **HYPER)
    with pytest.raises(ValueError, match="adamw_update_: exp_avg and exp_avg_sq share"):
        ta.functional.adamw_update_([p1, p2], [g1, g2], [m1, m2], [v1, m2], step=1,
                                    weight_decay=0.0, **HYPER)
    with pytest.raises(TypeError, match="adamw_update_: with a list of 2 params, exp_avg "
                                        "must be a list of 2 tensors too, got list of 1"):
        ta.functional.adamw_update_([p1, p2], [g1, g2], [m1], [v1, v2], step=1,
                                    weight_decay=0.0, **HYPER)
    np.testing.assert_array_equal(p1.numpy(), before[0])
    np.testing.assert_array_equal(p2.numpy(), before[1])


def test_adamw_op_on_lists_with_shared_buffers_runs_them_in_order(mode):
    """A buffer written by one entry and read by another (here the second entry's grad is
    the first one's param, and two params view one buffer): the entries run one after
    another, as separate calls would, not all at once."""

    def make():
        base = ta.tensor(np.linspace(-1, 1, 12), dtype=ta.float32)
        return [(base[:6], ta.ones(6) * -2, ta.zeros(6), ta.zeros(6)),
                (ta.ones(6), base[:6], ta.zeros(6), ta.zeros(6)),
                (base[6:], ta.ones(6) * 0.5, ta.zeros(6), ta.zeros(6))], base

    group, base_group = make()
    singles, base_singles = make()
    kernels.calls.clear()
    with ta.no_grad():
        ta.functional.adamw_update_(*(list(c) for c in zip(*group)), step=1,
                                    weight_decay=0.1, **HYPER)
        assert kernels.calls["adamw_update_many", "numba"] == 0
        for q in singles:
            ta.functional.adamw_update_(*q, step=1, weight_decay=0.1, **HYPER)
    np.testing.assert_array_equal(base_group.numpy(), base_singles.numpy())
    for a, b in zip(group, singles):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.numpy(), y.numpy())


def _storages_made(fn) -> list:
    made = []

    class Watch:
        def on_alloc(self, st):
            made.append(st.nbytes)

        def on_free(self, st):
            pass

    ledger_state.observers.append(Watch())
    try:
        fn()
    finally:
        ledger_state.observers.pop()
    return made


def _gpt():
    ta.manual_seed(0)
    cfg = nn.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16,
                       dropout=0.0)
    return nn.GPT(cfg)


def test_adamw_optimizer_same_on_both_paths_with_the_same_storages():
    """Three steps of configure_adamw's two groups on a small GPT: the same bits, state
    dict and Storage allocations on the reference and compiled paths; one kernel call per
    group and step. Forward and backward run on the reference both times, so the two
    optimizers see the same gradients (the compiled forward kernels agree only to float32
    tolerance)."""
    pytest.importorskip("numba")
    idx = ta.tensor(np.random.default_rng(0).integers(0, 11, (2, 8)))
    out = {}
    for path in ("numpy", "numba"):
        before = kernels.get_kernels()
        kernels.set_kernels(path)
        kernels.calls.clear()
        try:
            model = _gpt()
            opt = nn.optim.configure_adamw(model, weight_decay=0.1, lr=1e-2)
            made = []
            for _ in range(3):
                kernels.set_kernels("numpy")
                _, loss = model(idx, idx)
                loss.backward()
                kernels.set_kernels(path)
                made += _storages_made(opt.step)
                opt.zero_grad()
        finally:
            kernels.set_kernels(before)
        assert sum(kernels.calls[("adamw_update_many", p)] for p in ("numpy", "numba")) == 6
        out[path] = ([p.detach().numpy() for p in model.parameters()], opt.state_dict(), made)
    (p_ref, sd_ref, made_ref), (p_fast, sd_fast, made_fast) = out["numpy"], out["numba"]
    for a, b in zip(p_ref, p_fast):
        np.testing.assert_array_equal(a, b)
    assert made_ref == made_fast and sum(made_ref) > 0  # the state, on the first step only
    assert sd_ref["param_groups"] == sd_fast["param_groups"]
    for i, state in sd_ref["state"].items():
        assert state["step"] == sd_fast["state"][i]["step"] == 3
        for name in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(state[name].numpy(), sd_fast["state"][i][name].numpy())


def test_adamw_optimizer_groups_parameters_by_their_step_count(mode):
    """A parameter that missed a step (no gradient) keeps its own count: one fused call per
    count, and each parameter's update is what torch would do with its count."""
    a = ta.tensor(np.arange(6.0), requires_grad=True)
    b = ta.tensor(np.arange(4.0), requires_grad=True)
    opt = nn.optim.AdamW([a, b], lr=0.1, weight_decay=0.0)
    a.grad = ta.ones(6, dtype=a.dtype)
    opt.step()  # only a
    a.grad, b.grad = ta.ones(6, dtype=a.dtype), ta.ones(4, dtype=b.dtype)
    kernels.calls.clear()
    opt.step()
    assert sum(kernels.calls.values()) == 2  # steps 2 (a) and 1 (b)
    assert opt.state[a]["step"] == 2 and opt.state[b]["step"] == 1
    # Adam's first step of a constant gradient moves by lr (to within eps)
    np.testing.assert_allclose(b.detach().numpy(), np.arange(4.0) - 0.1, rtol=1e-7)


# ----------------------------------------------------------------------------- split
def test_linear_and_split_gradcheck_on_the_numba_path(numba_mode):
    rng = np.random.default_rng(0)
    x = ta.tensor(rng.standard_normal((2, 3, 4)), requires_grad=True)
    w = ta.tensor(rng.standard_normal((6, 4)), requires_grad=True)
    b = ta.tensor(rng.standard_normal(6), requires_grad=True)

    def f(x, w, b):
        y = nn.functional.linear(x, w, b)
        q, k, v = y.split(2, dim=2)
        return q * k + v.exp()

    assert ta.gradcheck(f, (x, w, b))
    assert ta.gradcheck(lambda x: x.split([1, 0, 3], dim=2)[2] * 2, (x,))  # pieces unused
    assert ta.gradcheck(lambda x: x.unbind(1)[1] * 3, (x,))


def test_split_gradient_of_unused_pieces_is_zero(mode):
    x = ta.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    a, b, c = x.split([1, 2, 1], dim=1)
    (b * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(),
                                  np.array([[0, 2, 2, 0]] * 3, dtype=np.float64))
    y = ta.tensor(np.arange(6.0).reshape(3, 2), requires_grad=True)
    y.unbind(0)[2].sum().backward()  # unbind: integer pieces
    np.testing.assert_array_equal(y.grad.numpy(), [[0, 0], [0, 0], [1, 1]])


def test_step_allocates_the_same_storages_on_both_paths():
    """Forward and backward of a small GPT (bias adds, bias gradients, the qkv split): the
    same Storages, byte for byte, and the same gradients, on both paths."""
    pytest.importorskip("numba")
    idx = ta.tensor(np.random.default_rng(0).integers(0, 11, (2, 8)))
    out = {}
    for path in ("numpy", "numba"):
        before = kernels.get_kernels()
        kernels.set_kernels(path)
        try:
            model = _gpt()

            def step(model=model):
                _, loss = model(idx, idx)
                loss.backward()

            made = _storages_made(step)
        finally:
            kernels.set_kernels(before)
        out[path] = made, [p.grad.numpy() for p in model.parameters()]
    assert out["numpy"][0] == out["numba"][0]
    for a, b in zip(out["numpy"][1], out["numba"][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_split_chunk_unbind_tile_their_input_and_other_pieces_do_not():
    from tinygrad_attn.ops.movement import _tiles

    s = slice(None)
    assert _tiles((4, 6), ((s, slice(0, 2)), (s, slice(2, 6))))  # split([2, 4], dim=1)
    assert _tiles((4, 6), ((0,), (1,), (2,), (3,)))  # unbind(0)
    assert _tiles((0, 6), ((slice(0, 0),),))  # an empty dim, one empty piece
    assert not _tiles((4, 6), ((s, slice(0, 2)), (s, slice(3, 6))))  # a gap
    assert not _tiles((4, 6), ((s, slice(0, 4)), (s, slice(2, 6))))  # an overlap
    assert not _tiles((4, 6), ((s, slice(0, 6, 2)),))  # a step
    assert not _tiles((4, 6), ((slice(0, 2), slice(0, 6)), (slice(2, 4), slice(0, 3))))


def test_split_gradient_fills_every_piece(mode):
    """All three pieces used, each through a transposed view (as the attention's q, k, v):
    the un-zeroed buffer is written everywhere."""
    rng = np.random.default_rng(3)
    x = ta.tensor(rng.standard_normal((2, 3, 12)), requires_grad=True)
    w = [rng.standard_normal((2, 2, 3, 2)) for _ in range(3)]
    pieces = x.split(4, dim=2)
    loss = sum((p.view(2, 3, 2, 2).transpose(1, 2) * ta.tensor(wi)).sum()
               for p, wi in zip(pieces, w))
    loss.backward()
    want = np.concatenate([wi.transpose(0, 2, 1, 3).reshape(2, 3, 4) for wi in w], axis=2)
    np.testing.assert_array_equal(x.grad.numpy(), want)
