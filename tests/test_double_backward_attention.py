"""Second derivatives of attention, both ways the engine computes it.

"flash": F.scaled_dot_product_attention, the blocked op. Its backward recomputes each tile's
probabilities from the saved row logsumexp; under create_graph=True that logsumexp is
recomputed from q and k by recorded ops, so the derivative flows through it too. Small
block sizes make every case run several query and key blocks, a partial last block, and
(causal) skipped ones. "views": the GPT's idiom, q @ k.mT -> F.masked_softmax -> dropout ->
@ v, whose second derivative is its pieces'.

gradgradcheck (finite differences of the recorded first gradient, and the recorded first
gradient against the plain one) runs on both, causal or not, with a bool and a float mask
(the float one needing its own gradient), dropout at a fixed seed, and grouped-query heads,
in both kernel modes. torch has no double backward for its fused SDPA; its math path
(torch.nn.attention.SDPBackend.MATH) does, and is the reference for the values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.functional as F

F64 = ta.float64
T, D = 3, 2  # block_size 2 below: two query and two key blocks, the last one partial


def _leaf(*shape, device="cpu"):
    return ta.randn(*shape, dtype=F64).to(device).requires_grad_()


def _bool_mask(shape, seed=3):
    """A random keep-mask (True = may attend) whose every row keeps at least one key."""
    rng = np.random.default_rng(seed)
    keep = rng.random(shape) < 0.6
    keep[..., 0] = True
    return keep


def _flash(q, k, v, mask=None, causal=False, dropout_p=0.0, gqa=False, seed=11):
    if dropout_p:
        ta.manual_seed(seed)  # the same dropout mask on every call gradgradcheck makes
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          is_causal=causal, enable_gqa=gqa, block_size=2)


def _views(q, k, v, mask=None, causal=False, dropout_p=0.0, gqa=False, seed=11):
    """The GPT's "views" attention: matmul, masked softmax (one op), dropout, matmul. mask
    as SDPA's (bool True = may attend, or float added), is_causal as SDPA's."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    if gqa:  # (B, Hk, g, T, D) query groups against (B, Hk, 1, T, D) keys: stride-0 views
        B, Hq, Hk = q.shape[0], q.shape[1], k.shape[1]
        q = q.view(B, Hk, Hq // Hk, Tq, q.shape[-1])
        k, v = k.unsqueeze(2), v.unsqueeze(2)
    if causal:
        mask = ta.ones(Tq, Tk, dtype=ta.bool).tril().to(q.device)
    hidden = None if mask is None else (~mask if mask.dtype is ta.bool else mask)
    att = F.masked_softmax(q @ k.mT, hidden, scale=1.0 / math.sqrt(q.shape[-1]))
    if dropout_p:
        ta.manual_seed(seed)
        att = F.dropout(att, dropout_p)
    y = att @ v
    return y.reshape(y.shape[0], -1, Tq, v.shape[-1]) if gqa else y


IMPLS = {"flash": _flash, "views": _views}

# shapes kept small: the recorded blocked backward is many small ops per tile, and
# gradgradcheck differentiates it once per input element
CASES = {
    "plain": dict(shape=(1, T, D), kv=(1, T + 1, D)),
    "causal": dict(shape=(1, T, D), kv=(1, T, D), causal=True),  # one key block skipped
    # keys past the last query: key blocks no query block reaches, whose dk, dv are zeros
    "causal_longer_keys": dict(shape=(1, 2, D), kv=(1, 4, D), causal=True, impls=("flash",)),
    "bool_mask": dict(shape=(1, T, D), kv=(1, T + 1, D), mask="bool"),
    "float_mask": dict(shape=(2, T, D), kv=(2, T, D), mask="float"),  # summed over batch
    # the additive causal mask (-inf above the diagonal), a constant: no nan from its -inf
    "neg_inf_mask": dict(shape=(1, T, D), kv=(1, T, D), mask="-inf"),
    "dropout": dict(shape=(1, T, D), kv=(1, T + 1, D), dropout_p=0.3),
    "causal_dropout": dict(shape=(1, T, D), kv=(1, T, D), causal=True, dropout_p=0.4),
    "gqa_causal": dict(shape=(1, 2, T, D), kv=(1, 1, T, D), causal=True, gqa=True),
}


def _inputs(case, device="cpu"):
    ta.manual_seed(0)
    q = _leaf(*case["shape"], device=device)
    k = _leaf(*case["kv"], device=device)
    v = _leaf(*case["kv"][:-1], 2, device=device)  # Dv != D
    mask = None
    if case.get("mask") == "bool":
        mask = ta.tensor(_bool_mask(case["shape"][:-1] + (case["kv"][-2],)), device=device)
    elif case.get("mask") == "float":  # broadcast over the batch: its gradient is summed
        mask = _leaf(case["shape"][-2], case["kv"][-2], device=device)
    elif case.get("mask") == "-inf":
        hidden = ta.ones(case["shape"][-2], case["kv"][-2], dtype=ta.bool).tril() == 0
        mask = ta.zeros(*hidden.shape, dtype=F64).masked_fill(hidden, float("-inf")).to(device)
    return q, k, v, mask


def _params(name):
    case = CASES[name]
    return [pytest.param(impl, name, id=f"{impl}-{name}")
            for impl in case.get("impls", IMPLS)]


ALL = [p for name in CASES for p in _params(name)]


@pytest.mark.parametrize("impl,name", ALL)
def test_gradgradcheck(impl, name, mode):
    case = CASES[name]
    q, k, v, mask = _inputs(case)
    kw = {key: case[key] for key in ("causal", "dropout_p", "gqa") if key in case}
    fn = IMPLS[impl]
    if mask is not None and mask.requires_grad:
        assert ta.gradgradcheck(lambda q, k, v, m: fn(q, k, v, m, **kw), [q, k, v, mask])
    else:
        assert ta.gradgradcheck(lambda q, k, v: fn(q, k, v, mask, **kw), [q, k, v])


@pytest.mark.parametrize("impl", list(IMPLS))
def test_gradgradcheck_on_device(impl, device):
    """The recorded backward with its inputs on the device (the fake CuPy on a CPU)."""
    q, k, v, mask = _inputs(CASES["float_mask"], device)
    fn = IMPLS[impl]
    assert ta.gradgradcheck(lambda q, k, v, m: fn(q, k, v, m), [q, k, v, mask])
    q, k, v, _ = _inputs(CASES["causal"], device)
    assert ta.gradgradcheck(lambda q, k, v: fn(q, k, v, causal=True), [q, k, v])


def test_unseen_rows_have_finite_second_derivatives():
    """A query that may attend to no key (its bool mask row all False): the output row is 0,
    its lse +inf, and every derivative through it 0, never nan (the recomputed lse takes
    no log(0) and no inf - inf)."""
    ta.manual_seed(0)
    q, k, v = _leaf(1, T, D), _leaf(1, T, D), _leaf(1, T, 2)
    keep = _bool_mask((1, T, T))
    keep[0, 1] = False
    mask = ta.tensor(keep)
    assert ta.gradgradcheck(lambda q, k, v: _flash(q, k, v, mask), [q, k, v])
    go = ta.randn(1, T, 2, dtype=F64)
    dq, dk, dv = ta.autograd.grad(_flash(q, k, v, mask), (q, k, v), go, create_graph=True)
    second = ta.autograd.grad((dq * dq).sum() + (dk * dv[..., :1]).sum(), (q, k, v))
    for t in second:
        assert np.isfinite(t.numpy()).all()


def test_recorded_path_matches_the_compiled_first_order(numba_mode):
    """The recorded first gradient (reference kernels' text) equals the compiled first-order
    one, value for value, on the blocked op's every mask kind."""
    for name in ("causal", "bool_mask", "float_mask", "dropout"):
        case = CASES[name]
        q, k, v, mask = _inputs(case)
        kw = {key: case[key] for key in ("causal", "dropout_p") if key in case}
        inputs = (q, k, v) + ((mask,) if mask is not None and mask.requires_grad else ())
        go = ta.randn(*case["shape"][:-1], 2, dtype=F64)
        plain = ta.autograd.grad(_flash(q, k, v, mask, **kw), inputs, go)
        recorded = ta.autograd.grad(_flash(q, k, v, mask, **kw), inputs, go,
                                    create_graph=True)
        for a, b in zip(plain, recorded):
            assert b.requires_grad
            np.testing.assert_allclose(b.detach().numpy(), a.numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n_kv_head", [None, 1])
def test_gpt_attention_block_both_ways(n_kv_head):
    """The GPT's CausalSelfAttention (projections, head views, attention, head merge) has the
    same second derivative with attn="views" and attn="flash": one function, two graphs.
    gradgradcheck on each, then a Hessian-vector product of a scalar of the output."""
    nn = pytest.importorskip("nn")
    hvps = []
    for attn in ("views", "flash"):
        ta.manual_seed(0)
        cfg = nn.GPTConfig(vocab_size=5, block_size=T, n_layer=1, n_head=2, n_embd=4,
                           n_kv_head=n_kv_head, attn=attn, attn_block_size=2)
        block = nn.gpt.CausalSelfAttention(cfg).to(F64)
        x = _leaf(1, T, 4)
        assert ta.gradgradcheck(block, [x])
        (gx,) = ta.autograd.grad((block(x) ** 2).sum(), x, create_graph=True)
        direction = ta.randn(*x.shape, dtype=F64)
        (hvp,) = ta.autograd.grad((gx * direction).sum(), x)
        hvps.append(hvp.numpy())
    np.testing.assert_allclose(hvps[1], hvps[0], rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- against torch
TORCH_CASES = ["plain", "causal", "bool_mask", "float_mask", "neg_inf_mask", "gqa_causal"]


def _torch_second(torch, arrays, case, weights):
    """torch's math SDPA: first gradients with create_graph, then the gradient of
    sum(w_i * grad_i) with respect to q, k, v, the cotangent (and a float mask)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ts = [torch.tensor(a, requires_grad=a.dtype != bool) for a in arrays]
    q, k, v, go = ts[:4]
    mask = ts[4] if len(ts) > 4 else None
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=case.get("causal", False),
            enable_gqa=case.get("gqa", False))
    wrt = [q, k, v] + ([mask] if case.get("mask") == "float" else [])
    first = torch.autograd.grad(out, wrt, go, create_graph=True)
    scalar = sum((g * torch.tensor(w)).sum() for g, w in zip(first, weights))
    second = torch.autograd.grad(scalar, wrt + [go])
    return [f.detach().numpy() for f in first], [s.numpy() for s in second]


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("name", TORCH_CASES)
def test_second_derivative_matches_torch_math_sdpa(impl, name):
    torch = pytest.importorskip("torch")
    case = CASES[name]
    q, k, v, mask = _inputs(case)
    go = _leaf(*(case["shape"][:-1] + (2,)))
    kw = {key: case[key] for key in ("causal", "gqa") if key in case}
    wrt = [q, k, v] + ([mask] if case.get("mask") == "float" else [])
    first = ta.autograd.grad(IMPLS[impl](q, k, v, mask, **kw), wrt, go, create_graph=True)
    rng = np.random.default_rng(5)
    weights = [rng.standard_normal(tuple(g.shape)) for g in first]
    scalar = sum((g * ta.tensor(w)).sum() for g, w in zip(first, weights))
    second = ta.autograd.grad(scalar, wrt + [go])
    arrays = [t.detach().numpy() for t in (q, k, v, go)]
    if mask is not None:
        arrays.append(mask.detach().numpy())
    t_first, t_second = _torch_second(torch, arrays, case, weights)
    for ours, theirs in zip(first, t_first):
        np.testing.assert_allclose(ours.detach().numpy(), theirs, rtol=1e-9, atol=1e-11)
    for ours, theirs in zip(second, t_second):
        np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-9, atol=1e-11)
