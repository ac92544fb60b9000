"""The same composite expressions on tinygrad_attn and on PyTorch (float64): values and the
gradient of every input agree to 1e-6. Each expression is written once against a small
namespace `F` (one for each library); tensor methods are shared API. Also: DLPack exchange
with torch shares memory both ways, strided tensors included."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import tinygrad_attn as ta

torch = pytest.importorskip("torch")
tnf = torch.nn.functional

RTOL, ATOL = 1e-6, 1e-8

TA = SimpleNamespace(
    name="ta",
    const=lambda a: ta.tensor(np.asarray(a)),
    leaf=lambda a: ta.tensor(a, dtype=ta.float64, requires_grad=True),
    softmax=ta.softmax, log_softmax=ta.log_softmax, sigmoid=ta.sigmoid, tanh=ta.tanh,
    relu=ta.relu, exp=ta.exp, log=ta.log, sqrt=ta.sqrt, rsqrt=ta.functional.rsqrt,
    gelu=lambda x, approximate="none": ta.functional.gelu(x, approximate=approximate),
    silu=ta.functional.silu, maximum=ta.maximum, minimum=ta.minimum, where=ta.where,
    cat=ta.cat, stack=ta.stack, tril=ta.tril, triu=ta.triu, gather=ta.gather,
    index_select=ta.index_select, matmul=ta.matmul, clamp=ta.clamp,
)
TORCH = SimpleNamespace(
    name="torch",
    const=lambda a: torch.from_numpy(np.array(a, copy=True)),
    leaf=lambda a: torch.from_numpy(np.array(a, dtype=np.float64)).requires_grad_(True),
    softmax=torch.softmax, log_softmax=torch.log_softmax, sigmoid=torch.sigmoid,
    tanh=torch.tanh, relu=torch.relu, exp=torch.exp, log=torch.log, sqrt=torch.sqrt,
    rsqrt=torch.rsqrt, gelu=lambda x, approximate="none": tnf.gelu(x, approximate=approximate),
    silu=tnf.silu, maximum=torch.maximum, minimum=torch.minimum, where=torch.where,
    cat=torch.cat, stack=torch.stack, tril=torch.tril, triu=torch.triu, gather=torch.gather,
    index_select=torch.index_select, matmul=torch.matmul, clamp=torch.clamp,
)


# ----------------------------------------------------------------------------- templates
# Each builder takes a numpy Generator and returns (expr, arrays, consts):
# expr(F, c, *xs) -> tensor or tuple of tensors; xs are leaves made from `arrays`
# (float64), c maps names to constants (masks, indices) converted by F.const.
def _mlp(rng):
    def expr(F, c, x, w1, b1, w2):
        h = F.gelu(x @ w1.mT + b1, approximate="tanh")
        return (h @ w2).tanh()

    return expr, [rng.standard_normal(s) for s in [(4, 3), (5, 3), (5,), (5, 2)]], {}


def _gelu_silu(rng):
    def expr(F, c, x, w):
        y = F.gelu(x @ w) * F.silu(x[..., ::2]).sum(-1, keepdim=True)
        return y + F.sigmoid(x.transpose(1, 2)).mT * F.relu(x - 0.1)

    return expr, [rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 4))], {}


def _layernorm(rng):
    def expr(F, c, x, g, b):
        mu = x.mean(-1, keepdim=True)
        xc = x - mu
        var = (xc * xc).mean(-1, keepdim=True)
        y = xc * F.rsqrt(var + 1e-5) * g + b
        return y, (xc / F.sqrt(var + 1e-5)).sum(0)

    return expr, [rng.standard_normal(s) for s in [(2, 3, 5), (5,), (5,)]], {}


def _attention(rng):
    B, T, C, H = 2, 4, 6, 2
    D = C // H

    def expr(F, c, x, w_qkv, w_o):
        q, k, v = (x @ w_qkv).split(C, dim=-1)  # views with a row stride of 3C
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = (q @ k.mT) / math.sqrt(D)
        att = att.masked_fill(~c["causal"], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return y @ w_o

    arrays = [rng.standard_normal(s) for s in [(B, T, C), (C, 3 * C), (C, C)]]
    return expr, arrays, {"causal": np.tril(np.ones((T, T), dtype=bool))}


def _attention_tril_zero(rng):
    T, D = 3, 4

    def expr(F, c, q, k, v):
        scores = q @ k.transpose(-2, -1) * D ** -0.5
        keep = F.tril(c["ones"]) == 0
        return F.softmax(scores.masked_fill(keep, float("-inf")), -1) @ v

    arrays = [rng.standard_normal((2, T, D)) for _ in range(3)]
    return expr, arrays, {"ones": np.ones((T, T))}


def _cross_entropy(rng):
    def expr(F, c, logits):
        lp = logits.log_softmax(-1)
        nll = -lp.gather(1, c["target"].unsqueeze(1)).mean()
        picked = lp[c["rows"], c["target"]]
        return nll, picked * 2, logits.logsumexp(-1) - logits.max(-1)[0]

    target = rng.integers(0, 4, size=5)
    return expr, [rng.standard_normal((5, 4))], {"target": target, "rows": np.arange(5)}


def _elementwise(rng):
    def expr(F, c, a, b, p, d):
        y = (a.exp() - b.tanh()) * p.sigmoid() / (1 + d.abs())
        y = y + F.maximum(a, b) - F.minimum(p, d).clamp(-0.5, 0.5) + F.relu(a - b)
        return y + a * b ** 2 - (p / 3) + 2.0 ** d - 1.5 / (2 + a * a) - (-b).neg()

    return expr, [rng.standard_normal((3, 4)) for _ in range(4)], {}


def _pow_log(rng):
    def expr(F, c, a, b):
        base = a.abs() + 0.5
        return base ** b + 2.0 ** a - (b * b + 1).sqrt().log() + a ** 3 / (1 + b ** 2)

    return expr, [rng.standard_normal((3, 4)), rng.standard_normal((4,))], {}


def _reductions(rng):
    def expr(F, c, x):
        return (x.logsumexp(1) + x.max(1)[0], x.min(-1, keepdim=True)[0] * x.sum((0, 2)),
                x.mean((0, -1), keepdim=True), x.sum() * x.max() - x.min(),
                x.logsumexp((0, 2), keepdim=True))

    return expr, [rng.standard_normal((3, 4, 5))], {}


def _variance(rng):
    def expr(F, c, x):
        return (x.var(0), x.var((0, 2), keepdim=True), x.std(-1, correction=0),
                x.var() + x.std(1).sum())

    return expr, [rng.standard_normal((3, 4, 5))], {}


def _softmaxes(rng):
    def expr(F, c, x):
        return (x.log_softmax(0) + x.softmax(1).log(), F.softmax(x.transpose(0, 2), -1),
                F.log_softmax(x[:, ::2] * 3, 1))

    return expr, [rng.standard_normal((2, 3, 4))], {}


def _views(rng):
    def expr(F, c, x, y):
        p = x.permute(2, 0, 1).reshape(4, -1)[:, ::2]  # (4, 3)
        q = y.T[::2].T  # (4, 3)
        r = F.cat([p, q * 2], dim=0).unsqueeze(0).expand(2, 8, 3).flatten(0, 1)  # (16, 3)
        s = F.stack([p, q], dim=-1).unflatten(0, (2, 2)).narrow(1, 1, 1).squeeze(1)
        return r.mT @ r, s.transpose(0, 2).contiguous().view(-1), x.mT.reshape(2, 12)[1]

    return expr, [rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 6))], {}


def _split_chunk_unbind(rng):
    def expr(F, c, x):
        a, b, rest = x.split([1, 2, 3], dim=-1)
        u = x.unbind(0)
        ch = x.chunk(2, dim=1)  # ch[0] unused
        halves = x.split(3, dim=-1)
        return (F.cat([rest, a * b.sum(-1, keepdim=True)], -1), u[0] * u[2],
                ch[1].exp().sum(1), halves[1] - halves[0])

    return expr, [rng.standard_normal((3, 4, 6))], {}


def _indexing(rng):
    def expr(F, c, x):
        return (x[c["idx"]] * 2, x[:, c["cols"]], x[c["mask"]], x.index_select(0, c["idx"]),
                x[1:4:2, None, ..., 2], x[[0, 0, 4]], F.index_select(x, 1, c["cols"]).T)

    consts = {"idx": np.array([3, 0, 3, 1]), "cols": np.array([2, 2, 0]),
              "mask": rng.random((5, 4)) < 0.5}
    return expr, [rng.standard_normal((5, 4))], consts


def _masks(rng):
    def expr(F, c, a, b):
        y = F.where(c["m1"], a, b * 2) + a.masked_fill(c["m2"], 0.5)
        y = y + a.tril(-1) * b.triu(1) + F.where(c["row"], a.exp(), 1.0)
        return y, F.where(c["m1"], 0.0, b).masked_fill(c["row"], -1.0)

    consts = {"m1": rng.random((3, 4)) < 0.5, "m2": rng.random((3, 4)) < 0.3,
              "row": rng.random((1, 4)) < 0.5}
    return expr, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))], consts


def _matmul_broadcast(rng):
    def expr(F, c, a, b, v, w):
        ab = a @ b  # (2, 1, 3, 4) @ (1, 2, 4, 3) -> (2, 2, 3, 3)
        return ab.softmax(1), ab @ v, w @ a.mT, F.matmul(a[0, 0], w), v @ b[0, 1].mT @ w

    shapes = [(2, 1, 3, 4), (1, 2, 4, 3), (3,), (4,)]
    return expr, [rng.standard_normal(s) for s in shapes], {}


def _inplace(rng):
    def expr(F, c, x, z):
        y = x * 1
        y.add_(z)
        y.mul_(2.0)
        y.sub_(z.T.T, alpha=0.5)
        y.masked_fill_(c["m"], 0.25)
        y.mul_(z)
        y.clamp_(-1.0, 1.0)
        y.div_(z.abs() + 1)
        return y.exp()

    return expr, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))], {
        "m": rng.random((3, 4)) < 0.3}


def _setitem(rng):
    def expr(F, c, x, z):
        y = x * 1
        y[0] = z[1]
        y[1:, ::2] = z[:2, 1:3] * 3
        y[c["idx"]] = z[2]
        return y.tanh()

    return expr, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))], {
        "idx": np.array([2])}


TEMPLATES = {
    "mlp": _mlp, "gelu_silu": _gelu_silu, "layernorm": _layernorm, "attention": _attention,
    "attention_tril_zero": _attention_tril_zero, "cross_entropy": _cross_entropy,
    "elementwise": _elementwise, "pow_log": _pow_log, "reductions": _reductions,
    "variance": _variance, "softmaxes": _softmaxes, "views": _views,
    "split_chunk_unbind": _split_chunk_unbind, "indexing": _indexing, "masks": _masks,
    "matmul_broadcast": _matmul_broadcast, "inplace": _inplace, "setitem": _setitem,
}


# ----------------------------------------------------------------------------- random chains
# (3, 4) -> (3, 4) steps; h is the running value, x/y (3, 4) and w (4,) are the leaves
STEPS = [
    lambda F, c, h, x, y, w: h + y,
    lambda F, c, h, x, y, w: h * y.tanh(),
    lambda F, c, h, x, y, w: h - w,
    lambda F, c, h, x, y, w: h / (1 + y * y),
    lambda F, c, h, x, y, w: F.sigmoid(h) * x,
    lambda F, c, h, x, y, w: F.gelu(h),
    lambda F, c, h, x, y, w: F.gelu(h, approximate="tanh") + x,
    lambda F, c, h, x, y, w: F.silu(h),
    lambda F, c, h, x, y, w: h.softmax(-1) * 3,
    lambda F, c, h, x, y, w: h.softmax(0) - x,
    lambda F, c, h, x, y, w: h.log_softmax(-1),
    lambda F, c, h, x, y, w: h.T.reshape(4, 3).T * y,
    lambda F, c, h, x, y, w: (h @ y.mT) @ h / 4,
    lambda F, c, h, x, y, w: F.where(c["mask"], h, y),
    lambda F, c, h, x, y, w: h.masked_fill(c["mask"], 0.0) + x,
    lambda F, c, h, x, y, w: h - h.mean(0, keepdim=True),
    lambda F, c, h, x, y, w: F.cat([h[:, :2], y[:, 2:] * h[:, 2:]], 1),
    lambda F, c, h, x, y, w: F.maximum(h, y),
    lambda F, c, h, x, y, w: F.minimum(h, x * 0.5),
    lambda F, c, h, x, y, w: h[[2, 0, 1]] + h,
    lambda F, c, h, x, y, w: F.stack(list(h.unbind(0))[::-1], 0) * h,
    lambda F, c, h, x, y, w: h * w.relu() + x,
    lambda F, c, h, x, y, w: F.tanh(h).clamp(-0.5, 0.5) + h,
    lambda F, c, h, x, y, w: h - h.max(-1, keepdim=True)[0],
    lambda F, c, h, x, y, w: h.tril() + y.triu(1),
    lambda F, c, h, x, y, w: h * h.logsumexp(0, keepdim=True),
    lambda F, c, h, x, y, w: (h.exp() / h.exp().sum(-1, keepdim=True)).sqrt(),
    lambda F, c, h, x, y, w: F.cat(h.chunk(2, dim=1)[::-1], 1) + (h * h).mean(),
    lambda F, c, h, x, y, w: h.reshape(6, 2).reshape(3, 4) * 2 - h.flatten()[::3].sum(),
    lambda F, c, h, x, y, w: h[:, None, :].expand(3, 2, 4).sum(1),
    lambda F, c, h, x, y, w: F.gather(h, 1, c["gidx"]) + h,
    lambda F, c, h, x, y, w: F.index_select(h, 0, c["ridx"]) * x,
]


def _random_chain(seed):
    def build(rng):
        steps = [int(i) for i in rng.integers(0, len(STEPS), size=6)]

        def expr(F, c, x, y, w):
            h = x
            for i in steps:
                h = STEPS[i](F, c, h, x, y, w)
            return h, h.logsumexp(-1) + (y.tanh() * w).sum(-1)  # every leaf is used

        arrays = [rng.standard_normal((3, 4)), rng.standard_normal((3, 4)),
                  rng.standard_normal(4)]
        consts = {"mask": rng.random((3, 4)) < 0.4, "gidx": rng.integers(0, 4, (3, 4)),
                  "ridx": rng.integers(0, 3, 3)}
        return expr, arrays, consts

    return build


# ----------------------------------------------------------------------------- running
def _run(F, expr, arrays, consts, cotangents):
    xs = [F.leaf(a) for a in arrays]
    c = {k: F.const(v) for k, v in consts.items()}
    out = expr(F, c, *xs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    loss = None
    for o, w in zip(outs, cotangents(outs)):
        term = (o * F.const(w)).sum()
        loss = term if loss is None else loss + term
    loss.backward()
    values = [o.detach().numpy().copy() for o in outs]
    grads = [None if x.grad is None else x.grad.detach().numpy().copy() for x in xs]
    return values, grads


def _check(builder, seed):
    rng = np.random.default_rng(seed)
    expr, arrays, consts = builder(rng)
    cot_seed = int(rng.integers(0, 2**31))

    def cotangents(outs):  # the same random output gradients for both libraries
        r = np.random.default_rng(cot_seed)
        return [r.standard_normal(tuple(o.shape)) for o in outs]

    t_vals, t_grads = _run(TORCH, expr, arrays, consts, cotangents)
    a_vals, a_grads = _run(TA, expr, arrays, consts, cotangents)
    assert len(a_vals) == len(t_vals)
    for k, (a, t) in enumerate(zip(a_vals, t_vals)):
        assert a.shape == t.shape, f"output {k}"
        np.testing.assert_allclose(a, t, rtol=RTOL, atol=ATOL, err_msg=f"output {k}")
    for i, (a, t) in enumerate(zip(a_grads, t_grads)):
        assert t is not None
        assert a is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(a, t, rtol=RTOL, atol=ATOL, err_msg=f"grad of input {i}")


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_template_matches_torch(name, seed):
    _check(TEMPLATES[name], 100 * seed + list(TEMPLATES).index(name))


@pytest.mark.parametrize("seed", range(24))
def test_random_chain_matches_torch(seed):
    _check(_random_chain(seed), seed)


# ----------------------------------------------------------------------------- DLPack
def test_from_dlpack_shares_memory_with_torch():
    t = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    a = ta.from_dlpack(t)
    assert a.shape == (3, 4) and a.dtype == ta.float64 and a.stride() == (4, 1)
    assert a.data_ptr() == t.data_ptr()
    t[1, 2] = 100.0
    assert a[1, 2].item() == 100.0
    with ta.no_grad():
        a[0, 0] = -5.0
    assert t[0, 0].item() == -5.0
    np.testing.assert_array_equal(a.numpy(), t.numpy())


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_from_dlpack_non_contiguous_torch_tensor(layout):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    t = base.T if layout == "transposed" else base[1:, 1::2]
    a = ta.from_dlpack(t)
    assert a.shape == tuple(t.shape)
    assert a.stride() == t.stride()
    assert not a.is_contiguous()
    assert a.data_ptr() == t.data_ptr()
    np.testing.assert_array_equal(a.numpy(), t.numpy())
    t[2, 1] = 1000.0  # a write through torch shows in the ta view
    assert a[2, 1].item() == 1000.0
    base.mul_(-1)
    np.testing.assert_array_equal(a.numpy(), t.numpy())
    # ops on the shared view read the right elements
    np.testing.assert_allclose((a * 2).sum(0).numpy(), (t * 2).sum(0).numpy())


def test_from_dlpack_then_autograd():
    t = torch.randn(3, 4, dtype=torch.float64)
    a = ta.from_dlpack(t.T).requires_grad_()
    (a.exp() * 2).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), 2 * t.T.exp().numpy(), rtol=1e-12)


def test_torch_from_dlpack_shares_memory_with_ta():
    a = ta.arange(12, dtype=ta.float64).reshape(3, 4)
    t = torch.from_dlpack(a)
    assert tuple(t.shape) == (3, 4) and t.dtype == torch.float64
    assert t.data_ptr() == a.data_ptr()
    t[1, 1] = 7.0
    assert a[1, 1].item() == 7.0
    with ta.no_grad():
        a[2, 3] = -1.0
    assert t[2, 3].item() == -1.0


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_torch_from_dlpack_non_contiguous_ta_tensor(layout):
    base = ta.arange(24, dtype=ta.float64).reshape(4, 6)
    a = base.transpose(0, 1) if layout == "transposed" else base[1:, 1::2]
    assert not a.is_contiguous()
    t = torch.from_dlpack(a)
    assert tuple(t.shape) == a.shape
    assert t.stride() == a.stride()
    assert t.data_ptr() == a.data_ptr()
    np.testing.assert_array_equal(t.numpy(), a.numpy())
    t[2, 1] = 1000.0
    assert a[2, 1].item() == 1000.0
    with ta.no_grad():
        base.mul_(-1.0)
    np.testing.assert_array_equal(t.numpy(), a.numpy())


def test_dlpack_round_trip_float32():
    t = torch.linspace(0, 1, 6, dtype=torch.float32).reshape(2, 3)
    back = torch.from_dlpack(ta.from_dlpack(t))
    assert back.dtype == torch.float32 and back.data_ptr() == t.data_ptr()
    back[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
