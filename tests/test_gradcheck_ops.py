"""Every differentiable op against central finite differences (ta.gradcheck, float64).

Each op runs on contiguous inputs and on non-contiguous ones: a transposed view of a leaf
made with the swapped shape, a view sliced with a step (`x[:, ::2]`), and broadcast
operands (a (1, n), (n,) or (m, 1) operand, or a leaf expanded inside the function).
The gradient is checked with respect to the tensor the op sees (the view itself), or,
for expanded operands, with respect to the small leaf under the expand.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta

F64 = ta.float64
gelu = ta.functional.gelu
silu = ta.functional.silu


# ----------------------------------------------------------------------------- inputs
DEVICE = {"name": "cpu"}  # where the inputs are built: test_op_on_device switches it


def _on_device(t):
    return t if DEVICE["name"] == "cpu" else t.to(DEVICE["name"])


def _leaf(shape, domain):
    t = ta.randn(*shape, dtype=F64)
    a = t.numpy()
    if domain == "positive":
        a[...] = np.abs(a) + 0.5
    elif domain == "nonzero":  # |x| >= 0.3: away from the kink of abs/relu
        a[...] = np.where(a >= 0, a + 0.3, a - 0.3)
    elif domain == "clamp":  # away from the bounds +-0.5 used below
        near = np.abs(np.abs(a) - 0.5) < 0.1
        a[near] *= 1.5
    elif domain == "unit":  # inside (-0.9, 0.9): asin, acos, atanh, erfinv
        a[...] = np.tanh(a) * 0.9
    elif domain == "above1":  # acosh
        a[...] = np.abs(a) + 1.5
    else:
        assert domain == "real", domain
    return _on_device(t).requires_grad_()


def make(shape, view="contiguous", domain="real"):
    """(input for gradcheck, wrap applied inside the checked function).

    view: "contiguous"; "transposed" (leaf of the swapped shape, .transpose(0, 1));
    "sliced" (leaf twice as wide in dim 1, [:, ::2]); "expand:<shape>" (a leaf of
    `shape` that the function expands to `shape`, i.e. a stride-0 broadcast operand).
    """
    shape = tuple(shape)
    if view == "contiguous":
        return _leaf(shape, domain), None
    if view == "transposed":
        t = _leaf((shape[1], shape[0]) + shape[2:], domain).transpose(0, 1)
        assert t.shape == shape
        assert not t.is_contiguous() or min(shape[:2]) == 1  # size-1 dims: any stride
        return t, None
    if view == "sliced":
        t = _leaf((shape[0], 2 * shape[1]) + shape[2:], domain)[:, ::2]
        assert t.shape == shape and not t.is_contiguous()
        return t, None
    if view.startswith("expand:"):
        small = tuple(int(s) for s in view[len("expand:"):].split("x"))
        return _leaf(small, domain), lambda t: t.expand(*shape)
    raise ValueError(view)


def check(fn, specs, seed=0):
    """gradcheck fn over inputs built from specs = [(shape, view, domain), ...]."""
    ta.manual_seed(seed)
    built = [make(*s) for s in specs]
    inputs = [b[0] for b in built]
    wraps = [b[1] for b in built]

    def wrapped(*xs):
        return fn(*(x if w is None else w(x) for w, x in zip(wraps, xs)))

    assert ta.gradcheck(wrapped, inputs)


def _mask(shape, seed=1):
    rng = np.random.default_rng(seed)
    return ta.tensor(rng.random(shape) < 0.5, device=DEVICE["name"])


# ----------------------------------------------------------------------------- unary
UNARY = {
    "neg": (lambda x: -x, "real"),
    "neg_method": (lambda x: x.neg(), "real"),
    "exp": (lambda x: x.exp(), "real"),
    "log": (lambda x: ta.log(x), "positive"),
    "sqrt": (lambda x: x.sqrt(), "positive"),
    "rsqrt": (lambda x: x.rsqrt(), "positive"),
    "abs": (lambda x: abs(x), "nonzero"),
    "abs_method": (lambda x: x.abs(), "nonzero"),
    "tanh": (lambda x: x.tanh(), "real"),
    "sigmoid": (lambda x: ta.sigmoid(x * 3), "real"),
    "relu": (lambda x: x.relu(), "nonzero"),
    "gelu": (lambda x: gelu(x), "real"),
    "gelu_tanh": (lambda x: gelu(x, approximate="tanh"), "real"),
    "gelu_ops": (lambda x: ta.ops.gelu(x * 2), "real"),
    "silu": (lambda x: silu(x), "real"),
    "dropout": (lambda x: _dropout(x), "real"),
    "clamp": (lambda x: x.clamp(-0.5, 0.5), "clamp"),
    "clamp_min": (lambda x: x.clamp(min=-0.5), "clamp"),
    "clamp_max": (lambda x: ta.clamp(x, max=0.5), "clamp"),
    "clip": (lambda x: x.clip(-0.5, 0.5), "clamp"),
    "add_scalar": (lambda x: x + 2.5, "real"),
    "radd_scalar": (lambda x: 2.5 + x, "real"),
    "sub_scalar": (lambda x: x - 1.5, "real"),
    "rsub_scalar": (lambda x: 1.5 - x, "real"),
    "mul_scalar": (lambda x: x * -1.5, "real"),
    "rmul_scalar": (lambda x: -1.5 * x, "real"),
    "div_scalar": (lambda x: x / 3.0, "real"),
    "rdiv_scalar": (lambda x: 2.0 / x, "nonzero"),
    "pow_int": (lambda x: x ** 3, "real"),
    "pow_square": (lambda x: x ** 2, "real"),
    "pow_frac": (lambda x: x ** 1.5, "positive"),
    "pow_negative": (lambda x: x ** -2.0, "positive"),
    "pow_method": (lambda x: x.pow(0.5), "positive"),
    "rpow_scalar": (lambda x: 2.0 ** x, "real"),
    "rpow_e": (lambda x: 0.7 ** x, "real"),
    # ops/math.py, rounding.py, binary_math.py
    "sin": (lambda x: x.sin(), "real"),
    "cos": (lambda x: ta.cos(x), "real"),
    "tan": (lambda x: x.tan(), "unit"),
    "asin": (lambda x: x.asin(), "unit"),
    "acos": (lambda x: ta.acos(x), "unit"),
    "atan": (lambda x: x.atan(), "real"),
    "sinh": (lambda x: x.sinh(), "real"),
    "cosh": (lambda x: ta.cosh(x), "real"),
    "asinh": (lambda x: x.asinh(), "real"),
    "acosh": (lambda x: x.acosh(), "above1"),
    "atanh": (lambda x: ta.atanh(x), "unit"),
    "erf": (lambda x: x.erf(), "real"),
    "erfc": (lambda x: ta.erfc(x * 2), "real"),
    "erfinv": (lambda x: x.erfinv(), "unit"),
    "log2": (lambda x: x.log2(), "positive"),
    "log10": (lambda x: ta.log10(x), "positive"),
    "log1p": (lambda x: x.log1p(), "positive"),
    "exp2": (lambda x: x.exp2(), "real"),
    "expm1": (lambda x: ta.expm1(x), "real"),
    "reciprocal": (lambda x: x.reciprocal(), "nonzero"),
    "square": (lambda x: x.square(), "real"),
    "frac": (lambda x: (x * 3).frac(), "real"),
    "floor": (lambda x: (x * 3).floor() + x, "real"),  # + x: a nonzero gradient to check
    "ceil": (lambda x: ta.ceil(x * 3) * x, "real"),
    "trunc": (lambda x: (x * 3).trunc() * x, "real"),
    "round": (lambda x: (x * 3).round() * x, "real"),
    "round_decimals": (lambda x: x.round(decimals=1) * x, "real"),
    "sign": (lambda x: x.sign() * x, "nonzero"),
    "sgn": (lambda x: ta.sgn(x) * x, "nonzero"),
    "nan_to_num": (lambda x: x.log().nan_to_num(nan=0.5) * x, "nonzero"),  # log(<0): nan
    "atan2_scalar": (lambda x: ta.atan2(x, 0.7), "real"),
    "copysign_scalar": (lambda x: x.copysign(-1.0), "nonzero"),
    "fmod_scalar": (lambda x: ta.fmod(x * 3, 1.3), "real"),
    "lerp_scalar": (lambda x: ta.lerp(x, x.exp(), 0.3), "real"),
    # ops/activations.py
    "leaky_relu": (lambda x: ta.functional.leaky_relu(x, 0.2), "nonzero"),
    "leaky_relu_negative": (lambda x: ta.functional.leaky_relu(x, -0.3), "nonzero"),
    "elu": (lambda x: ta.functional.elu(x, alpha=0.7), "nonzero"),
    "elu_negative_alpha": (lambda x: ta.functional.elu(x, alpha=-0.5), "nonzero"),
    "selu": (lambda x: ta.selu(x), "nonzero"),
    "celu": (lambda x: ta.functional.celu(x, alpha=0.5), "nonzero"),
    "softplus": (lambda x: ta.functional.softplus(x * 3, beta=2.0, threshold=4.0), "clamp"),
    "softsign": (lambda x: ta.functional.softsign(x), "nonzero"),
    "mish": (lambda x: ta.functional.mish(x * 2), "real"),
    "hardswish": (lambda x: ta.functional.hardswish(x * 2), "clamp"),
    "hardsigmoid": (lambda x: ta.functional.hardsigmoid(x * 4), "clamp"),
    "hardtanh": (lambda x: ta.functional.hardtanh(x * 2), "clamp"),
    "relu6": (lambda x: ta.functional.relu6(x * 8), "clamp"),
    "logsigmoid": (lambda x: ta.functional.logsigmoid(x * 3), "real"),
    "softmin": (lambda x: ta.functional.softmin(x, dim=1), "real"),
    "glu": (lambda x: ta.functional.glu(x, dim=1), "real"),
}
ELEM_VIEWS = ["contiguous", "transposed", "sliced", "expand:1x4", "expand:3x1"]


def _dropout(x):
    ta.manual_seed(3)  # the same mask on every call, so finite differences make sense
    return ta.functional.dropout(x, 0.4)


@pytest.mark.parametrize("view", ELEM_VIEWS)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op, view):
    fn, domain = UNARY[op]
    check(fn, [((3, 4), view, domain)])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced", "expand:1x4"])
def test_bias_gelu(view, approximate):
    check(lambda x, b: ta.functional.bias_gelu(x, b, approximate=approximate),
          [((3, 4), view, "real"), ((4,), "contiguous", "real")])
    check(lambda x, b: ta.functional.bias_gelu(x, b, approximate=approximate),
          [((2, 3, 5), "contiguous", "real"), ((5,), "contiguous", "real")])


# ----------------------------------------------------------------------------- binary
BINARY = {
    "add": (lambda a, b: a + b, "real", "real"),
    "sub": (lambda a, b: a - b, "real", "real"),
    "mul": (lambda a, b: a * b, "real", "real"),
    "div": (lambda a, b: a / b, "real", "nonzero"),
    "add_method": (lambda a, b: a.add(b), "real", "real"),
    "sub_method": (lambda a, b: a.sub(b), "real", "real"),
    "mul_method": (lambda a, b: a.mul(b), "real", "real"),
    "div_method": (lambda a, b: a.div(b), "nonzero", "nonzero"),
    "pow": (lambda a, b: a ** b, "positive", "real"),
    "pow_method": (lambda a, b: a.pow(b), "positive", "real"),
    "maximum": (lambda a, b: ta.maximum(a, b), "real", "real"),
    "minimum": (lambda a, b: a.minimum(b), "real", "real"),
    "maximum_method": (lambda a, b: a.maximum(b), "real", "real"),
    "minimum_functional": (lambda a, b: ta.functional.minimum(a, b), "real", "real"),
    # ops/math.py, rounding.py, binary_math.py
    "atan2": (lambda a, b: ta.atan2(a, b), "real", "nonzero"),
    "hypot": (lambda a, b: a.hypot(b), "nonzero", "nonzero"),
    "copysign": (lambda a, b: ta.copysign(a, b), "nonzero", "nonzero"),
    "fmod": (lambda a, b: a.fmod(b), "real", "nonzero"),
    "logaddexp": (lambda a, b: ta.logaddexp(a, b), "real", "real"),
    "lerp": (lambda a, b: ta.lerp(a, b, b * 0.5), "real", "real"),
    "clamp_tensor": (lambda a, b: a.clamp(min=b - 0.5, max=b + 0.5), "real", "real"),
    # ops/losses.py (input, target; broadcast layouts warn as torch does, and still hold)
    "mse_loss": (lambda a, b: ta.functional.mse_loss(a, b), "real", "real"),
    "l1_loss": (lambda a, b: ta.functional.l1_loss(a, b * 3, reduction="sum"), "real", "real"),
    "smooth_l1_loss": (lambda a, b: ta.functional.smooth_l1_loss(a, b, beta=0.5), "real",
                       "real"),
    "huber_loss": (lambda a, b: ta.functional.huber_loss(a, b, "none", delta=0.8), "real",
                   "real"),
    "kl_div": (lambda a, b: ta.functional.kl_div(a, b, "batchmean"), "real", "positive"),
    "kl_div_log_target": (lambda a, b: ta.functional.kl_div(a, b, log_target=True), "real",
                          "real"),
    "binary_cross_entropy_with_logits": (
        lambda a, b: ta.functional.binary_cross_entropy_with_logits(
            a + 0 * b, (b + 0 * a).sigmoid(), pos_weight=ta.tensor(1.7, device=a.device)),
        "real", "real"),
}
BINARY_LAYOUTS = {
    "contiguous": (((3, 4), "contiguous"), ((3, 4), "contiguous")),
    "transposed": (((3, 4), "transposed"), ((3, 4), "transposed")),
    "sliced": (((3, 4), "sliced"), ((3, 4), "sliced")),
    "transposed_sliced": (((3, 4), "transposed"), ((3, 4), "sliced")),
    "rhs_row": (((3, 4), "contiguous"), ((1, 4), "contiguous")),
    "rhs_vector": (((3, 4), "contiguous"), ((4,), "contiguous")),
    "rhs_column": (((3, 4), "transposed"), ((3, 1), "contiguous")),
    "lhs_row": (((1, 4), "contiguous"), ((3, 4), "sliced")),
    "lhs_vector": (((4,), "contiguous"), ((3, 4), "transposed")),
    "outer": (((3, 1), "contiguous"), ((1, 4), "contiguous")),
    "rhs_expand": (((3, 4), "contiguous"), ((3, 4), "expand:3x1")),
    "lhs_expand": (((2, 3, 4), "expand:3x4"), ((2, 3, 4), "contiguous")),
    "rhs_lead_dims": (((2, 3, 4), "sliced"), ((4,), "contiguous")),
    "scalar_tensor": (((3, 4), "contiguous"), ((), "contiguous")),
}


@pytest.mark.parametrize("layout", list(BINARY_LAYOUTS))
@pytest.mark.parametrize("op", list(BINARY))
def test_binary(op, layout):
    fn, da, db = BINARY[op]
    (sa, va), (sb, vb) = BINARY_LAYOUTS[layout]
    check(fn, [(sa, va, da), (sb, vb, db)])


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
def test_binary_same_tensor_both_sides(view):
    check(lambda x: x * x + x / (x * x + 1) - ta.maximum(x, x * 0.5), [((3, 4), view, "real")])


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_ties_split_the_gradient(op):
    # every element ties: each side gets half, so d/dx max(x, x) = 1 (as torch)
    check(lambda x: getattr(ta, op)(x, x) * 3, [_c((3, 4))])


# ----------------------------------------------------------------------------- reductions
RED_VIEWS = ["contiguous", "transposed", "sliced", "expand:2x1x4"]
DIMS = [None, 0, 1, -1, (0, 2), (2, 0, 1)]
DIM_IDS = ["all", "d0", "d1", "dneg1", "d02", "d201"]


@pytest.mark.parametrize("view", RED_VIEWS)
@pytest.mark.parametrize("keepdim", [False, True], ids=["drop", "keep"])
@pytest.mark.parametrize("dim", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("op", ["sum", "mean", "var"])
def test_sum_mean_var(op, dim, keepdim, view):
    check(lambda x: getattr(x, op)(dim, keepdim=keepdim), [((2, 3, 4), view, "real")])


@pytest.mark.parametrize("correction", [0, 2])
@pytest.mark.parametrize("dim", [None, 1, (0, 2)], ids=["all", "d1", "d02"])
def test_var_std_correction(dim, correction):
    check(lambda x: x.var(dim, correction=correction), [((2, 3, 4), "sliced", "real")])
    check(lambda x: x.std(dim, keepdim=True, correction=correction),
          [((2, 3, 4), "transposed", "real")])


@pytest.mark.parametrize("view", RED_VIEWS)
@pytest.mark.parametrize("keepdim", [False, True], ids=["drop", "keep"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_dim(op, dim, keepdim, view):
    def fn(x):
        values, indices = getattr(x, op)(dim, keepdim=keepdim)
        assert indices.dtype == ta.int64
        return values

    check(fn, [((2, 3, 4), view, "real")])


@pytest.mark.parametrize("view", RED_VIEWS)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_all(op, view):
    check(lambda x: getattr(x, op)() * 2, [((2, 3, 4), view, "real")])


@pytest.mark.parametrize("view", RED_VIEWS)
@pytest.mark.parametrize("keepdim", [False, True], ids=["drop", "keep"])
@pytest.mark.parametrize("dim", [0, 1, -1, (0, 2)], ids=["d0", "d1", "dneg1", "d02"])
def test_logsumexp(dim, keepdim, view):
    check(lambda x: x.logsumexp(dim, keepdim=keepdim), [((2, 3, 4), view, "real")])


@pytest.mark.parametrize("view", RED_VIEWS)
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax(op, dim, view):
    check(lambda x: getattr(x, op)(dim), [((2, 3, 4), view, "real")])
    check(lambda x: getattr(ta, op)(x * 3, dim), [((2, 3, 4), view, "real")], seed=1)


# ----------------------------------------------------------------------------- matmul
def _c(shape):
    return (shape, "contiguous", "real")


MATMUL = {
    "2d": [_c((3, 4)), _c((4, 2))],
    "2d_lhs_transposed": [((3, 4), "transposed", "real"), _c((4, 2))],
    "2d_rhs_transposed": [_c((3, 4)), ((4, 2), "transposed", "real")],
    "2d_both_transposed": [((3, 4), "transposed", "real"), ((4, 2), "transposed", "real")],
    "2d_lhs_sliced": [((3, 4), "sliced", "real"), _c((4, 2))],
    "2d_rhs_sliced": [_c((3, 4)), ((4, 2), "sliced", "real")],
    "3d": [_c((2, 3, 4)), _c((2, 4, 2))],
    "3d_sliced_transposed": [((2, 3, 4), "sliced", "real"), ((2, 4, 2), "transposed", "real")],
    "4d": [_c((2, 2, 3, 2)), _c((2, 2, 2, 3))],
    "batch_broadcast": [_c((2, 1, 3, 2)), _c((1, 2, 2, 3))],
    "3d_at_2d": [_c((2, 3, 4)), _c((4, 2))],
    "2d_at_3d": [_c((3, 4)), _c((2, 4, 2))],
    "lhs_expand": [((2, 3, 4), "expand:1x3x4", "real"), _c((2, 4, 2))],
    "rhs_expand": [_c((2, 3, 4)), ((2, 4, 2), "expand:4x2", "real")],
    "1d_at_2d": [_c((4,)), _c((4, 3))],
    "2d_at_1d": [_c((3, 4)), _c((4,))],
    "1d_at_1d": [_c((5,)), _c((5,))],
    "1d_at_3d": [_c((4,)), _c((2, 4, 3))],
    "3d_at_1d": [((2, 3, 4), "transposed", "real"), _c((4,))],
    "2d_at_1d_sliced": [((3, 4), "transposed", "real"), ((2, 4), "sliced", "real")],
}


def _matmul_fn(case):
    if case == "2d_at_1d_sliced":  # a stepped 1-D operand: row 1 of a sliced view
        return lambda a, b: a @ b[1]
    return lambda a, b: a @ b


@pytest.mark.parametrize("case", list(MATMUL))
def test_matmul(case):
    check(_matmul_fn(case), MATMUL[case])


@pytest.mark.parametrize("how", ["mT", "T", "transpose", "permute"])
def test_matmul_with_transposed_views_inside(how):
    def fn(a, b):
        if how == "mT":
            return a.mT @ b.mT
        if how == "T":
            return a.T @ b.T
        if how == "transpose":
            return a.transpose(-1, -2) @ b.transpose(0, 1)
        return a.permute(1, 0) @ ta.matmul(b.permute(1, 0), b)

    check(fn, [_c((4, 3)), _c((2, 4))])


# ----------------------------------------------------------------------------- view ops
def _t(data, **kwargs):
    """A constant tensor (an index, a mask) on the device the inputs are built on."""
    return ta.tensor(data, device=DEVICE["name"], **kwargs)


def IDX():  # noqa: N802 - reads as the constant it was
    return _t([2, 0, 2])


def IDX_COL():  # noqa: N802
    return _t([3, 1, 3, 0])


def IDX_2D():  # noqa: N802
    return _t([[0, 1], [1, 1]])

VIEW_OPS = {
    "view_flat": (lambda x: x.view(-1), ["contiguous"]),
    "view_split_last": (lambda x: x.view(2, 3, 2, 2), ["contiguous", "transposed", "sliced"]),
    "view_merge_first": (lambda x: x.view(6, 4), ["contiguous", "sliced"]),
    "view_tuple": (lambda x: x.view((4, 6)), ["contiguous"]),
    "view_as": (lambda x: x.view_as(ta.zeros(6, 4, device=DEVICE["name"])), ["contiguous"]),
    "reshape": (lambda x: x.reshape(4, -1), ["contiguous", "transposed", "sliced"]),
    "reshape_flat": (lambda x: x.reshape(-1), ["contiguous", "transposed", "sliced"]),
    "reshape_as": (lambda x: x.reshape_as(ta.zeros(3, 8, device=DEVICE["name"])),
                   ["contiguous", "transposed"]),
    "transpose": (lambda x: x.transpose(0, 2), ["contiguous", "transposed", "sliced"]),
    "transpose_neg": (lambda x: x.transpose(-1, -2) * 2, ["contiguous", "transposed"]),
    "permute": (lambda x: x.permute(2, 0, 1), ["contiguous", "transposed", "sliced"]),
    "permute_tuple": (lambda x: x.permute((1, 2, 0)), ["contiguous", "sliced"]),
    "T": (lambda x: x.T, ["contiguous", "transposed", "sliced"]),
    "mT": (lambda x: x.mT, ["contiguous", "transposed", "sliced"]),
    "index_int": (lambda x: x[1], ["contiguous", "transposed", "sliced"]),
    "index_neg_int": (lambda x: x[-1, 0], ["contiguous", "transposed"]),
    "index_slice": (lambda x: x[:, 1:], ["contiguous", "transposed", "sliced"]),
    "index_step": (lambda x: x[:, ::2], ["contiguous", "transposed", "sliced"]),
    "index_step_offset": (lambda x: x[..., 1:4:2], ["contiguous", "transposed", "sliced"]),
    "index_none": (lambda x: x[None, :, -1], ["contiguous", "transposed", "sliced"]),
    "index_mixed": (lambda x: x[1, None, 1:, ::3], ["contiguous", "transposed", "sliced"]),
    "index_ellipsis": (lambda x: x[..., 2], ["contiguous", "transposed", "sliced"]),
    "index_ellipsis_none": (lambda x: x[:, None, ..., 0], ["contiguous", "sliced"]),
    "index_scalar": (lambda x: x[0, 1, 2], ["contiguous", "transposed"]),
    "index_tensor_int": (lambda x: x[_t(1)], ["contiguous", "sliced"]),
    "index_twice": (lambda x: x[0] * x[1, ::2].sum() + x[1, 2], ["contiguous", "transposed"]),
    "split_int": (lambda x: _use_parts(x.split(1, dim=1)), ["contiguous", "transposed", "sliced"]),
    "split_int_uneven": (lambda x: _use_first_two(x.split(3, dim=-1)), ["contiguous", "sliced"]),
    "split_sizes": (lambda x: _use_parts(x.split([1, 2, 1], dim=2)), ["contiguous", "transposed"]),
    "split_sizes_dim0": (lambda x: _use_parts(x.split([1, 0, 1], dim=0)), ["contiguous"]),
    "chunk": (lambda x: _use_first_two(x.chunk(2, dim=2)), ["contiguous", "transposed", "sliced"]),
    "chunk_uneven": (lambda x: _use_parts(x.chunk(3, dim=1)), ["contiguous", "sliced"]),
    "unbind": (lambda x: _use_parts(x.unbind(1)), ["contiguous", "transposed", "sliced"]),
    "unbind_iter": (lambda x: _use_first_two(list(x)), ["contiguous", "transposed"]),
    "squeeze_unsqueeze": (lambda x: x.unsqueeze(1).squeeze(1), ["contiguous", "transposed"]),
    "unsqueeze_0": (lambda x: x.unsqueeze(0), ["contiguous", "transposed", "sliced"]),
    "unsqueeze_neg": (lambda x: x.unsqueeze(-1) * 2, ["contiguous", "transposed", "sliced"]),
    "unsqueeze_mid": (lambda x: x.unsqueeze(2), ["contiguous", "sliced"]),
    "flatten": (lambda x: x.flatten(), ["contiguous", "transposed", "sliced"]),
    "flatten_1": (lambda x: x.flatten(1), ["contiguous", "transposed", "sliced"]),
    "flatten_0_1": (lambda x: x.flatten(0, 1), ["contiguous", "transposed", "sliced"]),
    "flatten_neg": (lambda x: x.flatten(-2, -1), ["contiguous", "transposed", "sliced"]),
    "unflatten": (lambda x: x.unflatten(2, (2, 2)), ["contiguous", "transposed", "sliced"]),
    "unflatten_infer": (lambda x: x.unflatten(-1, (2, -1)), ["contiguous", "sliced"]),
    "narrow": (lambda x: x.narrow(1, 1, 2), ["contiguous", "transposed", "sliced"]),
    "narrow_neg_start": (lambda x: x.narrow(2, -3, 2), ["contiguous", "transposed"]),
    "expand_then_view": (lambda x: x.unsqueeze(0).expand(2, 2, 3, 4), ["contiguous", "sliced"]),
}


def _use_parts(parts):
    """Use the first and last pieces (the first twice), leaving the middle ones unused."""
    assert len(parts) >= 2
    return parts[0] * 2 + parts[0], parts[-1].exp()


def _use_first_two(parts):
    return parts[0] * parts[1].sum(), parts[1]


VIEW_CASES = [(name, view) for name, (_, views) in VIEW_OPS.items() for view in views]


@pytest.mark.parametrize("op,view", VIEW_CASES, ids=[f"{n}-{v}" for n, v in VIEW_CASES])
def test_view_op(op, view):
    fn, _ = VIEW_OPS[op]
    check(fn, [((2, 3, 4), view, "real")])


def test_views_share_memory_and_reshape_paths():
    x = ta.randn(2, 3, 4, dtype=F64, requires_grad=True)
    assert x.reshape(4, 6).shares_storage(x)  # view path
    xt = x.transpose(0, 1)
    copied = xt.reshape(4, 6)  # no view can express it: copy path
    assert not copied.shares_storage(x)
    np.testing.assert_array_equal(copied.detach().numpy(),
                                  xt.detach().numpy().reshape(4, 6))
    for v in (x.transpose(0, 2), x.permute(2, 0, 1), x.mT, x[:, ::2], x.narrow(1, 1, 2),
              x.split(2, dim=2)[1], x.unsqueeze(0), x[None, 1], x.expand(3, 2, 3, 4)):
        assert v.shares_storage(x)


EXPAND_OPS = {
    "expand": lambda x: x.expand(2, 3, 4),
    "expand_minus_one": lambda x: x.expand(-1, 4),
    "expand_same_ndim": lambda x: x.expand(3, 4) * x.expand(3, 4),
    "broadcast_to": lambda x: x.broadcast_to((2, 3, 4)),
    "expand_contiguous": lambda x: x.expand(2, 3, 4).contiguous() * 2,
    "expand_as": lambda x: x.expand_as(ta.zeros(2, 3, 4, device=DEVICE["name"])),
}


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("op", list(EXPAND_OPS))
def test_expand(op, view):
    check(EXPAND_OPS[op], [((3, 1), view, "real")])


SQUEEZE_OPS = {
    "squeeze_dim": lambda x: x.squeeze(1),
    "squeeze_all": lambda x: x.squeeze(),
    "squeeze_noop": lambda x: x.squeeze(0),
    "squeeze_tuple": lambda x: x.squeeze((1, 3)),
    "squeeze_neg": lambda x: x.squeeze(-1),
}


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("op", list(SQUEEZE_OPS))
def test_squeeze(op, view):
    # transposed: leaf (1, 2, 3, 1) -> (2, 1, 3, 1); sliced: leaf (2, 2, 3, 1)[:, ::2]
    check(SQUEEZE_OPS[op], [((2, 1, 3, 1), view, "real")])


AS_STRIDED = {
    "plain": ((3, 4), (4, 1), None),
    "transposed_geometry": ((4, 3), (1, 4), None),
    "overlapping_window": ((5, 4), (2, 1), None),
    "overlapping_stride0": ((3, 2, 2), (3, 0, 1), 1),
    "offset": ((2, 2), (1, 3), 2),
}


@pytest.mark.parametrize("case", list(AS_STRIDED))
def test_as_strided(case):
    size, stride, offset = AS_STRIDED[case]
    check(lambda x: x.as_strided(size, stride, offset), [_c((3, 4))])


@pytest.mark.parametrize("view", ["transposed", "sliced"])
def test_as_strided_of_a_view(view):
    # the view covers every storage element that the as_strided window reads
    def fn(x):
        if view == "transposed":  # x = leaf(4, 3).T: storage of 12, strides (1, 3)
            return x.as_strided((2, 5), (2, 1), 1)
        return x.as_strided((3, 2), (8, 4), 2)  # x = leaf(3, 8)[:, ::2]: strides (8, 2)

    check(fn, [((3, 4), view, "real")])


# ----------------------------------------------------------------------------- copies
COPY_OPS = {
    "contiguous": lambda x: x.contiguous(),
    "clone": lambda x: x.clone(),
    "clone_then_view": lambda x: x.clone().transpose(0, 1)[::2],
    "index_tensor_repeated": lambda x: x[IDX()],
    "index_list_repeated": lambda x: x[[0, 2, 0, 0]],
    "index_negative": lambda x: x[_t([-1, 0, -1])],
    "index_bool_mask": lambda x: x[_mask((3, 4))],
    "index_bool_rows": lambda x: x[_t([True, False, True])],
    "index_cols_repeated": lambda x: x[:, IDX_COL()],
    "index_pairs": lambda x: x[IDX(), _t([1, 1, 3])],
    "index_2d_tensor": lambda x: x[IDX_2D()],
    "index_slice_and_list": lambda x: x[1:, [0, 0, 2]],
    "index_int_and_tensor": lambda x: x[1, IDX_COL()],
    "tril": lambda x: x.tril(),
    "tril_minus1": lambda x: ta.tril(x, -1),
    "tril_plus1": lambda x: x.tril(1),
    "triu": lambda x: x.triu(),
    "triu_plus1": lambda x: ta.triu(x, 1),
    "triu_minus1": lambda x: x.triu(diagonal=-1),
    "masked_fill": lambda x: x.masked_fill(_mask((3, 4)), 3.0),
    "masked_fill_row_mask": lambda x: x.masked_fill(_mask((1, 4), seed=3), -2.0),
    "masked_fill_vec_mask": lambda x: ta.masked_fill(x, _mask((4,), seed=5), 0.0),
    "gather_dim0": lambda x: x.gather(0, _t([[2, 0, 2, 1], [0, 0, 1, 2]])),
    "gather_dim1": lambda x: ta.gather(x, 1, _t([[3, 3, 0], [1, 2, 1], [0, 0, 0]])),
    "gather_smaller": lambda x: x.gather(-1, _t([[1], [3]])),
    "index_select_dim0": lambda x: x.index_select(0, _t([2, 0, 2, 1])),
    "index_select_dim1": lambda x: ta.index_select(x, 1, _t([3, 3, 0])),
    "embedding": lambda x: ta.functional.embedding(_t([[2, 0], [2, 1]]), x),  # x: the weight
    "where_scalar_other": lambda x: ta.where(_mask((3, 4)), x, 0.5),
    "where_scalar_self": lambda x: ta.where(_mask((3, 4)), -1.0, x * 2),
    "where_method": lambda x: x.where(_mask((3, 4)), x.exp()),
    "where_broadcast_cond": lambda x: ta.where(_mask((1, 4), seed=2), x, -x),
    "stack_self": lambda x: ta.stack([x, x * 2], dim=1),
    "cat_self": lambda x: ta.cat([x, x], dim=0),
}


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("op", list(COPY_OPS))
def test_copy_op(op, view):
    check(COPY_OPS[op], [((3, 4), view, "real")])


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("op", ["tril", "triu"])
def test_tri_batched(op, view):
    check(lambda x: getattr(x, op)(0) + getattr(ta, op)(x, -1), [((2, 3, 3), view, "real")])


def test_gather_3d():
    idx = _t([[[0, 0, 2]], [[1, 2, 1]]])  # (2, 1, 3) into (2, 3, 4) along -1
    check(lambda x: x.gather(-1, idx), [((2, 3, 4), "sliced", "real")])


CAT_CASES = {
    "dim0": ([(3, 4), (2, 4)], 0),
    "dim1": ([(3, 4), (3, 2)], 1),
    "dim_neg_three_inputs": ([(2, 3, 1), (2, 3, 2), (2, 3, 3)], -1),
    "dim1_3d": ([(2, 1, 2), (2, 3, 2)], 1),
}


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("case", list(CAT_CASES))
def test_cat(case, view):
    shapes, dim = CAT_CASES[case]
    check(lambda *xs: ta.cat(xs, dim=dim), [(s, view, "real") for s in shapes])


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack(dim, view):
    check(lambda a, b, c: ta.stack([a, b, c], dim=dim), [((3, 2), view, "real")] * 3)


WHERE_LAYOUTS = {
    "contiguous": [_c((3, 4)), _c((3, 4))],
    "transposed": [((3, 4), "transposed", "real"), ((3, 4), "transposed", "real")],
    "sliced": [((3, 4), "sliced", "real"), ((3, 4), "transposed", "real")],
    "broadcast": [_c((3, 1)), _c((4,))],
    "expand": [((3, 4), "expand:1x4", "real"), ((3, 4), "sliced", "real")],
}


@pytest.mark.parametrize("layout", list(WHERE_LAYOUTS))
def test_where_two_tensors(layout):
    check(lambda a, b: ta.where(_mask((3, 4)), a, b), WHERE_LAYOUTS[layout])


def test_masked_fill_attention_mask():
    causal = ta.ones(3, 3, dtype=ta.bool, device=DEVICE["name"]).tril()

    def fn(s):
        return s.masked_fill(~causal, float("-inf")).softmax(-1)

    check(fn, [((2, 3, 3), "transposed", "real")])


def test_masked_fill_value_tensor_gets_gradient():
    # as torch: a 0-d tensor fill value is differentiable (its grad is the masked sum)
    mask = _mask((3, 4))
    check(lambda x, v: x.masked_fill(mask, v), [_c((3, 4)), _c(())])


@pytest.mark.parametrize("mask", ["bool", "float", "none"])
def test_masked_softmax(mask):
    ms = ta.functional.masked_softmax
    if mask == "bool":  # causal: no row is fully masked (that row's output is nan)
        causal = ta.tensor(np.triu(np.ones((3, 3), dtype=bool), 1), device=DEVICE["name"])
        check(lambda x: ms(x, causal, scale=0.5), [((2, 3, 3), "transposed", "real")])
        check(lambda x: ms(x, causal.view(3, 1, 3), dim=0), [((3, 4, 3), "sliced", "real")])
    elif mask == "float":  # the additive mask gets its gradient, summed over the broadcast
        check(lambda x, m: ms(x, m, scale=0.7), [((2, 3, 4), "sliced", "real"), _c((3, 4))])
        check(lambda x, m: ms(x, m, dim=0), [((2, 3, 4), "transposed", "real"), _c((2, 1, 4))])
    else:
        check(lambda x: ms(x, scale=2.0, dim=1), [((2, 3, 4), "transposed", "real")])


# ----------------------------------------------------------------------------- in place
class _Late:
    """A constant tensor built when the checked function runs (on the inputs' device)."""

    def __init__(self, make, *args):
        self.make, self.args = make, args

    @staticmethod
    def get(x):
        return x.make(*x.args) if isinstance(x, _Late) else x


def _inplace(method, *args, **kwargs):
    def fn(x, *others):
        y = x * 1  # a non-leaf: in-place ops rebase its history
        getattr(y, method)(*(others + tuple(_Late.get(a) for a in args)), **kwargs)
        return y

    return fn


def _setitem(index):
    def fn(x, z):
        y = x * 1
        y[_Late.get(index)] = z
        return y

    return fn


def _setitem_scalar(index, value):
    def fn(x):
        y = x * 2
        y[_Late.get(index)] = value
        return y.exp()

    return fn


INPLACE = {
    "add_": (_inplace("add_"), [_c((3, 4)), _c((3, 4))]),
    "add_transposed_other": (_inplace("add_"), [_c((3, 4)), ((3, 4), "transposed", "real")]),
    "add_sliced_other": (_inplace("add_"), [_c((3, 4)), ((3, 4), "sliced", "real")]),
    "add_broadcast": (_inplace("add_"), [_c((3, 4)), _c((4,))]),
    "add_alpha": (_inplace("add_", alpha=-2.5), [_c((3, 4)), _c((1, 4))]),
    "add_scalar": (_inplace("add_", 3.0), [_c((3, 4))]),
    "sub_": (_inplace("sub_"), [_c((3, 4)), ((3, 4), "sliced", "real")]),
    "sub_alpha": (_inplace("sub_", alpha=0.5), [_c((3, 4)), _c((3, 1))]),
    "mul_": (_inplace("mul_"), [_c((3, 4)), _c((3, 4))]),
    "mul_transposed_other": (_inplace("mul_"), [_c((3, 4)), ((3, 4), "transposed", "real")]),
    "mul_broadcast": (_inplace("mul_"), [_c((3, 4)), _c((1, 4))]),
    "mul_scalar": (_inplace("mul_", -1.5), [_c((3, 4))]),
    "div_": (_inplace("div_"), [_c((3, 4)), ((3, 4), "contiguous", "nonzero")]),
    "div_broadcast": (_inplace("div_"), [_c((3, 4)), ((4,), "contiguous", "nonzero")]),
    "div_sliced_other": (_inplace("div_"), [_c((3, 4)), ((3, 4), "sliced", "nonzero")]),
    "div_scalar": (_inplace("div_", 4.0), [_c((3, 4))]),
    "masked_fill_": (_inplace("masked_fill_", _Late(_mask, (3, 4)), 2.0), [_c((3, 4))]),
    "masked_fill_broadcast": (_inplace("masked_fill_", _Late(_mask, (4,)), 0.0), [_c((3, 4))]),
    "clamp_": (_inplace("clamp_", -0.5, 0.5), [((3, 4), "contiguous", "clamp")]),
    "clamp_min_only": (_inplace("clamp_", -0.5), [((3, 4), "contiguous", "clamp")]),
    "clamp_max_only": (_inplace("clamp_", None, 0.5), [((3, 4), "contiguous", "clamp")]),
    "copy_": (_inplace("copy_"), [_c((3, 4)), ((4,), "contiguous", "real")]),
    "setitem_int": (_setitem(0), [_c((3, 4)), _c((4,))]),
    "setitem_column": (_setitem((slice(None), 1)), [_c((3, 4)), _c((3,))]),
    "setitem_step": (_setitem((slice(1, None), slice(None, None, 2))), [_c((3, 4)), _c((2, 2))]),
    "setitem_broadcast": (_setitem(slice(0, 2)), [_c((3, 4)), _c((4,))]),
    "setitem_tensor_index": (_setitem(_Late(_t, [2, 0])), [_c((3, 4)), _c((2, 4))]),
    "setitem_list_index": (_setitem([0, 2]), [_c((3, 4)), _c((1, 4))]),
    "setitem_bool_mask": (_setitem(_Late(_mask, (3, 4))), [_c((3, 4)), _c(())]),
    "setitem_transposed_value": (_setitem(slice(None)), [_c((3, 4)),
                                                         ((3, 4), "transposed", "real")]),
    "setitem_scalar": (_setitem_scalar((1, 2), 1.5), [_c((3, 4))]),
    "setitem_scalar_mask": (_setitem_scalar(_Late(_mask, (3, 4)), -1.0), [_c((3, 4))]),
}


@pytest.mark.parametrize("case", list(INPLACE))
def test_inplace_on_non_leaf(case):
    fn, specs = INPLACE[case]
    check(fn, specs)


def test_inplace_chain():
    def fn(x, z, w):
        y = x.tanh() * 2
        y.mul_(z)
        y.add_(w, alpha=0.5)
        y[0] = z[1] * w[2]
        y.div_(1.5)
        y.clamp_(-3.0, 3.0)
        return y.sum(1), y

    check(fn, [_c((3, 4)), _c((3, 4)), _c((3, 4))])


def test_inplace_result_feeds_later_ops():
    def fn(x, z):
        y = x * 1
        y.add_(z)
        y[1, ::2] = z[0, 1:3]
        return (y.softmax(-1) @ z.T).logsumexp(0)

    check(fn, [_c((3, 4)), ((3, 4), "transposed", "real")])


def test_setitem_into_constant_buffer():
    def fn(x, z):
        # does not require grad until it receives z
        buf = ta.zeros(3, 4, dtype=F64, device=DEVICE["name"])
        buf[1] = z
        buf[_t([0, 2]), 1:3] = x
        return buf * 2

    check(fn, [_c((2, 2)), _c((4,))])


def test_inplace_add_itself():
    def fn(x):
        y = x * 1
        y.add_(y)
        return y

    check(fn, [_c((3, 4))])


def test_inplace_mul_by_itself_is_right_or_refused():
    # torch refuses (mul_ saved `other`, which the op itself overwrote); silently using
    # the overwritten value would give a wrong gradient
    ta.manual_seed(0)
    x = ta.randn(3, 4, dtype=F64, requires_grad=True)

    def fn(x):
        y = x * 1
        y.mul_(y)
        return y

    try:
        ok = ta.gradcheck(fn, [x])
    except RuntimeError as e:
        assert "in-place" in str(e) or "inplace" in str(e)
    else:
        assert ok


def test_remainder_and_floor_divide():
    x = ta.randn(3, 4, dtype=F64, requires_grad=True)
    y = (ta.rand(4, 3, dtype=F64) + 0.5).requires_grad_()
    assert ta.gradcheck(lambda x, y: (x * 3) % y.T, [x, y])  # y transposed: non-contiguous
    assert ta.gradcheck(lambda x: 2.5 % (x.abs() + 1), [x])
    assert (ta.arange(-4, 5) % 3).tolist() == [2, 0, 1, 2, 0, 1, 2, 0, 1]  # Python's sign
    assert (ta.arange(-4, 5) // 3).tolist() == [-2, -1, -1, -1, 0, 0, 0, 1, 1]


@pytest.mark.parametrize("shape, transposed", [
    ((2000,), False),           # one partial block of the blocked float32 kernel
    ((3, 65536 + 17), False),   # several blocks and a ragged last one
    ((517, 300), True),         # a transposed (non-contiguous) input: the whole-array path
])
def test_float32_gelu_and_erf_match_the_exact_float64_path(shape, transposed):
    base = ta.randn(*shape, dtype=F64) * 3
    x64 = base.T if transposed else base
    x32 = base.float().T if transposed else base.float()
    assert x32.is_contiguous() != transposed
    x32.requires_grad_()
    x64.requires_grad_()
    y64, y32 = ta.functional.gelu(x64), ta.functional.gelu(x32)
    y64.sum().backward()
    y32.sum().backward()
    np.testing.assert_allclose(y32.detach().numpy(), y64.detach().numpy(), atol=2e-6)
    np.testing.assert_allclose(x32.grad.numpy(), x64.grad.numpy(), atol=2e-6)
    assert y32.dtype == ta.float32 and x32.grad.dtype == ta.float32


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_gradcheck_contiguous_and_transposed(reduction):
    logits = ta.randn(6, 5, dtype=F64, requires_grad=True)
    logits_t = ta.randn(5, 6, dtype=F64, requires_grad=True)  # used as (6, 5) via .T
    target = ta.tensor([0, 4, 1, -100, 2, 2])
    ce = ta.functional.cross_entropy
    assert ta.gradcheck(lambda z: ce(z, target, reduction=reduction), [logits])
    assert ta.gradcheck(lambda z: ce(z.T, target, reduction=reduction), [logits_t])


def test_cross_entropy_matches_torch_and_rejects_bad_input():
    torch = pytest.importorskip("torch")
    logits = ta.randn(7, 4, dtype=F64, requires_grad=True)
    target = ta.tensor([3, 0, 1, 1, -1, 2, 0])
    loss = ta.functional.cross_entropy(logits, target, ignore_index=-1)
    loss.backward()
    tl = torch.tensor(logits.detach().numpy(), requires_grad=True)
    ref = torch.nn.functional.cross_entropy(tl, torch.tensor(target.numpy()), ignore_index=-1)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    np.testing.assert_allclose(logits.grad.numpy(), tl.grad.numpy(), atol=1e-12)
    ce = ta.functional.cross_entropy
    with pytest.raises(ta.ShapeError, match=r"cross_entropy: expected logits \(N, C\)"):
        ce(logits, target[:3])
    with pytest.raises(IndexError, match="cross_entropy: Target 4 is out of bounds"):
        ce(logits, ta.tensor([0, 1, 2, 3, 4, 0, 0]))
    with pytest.raises(RuntimeError, match="cross_entropy: a float"):
        ce(logits, ta.zeros(7))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_with_classes_and_weights(reduction):
    F = ta.functional
    target = ta.tensor([0, 4, 1, -100, 2, 2])
    weight = ta.tensor([1.0, 2.0, 0.5, 3.0, 1.5], dtype=F64)
    probs = ta.rand(6, 5, dtype=F64)
    check(lambda z: F.nll_loss(z, target, weight, reduction=reduction), [((6, 5), "sliced",
                                                                            "real")])
    check(lambda z: F.cross_entropy(z, target, weight, reduction=reduction,
                                    label_smoothing=0.2), [((6, 5), "transposed", "real")])
    check(lambda z: F.cross_entropy(z, probs, reduction=reduction), [_c((6, 5))])
    check(lambda z: F.cross_entropy(z.view(2, 3, 5).transpose(1, 2),
                                    target.view(2, 3).clamp(min=0), reduction=reduction),
          [_c((6, 5))])
    x, _ = make((3, 4), "transposed")
    t = ta.rand(3, 4, dtype=F64).requires_grad_()
    w = ta.rand(4, dtype=F64) + 0.5
    bce = F.binary_cross_entropy
    assert ta.gradcheck(lambda x, t: bce(x.sigmoid() * 0.9 + 0.05, t, w, reduction=reduction),
                        [x, t])


def test_layer_norm_gradcheck_over_two_normalized_dims_noncontiguous():
    x = ta.randn(3, 5, 4, dtype=F64, requires_grad=True)
    w = ta.randn(4, 5, dtype=F64, requires_grad=True)
    b = ta.randn(4, 5, dtype=F64, requires_grad=True)
    ln = ta.functional.layer_norm
    assert ta.gradcheck(lambda x, w, b: ln(x.transpose(1, 2), (4, 5), w, b), [x, w, b])
    with pytest.raises(ta.ShapeError, match="layer_norm: input of shape"):
        ln(x, (5,), None, None)


def test_to():
    # float64 -> float32 -> float64 is linear with a rounding of ~1e-7: a wide step keeps the
    # rounding out of the finite differences. Moving to the host and back is ToDevice's
    # backward twice on a GPU (and no op at all on the CPU).
    x, _ = make((3, 4), "transposed")
    assert ta.gradcheck(lambda x: x.float().to(ta.float64) * x, [x], eps=1e-2)
    assert ta.gradcheck(lambda x: x.cpu().to(x.device).exp(), [x])


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention(causal):
    sdpa = ta.functional.scaled_dot_product_attention
    kv_len = 3 if causal else 5
    check(lambda q, k, v: sdpa(q, k, v, is_causal=causal, block_size=2),
          [((2, 3, 4), "transposed", "real"), ((2, kv_len, 4), "sliced", "real"),
           _c((2, kv_len, 3))])


def test_checkpoint():
    def block(a, b):
        return (a @ b).tanh() * a.sum()

    check(lambda x, w: ta.checkpoint(block, x, w), [((3, 4), "transposed", "real"), _c((4, 4))])


# ----------------------------------------------------------------------------- on device
ON_DEVICE = (
    [(test_unary, {"op": op, "view": "transposed"}) for op in UNARY]
    + [(test_binary, {"op": op, "layout": "rhs_row"}) for op in BINARY]
    + [(test_binary, {"op": "mul", "layout": lay}) for lay in BINARY_LAYOUTS]
    + [(test_bias_gelu, {"view": "transposed", "approximate": a}) for a in ("none", "tanh")]
    + [(test_sum_mean_var, {"op": op, "dim": (0, 2), "keepdim": True, "view": "sliced"})
       for op in ("sum", "mean", "var")]
    + [(test_sum_mean_var, {"op": "sum", "dim": None, "keepdim": False, "view": "expand:2x1x4"}),
       (test_var_std_correction, {"dim": 1, "correction": 2}),
       (test_max_min_dim, {"op": "max", "dim": 1, "keepdim": False, "view": "transposed"}),
       (test_max_min_dim, {"op": "min", "dim": -1, "keepdim": True, "view": "sliced"}),
       (test_max_min_all, {"op": "max", "view": "expand:2x1x4"}),
       (test_logsumexp, {"dim": (0, 2), "keepdim": False, "view": "transposed"}),
       (test_softmax, {"op": "softmax", "dim": 1, "view": "transposed"}),
       (test_softmax, {"op": "log_softmax", "dim": -1, "view": "sliced"}),
       (test_matmul_with_transposed_views_inside, {"how": "permute"}),
       (test_views_share_memory_and_reshape_paths, {}),
       (test_as_strided_of_a_view, {"view": "sliced"}),
       (test_tri_batched, {"op": "triu", "view": "transposed"}),
       (test_gather_3d, {}),
       (test_masked_fill_attention_mask, {}),
       (test_masked_fill_value_tensor_gets_gradient, {}),
       (test_masked_softmax, {"mask": "bool"}),
       (test_masked_softmax, {"mask": "float"}),
       (test_to, {}),
       (test_scaled_dot_product_attention, {"causal": True}),
       (test_checkpoint, {})]
    + [(test_matmul, {"case": case}) for case in MATMUL]
    + [(test_view_op, {"op": op, "view": views[-1]}) for op, (_, views) in VIEW_OPS.items()]
    + [(test_expand, {"op": op, "view": "sliced"}) for op in EXPAND_OPS]
    + [(test_squeeze, {"op": op, "view": "transposed"}) for op in SQUEEZE_OPS]
    + [(test_as_strided, {"case": case}) for case in AS_STRIDED]
    + [(test_copy_op, {"op": op, "view": "transposed"}) for op in COPY_OPS]
    + [(test_cat, {"case": case, "view": "sliced"}) for case in CAT_CASES]
    + [(test_stack, {"dim": 1, "view": "transposed"})]
    + [(test_where_two_tensors, {"layout": lay}) for lay in WHERE_LAYOUTS]
    + [(test_inplace_on_non_leaf, {"case": case}) for case in INPLACE]
    + [(test_inplace_chain, {}), (test_inplace_result_feeds_later_ops, {}),
       (test_setitem_into_constant_buffer, {}), (test_inplace_add_itself, {})]
)


def _case_id(case):
    fn, kwargs = case
    return "-".join([fn.__name__.removeprefix("test_")] + [str(v) for v in kwargs.values()])


@pytest.mark.parametrize("case", ON_DEVICE, ids=[_case_id(c) for c in ON_DEVICE])
def test_op_on_device(gpu_device, case, monkeypatch):
    """Every op above, in one representative layout, with its inputs on the GPU (or the
    fake CuPy): the gradients are checked there, in float64, by the same gradcheck."""
    monkeypatch.setitem(DEVICE, "name", gpu_device)
    fn, kwargs = case
    fn(**kwargs)


# ----------------------------------------------------------------------------- torch's forms
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_mm_bmm_t(layout):
    check(lambda a, b: ta.mm(a, b.t()), [((3, 4), layout, "real"), ((2, 4), layout, "real")])
    check(lambda a, b: a.bmm(b), [((2, 3, 4), layout, "real"), _c((2, 4, 2))])
    check(lambda x: x.t() * 2 + ta.t(x[0]).sum(), [((3, 4), layout, "real")])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_aminmax(layout):
    check(lambda x: ta.aminmax(x, dim=1).min * 2 + x.aminmax(dim=0, keepdim=True).max.sum(),
          [((3, 4), layout, "real")])
    check(lambda x: ta.aminmax(x).max - x.aminmax().min, [((3, 4), layout, "real")])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_products_of_given_ranks(layout):
    check(lambda a, b: ta.dot(a[0], b[1]) + a.mv(b[0]).sum() + ta.outer(a[1], b[2]).sum(),
          [((3, 4), layout, "real"), ((3, 4), "contiguous", "real")])
    check(lambda c, a, b: ta.addmm(c, a, b.t(), beta=0.5, alpha=2),
          [_c((3,)), ((3, 4), layout, "real"), ((3, 4), layout, "real")])
    check(lambda c, a, b: c.baddbmm(a, b, alpha=-1),
          [_c((2, 3, 2)), ((2, 3, 4), layout, "real"), _c((2, 4, 2))])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_addcmul_addcdiv_nansum_nanmean(layout):
    check(lambda x, a, b: ta.addcmul(x, a, b, value=0.5) + x.addcdiv(a, b, value=2),
          [((3, 4), layout, "real"), _c((4,)), ((3, 1), "contiguous", "positive")])
    check(lambda x: ta.nansum(x, 1) + x.nanmean(0).sum(), [((3, 4), layout, "real")])
    check(lambda x: x.nanmedian(1).values.sum() + ta.nanmedian(x), [((3, 4), layout, "real")])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_select_ravel_fliplr_flipud(layout):
    check(lambda x: x.select(1, -1) * 2 + ta.ravel(x)[:3] + x.fliplr()[0, :3]
          + ta.flipud(x)[:, 0], [((3, 4), layout, "real")])


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_named_tuple_fields_carry_the_gradient(layout):
    check(lambda x: x.max(dim=1).values + x.min(1, keepdim=True).values.sum()
          + ta.sort(x, 0).values[0].sum() + x.topk(2).values.sum(), [((3, 4), layout, "real")])


# ----------------------------------------------------------------------------- coverage
# Read by tests/test_registry.py: every differentiable public op needs a row here. A table
# row counts for the public name its key starts with (`clamp_min` is a clamp row, `add_` an
# in-place one); the tests outside the tables name the ops they check.
TESTS_OF = {
    "sum": test_sum_mean_var, "mean": test_sum_mean_var, "var": test_sum_mean_var,
    "std": test_var_std_correction, "max": test_max_min_dim, "min": test_max_min_all,
    "logsumexp": test_logsumexp, "softmax": test_softmax, "log_softmax": test_softmax,
    "masked_softmax": test_masked_softmax,
    "matmul": test_matmul, "getitem": test_view_op, "as_strided": test_as_strided,
    "cat": test_cat, "remainder": test_remainder_and_floor_divide, "to": test_to,
    "cross_entropy": test_cross_entropy_gradcheck_contiguous_and_transposed,
    "layer_norm": test_layer_norm_gradcheck_over_two_normalized_dims_noncontiguous,
    "scaled_dot_product_attention": test_scaled_dot_product_attention,
    "checkpoint": test_checkpoint, "bias_gelu": test_bias_gelu,
    "nll_loss": test_losses_with_classes_and_weights,
    "binary_cross_entropy": test_losses_with_classes_and_weights,
    "mm": test_mm_bmm_t, "bmm": test_mm_bmm_t, "t": test_mm_bmm_t, "aminmax": test_aminmax,
    "dot": test_products_of_given_ranks, "mv": test_products_of_given_ranks,
    "outer": test_products_of_given_ranks, "addmm": test_products_of_given_ranks,
    "baddbmm": test_products_of_given_ranks, "addcmul": test_addcmul_addcdiv_nansum_nanmean,
    "addcdiv": test_addcmul_addcdiv_nansum_nanmean, "nansum": test_addcmul_addcdiv_nansum_nanmean,
    "nanmean": test_addcmul_addcdiv_nansum_nanmean,
    "nanmedian": test_addcmul_addcdiv_nansum_nanmean, "select": test_select_ravel_fliplr_flipud,
    "ravel": test_select_ravel_fliplr_flipud, "fliplr": test_select_ravel_fliplr_flipud,
    "flipud": test_select_ravel_fliplr_flipud,
}
TABLES = (UNARY, BINARY, VIEW_OPS, EXPAND_OPS, SQUEEZE_OPS, COPY_OPS, INPLACE)
COVERED = {key for table in TABLES for key in table} | set(TESTS_OF)


# ----------------------------------------------------------------------------- gradient maps
# The backward of a linear view or shaping op is itself linear in g, and its recorded form
# (create_graph=True) is an op whose own backward is the forward op again. Checking a first
# gradient (with its graph) checks that op: its d1 row is a second derivative, its d2 row a
# third.
GRADIENT_MAPS = {
    "as_strided_of_expanded": lambda x: x[:1].expand(3, 4).as_strided((2, 3), (1, 1), 1),
    "diagonal": lambda x: x.diagonal(1),
    "diag_of_matrix": lambda x: ta.diag(x, -1),
    "unfold": lambda x: x.unfold(1, 2, 1),
    "pad_constant": lambda x: ta.functional.pad(x, (1, -1, 2, 0), value=0.5),
    "pad_reflect": lambda x: ta.functional.pad(x[None], (2, 1), mode="reflect"),
    "repeat_interleave": lambda x: x.repeat_interleave(_t([1, 0, 2]), dim=0),
    "split": lambda x: ta.cat([p * (i + 1) for i, p in enumerate(x.split([1, 3], 1))], 1),
}


@pytest.mark.parametrize("op", list(GRADIENT_MAPS))
def test_gradient_of_a_view_gradient(op):
    def first(x):
        with ta.enable_grad():  # also when gradcheck evaluates it for finite differences
            y = GRADIENT_MAPS[op](x)
            (gx,) = ta.autograd.grad((y * y * y).sum(), x, create_graph=True)
        return gx

    check(first, [((3, 4), "sliced", "real")])


def test_view_second_derivatives_under_the_emulated_habits():
    # the story's habits (a full zero gradient per slice, permutes that copy) change what
    # backward allocates, not what create_graph=True records
    def fn(x):
        return (x[:, 1:].transpose(0, 1) ** 3).sum() + (x.permute(1, 0)[::2] ** 2).sum()

    def hessian_row(**habits):
        ta.manual_seed(0)
        x = ta.randn(3, 4, dtype=F64).requires_grad_()
        with ta.memory.emulate(**habits):
            (g,) = ta.autograd.grad(fn(x), x, create_graph=True)
            (h,) = ta.autograd.grad(g.sum(), x)
        return h.numpy()

    plain = hessian_row()
    ta.manual_seed(0)
    x = ta.randn(3, 4, dtype=F64).numpy()
    expected = np.zeros((3, 4))
    expected[:, 1:] += 6 * x[:, 1:]  # d/dx of 3 x^2
    expected[:, ::2] += 2  # d/dx of 2 x
    np.testing.assert_allclose(plain, expected, rtol=1e-12)
    np.testing.assert_allclose(hessian_row(slice_grad_full=True), plain, rtol=1e-12)
    np.testing.assert_allclose(hessian_row(permute_copies=True), plain, rtol=1e-12)
    check(fn, [((3, 4), "sliced", "real")])
