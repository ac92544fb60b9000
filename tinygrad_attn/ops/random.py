"""Sampling ops that take a tensor: the in-place random fills (uniform_, normal_, ...) and
torch.bernoulli, torch.normal, torch.poisson, torch.multinomial.

Every draw comes from a ta.Generator (generator=, or the default one; backend/random.py
says which stream). As in torch, a sample is not differentiated through: the gradient of a
fill's target and of the inputs of bernoulli, normal and poisson is zero (not the
reparameterized derivative), and multinomial's int64 indices have none.

The fills go through the in-place machinery of ops/inplace.py: the checks before anything
is written (a leaf that requires grad, a view while recording, an expanded target) and
ctx.mark_dirty, which bumps the version counter the target shares with its views; a view
writes its base's memory.
"""

from __future__ import annotations

from .. import backend
from .. import shape as shp
from ..autograd import Function
from ..creation import _generator, _normal_of_size
from ._util import Tensor, check_same_device, from_array
from .inplace import _guard, check_internal_overlap, check_partial_overlap
from .registry import op


def _zeros(t_shape, dtype, device):
    xp = backend.xp_for(device)
    with backend.on_device(device):
        return from_array(xp.zeros(t_shape, dtype=dtype.np))


class RandomFill(Function):
    """x[...] = draw(x), fresh samples of x's shape and dtype;  gx = 0, g_p = 0 (the old
    values are gone, and a sample is not differentiated through). Saves nothing."""

    @staticmethod
    def forward(ctx, x, p=None, *, draw):
        ctx.p_shape, ctx.p_dtype = getattr(p, "shape", None), getattr(p, "dtype", None)
        x._array()[...] = draw(x)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        nx, np_ = ctx.needs_input_grad[:2]
        gx = _zeros(g.shape, g.dtype, g.device) if nx else None
        gp = _zeros(ctx.p_shape, ctx.p_dtype, g.device) if np_ else None
        return gx, gp


def _fill(op: str, x: Tensor, sample, generator, p=None, floating=None):
    """Run one fill: the in-place checks, then x's memory gets sample(gen, shape, dtype,
    device, p's array). floating: the phrase of torch's error for a non-float target."""
    if type(x) is not Tensor:
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if floating is not None and not x.dtype.is_floating_point:
        raise floating(f"{op}: ", x.dtype.name, f" (target of shape {tuple(x.shape)}; {op} "
                       "needs a floating-point tensor)")
    _guard(op, x, p)
    check_same_device(op, x, p)
    check_internal_overlap(op, x._shape, x._strides)
    if type(p) is Tensor:
        check_partial_overlap(op, (x._shape, x._strides, x._offset), x._storage, p)
    gen = _generator(generator, x.device)

    def draw(t):
        with backend.on_device(t.device):
            arg = None if p is None else p._array()
            return sample(gen, tuple(t.shape), t.dtype, t.device, arg)

    return RandomFill.apply(x, p, draw=draw)


def _not_implemented(kernel: str):
    def error(prefix, dtype_name, suffix):
        return NotImplementedError(f'{prefix}"{kernel}" not implemented for {dtype_name!r}'
                                   f"{suffix}")

    return error


def _continuous(name: str):
    def error(prefix, dtype_name, suffix):
        return RuntimeError(f"{prefix}{name} distribution is a continuous probability "
                            f"distribution. dtype must be a floating point but you specified "
                            f"{dtype_name}{suffix}")

    return error


@op(RandomFill, method=True)
def uniform_(x: Tensor, from_: float = 0.0, to: float = 1.0, *, generator=None) -> Tensor:
    """Fill x with U[from, to) samples (torch's `from` is `from_` here, a Python keyword)."""
    if from_ > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found "
                           f"from={from_} > to={to}")
    return _fill("uniform_", x, lambda g, s, d, dev, _: g.uniform(s, d, dev, from_, to),
                 generator, floating=_not_implemented("check_uniform_bounds"))


@op(RandomFill, method=True)
def normal_(x: Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> Tensor:
    """Fill x with N(mean, std**2) samples."""
    if std < 0:
        raise RuntimeError(f"normal_: normal expects std >= 0.0, but found std {std}")
    return _fill("normal_", x, lambda g, s, d, dev, _: g.normal(s, d, dev, mean, std),
                 generator, floating=_not_implemented("normal_kernel_cpu"))


@op(RandomFill, method=True)
def log_normal_(x: Tensor, mean: float = 1.0, std: float = 2.0, *, generator=None) -> Tensor:
    """Fill x with exp(N(mean, std**2)) samples."""
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")

    def sample(g, s, d, dev, _):
        z = g.normal(s, backend.float64, dev, mean, std)
        return backend.xp_for(dev).exp(z).astype(d.np)

    return _fill("log_normal_", x, sample, generator,
                 floating=_not_implemented("log_normal_cpu"))


@op(RandomFill, method=True)
def exponential_(x: Tensor, lambd: float = 1.0, *, generator=None) -> Tensor:
    """Fill x with Exp(lambd) samples (mean 1 / lambd)."""
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    return _fill("exponential_", x, lambda g, s, d, dev, _: g.exponential(s, d, dev, lambd),
                 generator, floating=_continuous("Exponential"))


@op(RandomFill, method=True)
def cauchy_(x: Tensor, median: float = 0.0, sigma: float = 1.0, *, generator=None) -> Tensor:
    """Fill x with Cauchy(median, sigma) samples."""
    if not sigma > 0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")
    return _fill("cauchy_", x, lambda g, s, d, dev, _: g.cauchy(s, d, dev, median, sigma),
                 generator, floating=_continuous("Cauchy"))


@op(RandomFill, method=True)
def geometric_(x: Tensor, p: float, *, generator=None) -> Tensor:
    """Fill x with the number of Bernoulli(p) trials up to the first success (1, 2, ...)."""
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    return _fill("geometric_", x, lambda g, s, d, dev, _: g.geometric(s, p, d, dev),
                 generator)


@op(RandomFill, method=True)
def bernoulli_(x: Tensor, p=0.5, *, generator=None) -> Tensor:
    """Fill x with 1 with probability p (a number, or a tensor broadcasting to x), else 0."""
    if type(p) is Tensor:
        if shp.broadcast_shapes(x.shape, p.shape, op="bernoulli_") != tuple(x.shape):
            raise RuntimeError(f"bernoulli_: p of shape {tuple(p.shape)} does not broadcast "
                               f"to the target's shape {tuple(x.shape)}")
        _check_probabilities("bernoulli_", p)
        return _fill("bernoulli_", x, lambda g, s, d, dev, pa: g.bernoulli(pa, s, d, dev),
                     generator, p=p)
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    return _fill("bernoulli_", x, lambda g, s, d, dev, _: g.bernoulli(p, s, d, dev), generator)


@op(RandomFill, method=True)
def random_(x: Tensor, *bounds, from_=None, to=None, generator=None) -> Tensor:
    """Fill x with integers: random_(to) in [0, to), random_(from, to) in [from, to),
    random_() over the dtype's range ([0, 2**mantissa digits] for floats), as torch."""
    if len(bounds) > 2:
        raise TypeError(f"random_() takes at most 2 positional bounds, got {len(bounds)}")
    if len(bounds) == 1:
        to = bounds[0]
    elif len(bounds) == 2:
        from_, to = bounds
    low = 0 if from_ is None else int(from_)
    high = backend.random.value_range(x.dtype)[1] + 1 if to is None else int(to)
    backend.random.check_range("random_", low, high, x.dtype)
    return _fill("random_", x, lambda g, s, d, dev, _: g.integers(low, high, s, d, dev),
                 generator)


# ----------------------------------------------------------------------------- samplers
def _check_probabilities(op: str, p: Tensor) -> None:
    P = p._array()
    if P.size and not bool(((P >= 0) & (P <= 1)).all()):
        raise RuntimeError(f"{op}: Expected p_in >= 0 && p_in <= 1 to be true, but got false "
                           f"(probabilities of shape {tuple(p.shape)})")


def _floating_input(op: str, kernel: str, t: Tensor) -> None:
    if type(t) is not Tensor:
        raise TypeError(f"{op}(): argument 'input' must be Tensor, not {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise NotImplementedError(f'{op}: "{kernel}" not implemented for {t.dtype.name!r} '
                                  f"(input of shape {tuple(t.shape)})")


class Sample(Function):
    """out = a sample whose distribution the inputs give (bernoulli, normal, poisson);
    every input's gradient is zero, as torch's. Saves nothing (only the inputs' shapes)."""

    @staticmethod
    def forward(ctx, *inputs, draw):
        ctx.inputs = [(t.shape, t.dtype) if type(t) is Tensor else None for t in inputs]
        return from_array(draw(*(t._array() if type(t) is Tensor else t for t in inputs)))

    @staticmethod
    def backward(ctx, g):
        return tuple(_zeros(*meta, g.device) if need else None
                     for meta, need in zip(ctx.inputs, ctx.needs_input_grad))


@op(Sample, method=True, ta=True)
def bernoulli(input: Tensor, p=None, *, generator=None) -> Tensor:  # noqa: A002 - torch's
    """1 with probability input (or p, a number, for every element of input's shape), else
    0, in input's dtype."""
    _floating_input("bernoulli", "bernoulli_tensor_cpu_p_", input)
    gen = _generator(generator, input.device)
    shape, dtype, device = tuple(input.shape), input.dtype, input.device
    if p is not None:
        if not 0 <= p <= 1:
            raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
        with backend.on_device(device):
            return Sample.apply(input, draw=lambda _: gen.bernoulli(p, shape, dtype, device))
    _check_probabilities("bernoulli", input)
    with backend.on_device(device):
        return Sample.apply(input, draw=lambda P: gen.bernoulli(P, shape, dtype, device))


@op(Sample, ta=True)
def poisson(input: Tensor, generator=None) -> Tensor:  # noqa: A002 - torch's name
    """One Poisson(rate) draw per element of input (the rates), in input's dtype."""
    _floating_input("poisson", "poisson_cpu", input)
    P = input._array()
    if P.size and not bool((P >= 0).all()):
        raise RuntimeError(f"poisson: invalid Poisson rate, expected rate to be non-negative "
                           f"(rates of shape {tuple(input.shape)})")
    gen = _generator(generator, input.device)
    with backend.on_device(input.device):
        return Sample.apply(input, draw=lambda R: gen.poisson(R, input.device))


@op(Sample, ta=True)
def normal(mean, std=1.0, size=None, *, generator=None, out=None, dtype=None, layout=None,
           device=None, pin_memory=False, requires_grad=False) -> Tensor:
    """N(mean, std**2) samples, torch's four forms: normal(Tensor, Tensor),
    normal(Tensor, float), normal(float, Tensor) (the shape their broadcast's), and
    normal(float, float, size)."""
    if out is not None:
        raise TypeError("normal(): out= is not supported; assign the result instead")
    tensors = [t for t in (mean, std) if type(t) is Tensor]
    if not tensors:
        if size is None:
            raise TypeError(f"normal() received an invalid combination of arguments: two "
                            f"numbers ({mean}, {std}) need a size, normal(mean, std, size)")
        return _normal_of_size(float(mean), float(std), size, generator=generator,
                              dtype=dtype, device=device, requires_grad=requires_grad)
    if size is not None:
        raise TypeError("normal(): size= is only taken with a number mean and std; with a "
                        "tensor the shape is the tensor's")
    for t in tensors:
        _floating_input("normal", "normal_kernel_cpu", t)
    device = check_same_device("normal", *tensors)
    out_dtype = backend.promote(*tensors) if len(tensors) == 2 else tensors[0].dtype
    shape = shp.broadcast_shapes(*(tuple(t.shape) for t in tensors), op="normal")
    if type(std) is Tensor:
        S = std._array()
        if S.size and not bool((S >= 0).all()):
            raise RuntimeError("normal: normal expects all elements of std >= 0.0")
    elif std < 0:
        raise RuntimeError(f"normal: normal expects std >= 0.0, but found std {std}")
    gen = _generator(generator, device)
    with backend.on_device(device):
        return Sample.apply(mean, std, draw=lambda m, s: gen.normal(shape, out_dtype, device,
                                                                    m, s))


@op(method=True, ta=True)
def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,  # noqa: A002
                generator=None) -> Tensor:
    """num_samples category indices (int64) per row of the 1-D or 2-D `input`, with
    probability proportional to its non-negative weights (they need not sum to one)."""
    if type(input) is not Tensor:
        raise TypeError(f"multinomial(): argument 'input' must be Tensor, not "
                        f"{type(input).__name__}")
    if input.ndim not in (1, 2):
        raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape "
                           f"{tuple(input.shape)}")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{input.dtype.name}")
    n = int(num_samples)
    if n <= 0:
        raise RuntimeError(f"multinomial: cannot sample n_sample <= 0 samples (got {n})")
    categories = input.shape[-1]
    if not replacement and n > categories:
        raise RuntimeError(f"multinomial: cannot sample n_sample > prob_dist.size(-1) samples "
                           f"without replacement ({n} > {categories}, input shape "
                           f"{tuple(input.shape)})")
    xp = backend.xp_for(input.device)
    W = input._array().reshape(-1, categories) if input.ndim == 2 else input._array()[None]
    rows = W.shape[0]
    if W.size:
        if not bool((xp.isfinite(W) & (W >= 0)).all()):
            raise RuntimeError("multinomial: probability tensor contains either `inf`, `nan` "
                               f"or element < 0 (input shape {tuple(input.shape)})")
        if not bool((W.sum(axis=1, dtype=xp.float64) > 0).all()):
            raise RuntimeError("multinomial: invalid multinomial distribution (sum of "
                               f"probabilities <= 0) in a row of input {tuple(input.shape)}")
    elif categories == 0 and rows:
        raise RuntimeError("multinomial: invalid multinomial distribution (sum of "
                           "probabilities <= 0): there are no categories")
    gen = _generator(generator, input.device)
    with backend.on_device(input.device):
        if rows == 0:
            idx = xp.zeros((0, n), dtype=backend.int64.np)
        else:
            idx = gen.multinomial(W, n, bool(replacement), input.device)
    out = idx if input.ndim == 2 else idx[0]
    return from_array(xp.ascontiguousarray(out))

