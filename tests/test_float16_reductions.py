"""float16 reductions accumulate in float32, as torch 2.13's CPU kernels do.

Each reduction-bearing op runs on float16 inputs that float16 arithmetic gets wrong: large
values (|x| 300 to 1000: sums of squares overflow 65504), values with a large common mean
(300 to 310: the mean's low bits are lost), and many values in a row (5000: a float16
running sum stops moving). The engine's float16 result must have torch's float16 dtype and
shape, and its values and gradients must be within float16 rounding of torch's result
computed in float32 on the same float16 values (the float32 accumulation torch's own half
kernels aim at; torch's half batch_norm and var gradients are further from it than ours).
float16 always takes the reference kernels (the compiled ones take float32 and float64
only), on either kernel path: the kernel test checks that on both; attention, which widens
to float32 before its kernels, runs on both.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta


def _data(kind):
    rng = np.random.default_rng(0)
    if kind == "large":
        a = rng.uniform(300, 1000, (4, 64)) * rng.choice([-1, 1], (4, 64))
    elif kind == "offset":
        a = rng.uniform(300, 310, (4, 64))
    else:  # "many"
        a = rng.standard_normal((2, 5000)) + 3
    return a.astype(np.float16)


def F(lib):
    return lib.functional if lib is ta else lib.nn.functional


OPS = {
    "sum": lambda lib, x: x.sum(-1),
    "sum_strided": lambda lib, x: x.mT.sum(0),  # NumPy sums a strided axis in float16
    "mean": lambda lib, x: x.mean(-1),
    "mean_strided": lambda lib, x: x.mT.mean(0),
    "softmax": lambda lib, x: F(lib).softmax(x, -1),
    "softmax_dim0": lambda lib, x: F(lib).softmax(x, 0),
    "log_softmax": lambda lib, x: F(lib).log_softmax(x, -1),
    "logsumexp": lambda lib, x: x.logsumexp(-1),
    "cross_entropy": lambda lib, x: F(lib).cross_entropy(x, lib.tensor([1, 0] * (x.shape[0] // 2))),
    "cross_entropy_sum": lambda lib, x: F(lib).cross_entropy(
        x, lib.tensor([1, 0] * (x.shape[0] // 2)), reduction="sum"),
    "cross_entropy_weighted": lambda lib, x: F(lib).cross_entropy(
        x, lib.tensor([1, 0] * (x.shape[0] // 2)), weight=x[0].detach() * 0 + 1),
    "nll_loss": lambda lib, x: F(lib).nll_loss(x, lib.tensor([1, 0] * (x.shape[0] // 2))),
    "mse_loss": lambda lib, x: F(lib).mse_loss(x, x.detach() * 0.5),
    "layer_norm": lambda lib, x: F(lib).layer_norm(x, (x.shape[-1],)),
    "layer_norm_affine": lambda lib, x: F(lib).layer_norm(
        x, (x.shape[-1],), x[0].detach() * 0 + 1.5, x[0].detach() * 0 + 0.25),
    "rms_norm": lambda lib, x: F(lib).rms_norm(x, [x.shape[-1]]),
    "group_norm": lambda lib, x: F(lib).group_norm(x.reshape(x.shape[0], 4, -1), 2),
    "batch_norm": lambda lib, x: F(lib).batch_norm(x.mT, None, None, training=True),
    "normalize": lambda lib, x: F(lib).normalize(x, dim=-1),
    "vector_norm": lambda lib, x: lib.linalg.vector_norm(x, dim=-1),
    "vector_norm_3": lambda lib, x: lib.linalg.vector_norm(x / 64, ord=3, dim=-1),
    "norm": lambda lib, x: x.norm(dim=-1),
    "var": lambda lib, x: x.var(-1),
    "std": lambda lib, x: x.std(-1),
    "var_mean": lambda lib, x: lib.var_mean(x, -1),
    "std_mean": lambda lib, x: lib.std_mean(x, -1),
    "logcumsumexp": lambda lib, x: lib.logcumsumexp(x, -1),
}


# Ops whose backward reads their float16 output, in torch and here alike (softmax's y; for
# logsumexp, y in exp(x - y), checked against that formula below): the gradient carries
# that output's rounding, so it is held to torch's float16 gradient, not the float32 one.
GRAD_FROM_OUTPUT = {"softmax", "softmax_dim0", "logcumsumexp"}


def _run(lib, fn, arr, dtype):
    x = lib.tensor(arr.astype(dtype), requires_grad=True)
    out = fn(lib, x)
    outs = list(out) if isinstance(out, tuple) else [out]
    rng = np.random.default_rng(1)
    total = None
    for o in outs:
        w = lib.tensor(rng.standard_normal(tuple(o.shape)).astype(dtype))
        term = (o * w).sum()
        total = term if total is None else total + term
    total.backward()
    return outs, x.grad


def _close(ours, truth, what, tol=2e-3):
    a, b = ours.astype(np.float64), truth.astype(np.float64)
    assert np.array_equal(np.isfinite(a), np.isfinite(b)), what
    a, b = a[np.isfinite(b)], b[np.isfinite(b)]
    if not b.size:  # the result overflows float16 in both (a variance of 4e5)
        return
    # float16 rounding of the result, relative to the largest entry (a few ulp)
    assert np.abs(a - b).max() <= tol * max(np.abs(b).max(), 1e-3), (what, np.abs(a - b).max())


@pytest.mark.parametrize("kind", ["large", "offset", "many"])
@pytest.mark.parametrize("name", list(OPS))
def test_float16_reductions_accumulate_in_float32(name, kind):
    # no kernel-mode matrix: float16 takes the reference on both paths (the kernel test
    # below checks it), so the ops' results do not depend on the mode
    torch = pytest.importorskip("torch")
    arr = _data(kind)
    ours, our_grad = _run(ta, OPS[name], arr, np.float16)
    half, half_grad = _run(torch, OPS[name], arr, np.float16)
    truth, true_grad = _run(torch, OPS[name], arr, np.float32)
    assert len(ours) == len(half)
    for k, (o, h, t) in enumerate(zip(ours, half, truth)):
        assert o.dtype is ta.float16 and str(h.dtype) == "torch.float16", (k, o.dtype)
        assert tuple(o.shape) == tuple(h.shape), (k, o.shape, h.shape)
        with np.errstate(over="ignore"):  # torch's float32 result, rounded
            expected = t.detach().numpy().astype(np.float16)
        _close(o.detach().numpy(), expected, f"output {k}")
    assert our_grad.dtype is ta.float16
    reference = half_grad.numpy() if name in GRAD_FROM_OUTPUT else true_grad.numpy()
    if name == "logsumexp":  # the formula w * exp(x - y) from y rounded to float16
        w = np.random.default_rng(1).standard_normal(tuple(half[0].shape)).astype(np.float16)
        y16 = truth[0].detach().numpy().astype(np.float16).astype(np.float64)
        reference = w.astype(np.float64)[:, None] * np.exp(arr - y16[:, None])
    with np.errstate(over="ignore"):
        # logcumsumexp's gradient reads its float16 output at every step of a long scan:
        # ours and torch's differ by that rounding, each 4e-3 of the float32 gradient
        _close(our_grad.numpy(), reference.astype(np.float16), "gradient",
               tol=1e-2 if name == "logcumsumexp" else 2e-3)


@pytest.mark.parametrize("kind", ["large", "offset", "many"])
def test_float16_cumsum_accumulates_in_float32(kind):
    """cumsum and its gradient, a reversed cumsum, sum in float32 and round once."""
    torch = pytest.importorskip("torch")
    arr = _data(kind)
    (out,), ours = _run(ta, lambda lib, x: x.cumsum(-1), arr, np.float16)
    (truth_out,), truth = _run(torch, lambda lib, x: x.cumsum(-1), arr, np.float32)
    assert out.dtype is ta.float16 and ours.dtype is ta.float16
    with np.errstate(over="ignore"):
        _close(out.detach().numpy(), truth_out.detach().numpy().astype(np.float16), "output")
    _close(ours.numpy(), truth.numpy().astype(np.float16), "gradient")


@pytest.mark.parametrize("n", [64, 3000])
def test_float16_prod_multiplies_in_float32(n):
    """Products of float16 values near 1 (a float16 running product drifts by most of it)."""
    torch = pytest.importorskip("torch")
    arr = (1 + np.random.default_rng(0).uniform(-1e-3, 3e-3, (2, n))).astype(np.float16)
    (ours,), our_grad = _run(ta, lambda lib, x: x.prod(-1), arr, np.float16)
    (truth,), true_grad = _run(torch, lambda lib, x: x.prod(-1), arr, np.float32)
    assert ours.dtype is ta.float16 and our_grad.dtype is ta.float16
    _close(ours.detach().numpy(), truth.detach().numpy().astype(np.float16), "output")
    _close(our_grad.numpy(), true_grad.numpy().astype(np.float16), "gradient")
    (ours,), _ = _run(ta, lambda lib, x: x.cumprod(-1), arr, np.float16)
    (truth,), _ = _run(torch, lambda lib, x: x.cumprod(-1), arr, np.float32)
    assert ours.dtype is ta.float16
    _close(ours.detach().numpy(), truth.detach().numpy().astype(np.float16), "cumprod")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block_size", [None, 16])
def test_float16_attention_runs_in_float32(mode, causal, block_size):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v = ((rng.standard_normal((1, 2, 40, 16)) * 4).astype(np.float16) for _ in range(3))
    mask = None if causal else (rng.random((40, 40)) < 0.8)

    def run(lib, dtype, **kw):
        ts = [lib.tensor(a.astype(dtype), requires_grad=True) for a in (q, k, v)]
        m = None if mask is None else lib.tensor(mask)
        out = F(lib).scaled_dot_product_attention(*ts, attn_mask=m, is_causal=causal, **kw)
        out.backward(lib.tensor(np.ones(tuple(out.shape), dtype)))
        return [out.detach()] + [t.grad for t in ts]

    ours = run(ta, np.float16, block_size=block_size)
    truth = run(torch, np.float32)
    for what, a, b in zip(("out", "dq", "dk", "dv"), ours, truth):
        assert a.dtype is ta.float16, what
        _close(a.numpy(), b.numpy().astype(np.float16), what)


def test_float32_results_stay_float32():
    """The widening is for float16 only: float32 results keep their dtype."""
    x = ta.randn(3, 8)
    for name in ("layer_norm", "softmax", "std", "vector_norm", "sum_strided"):
        assert OPS[name](ta, x).dtype is ta.float32, name


ROW_KERNELS = {  # kernel: operands built from x (rows, n) and a row vector of n
    "softmax_forward": lambda x, w: (x,),
    "log_softmax_forward": lambda x, w: (x,),
    "masked_softmax_forward": lambda x, w: (x, x * 0, 0.5),
    "layer_norm_forward": lambda x, w: (x, w, w, 1e-5),
    "rms_norm_forward": lambda x, w: (x, w, 1e-5),
}


@pytest.mark.parametrize("name", list(ROW_KERNELS))
def test_float16_kernels_are_the_float32_kernels_rounded(mode, name):
    """On either path a float16 call runs the reference on float32 copies: its results are
    the float32 results rounded to float16, bit for bit."""
    from tinygrad_attn.backend import kernels

    x = _data("large")
    w = np.linspace(0.5, 1.5, x.shape[1]).astype(np.float16)
    before = kernels.calls.copy()
    got = getattr(kernels, name)(*ROW_KERNELS[name](x, w))
    assert (kernels.calls - before)[name, "numpy"] == 1
    wide = getattr(kernels.reference, name).__wrapped__(
        *ROW_KERNELS[name](x.astype(np.float32), w.astype(np.float32)))
    for a, b in zip(got if isinstance(got, tuple) else (got,),
                    wide if isinstance(wide, tuple) else (wide,)):
        assert a.dtype == np.float16
        assert a.tobytes() == b.astype(np.float16).tobytes()
