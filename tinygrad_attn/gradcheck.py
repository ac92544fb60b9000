"""gradcheck: compare autograd's gradients with central finite differences (float64)."""

from __future__ import annotations

import itertools

from . import backend
from .autograd import enable_grad, grad, no_grad
from .tensor import Tensor, from_array


class GradcheckError(AssertionError):
    """Analytical and numerical Jacobians disagree; the message lists the elements."""


def _outputs(out) -> list:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, Tensor) and o.dtype.is_floating_point]


def gradcheck(fn, inputs, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              max_report: int = 10, *, raise_exception: bool = True, nondet_tol: float = 0.0,
              check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
              check_batched_grad: bool = False, check_batched_forward_grad: bool = False,
              check_forward_ad: bool = False, check_backward_ad: bool = True,
              fast_mode: bool = False, masked=None) -> bool:
    """Check d fn(*inputs) / d inputs against finite differences; raise on a mismatch.

    `inputs` is a tensor or a sequence; tensors that require grad are checked and must be
    float64. Every output element's row of the Jacobian is computed with autograd.grad
    and every input element's column with (f(x + eps) - f(x - eps)) / 2 eps. Returns True,
    or raises GradcheckError with a per-element report of the mismatches (returns False
    instead with raise_exception=False). torch's other keyword arguments are accepted;
    those about forward-mode AD and batched gradients must keep their defaults.
    """
    if check_forward_ad or check_batched_grad or check_batched_forward_grad:
        raise NotImplementedError("gradcheck: the engine has no forward-mode AD or vmap; "
                                  "check_forward_ad and check_batched_* must be False")
    if not check_backward_ad:
        return True
    if not raise_exception:
        try:
            return gradcheck(fn, inputs, eps, atol, rtol, max_report)
        except GradcheckError:
            return False
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    checked = _checked_inputs(inputs)
    outs = _outputs(fn(*inputs))
    if not outs:
        raise ValueError("gradcheck: fn returned no floating point tensor")
    xp = backend.xp_for(outs[0].device)
    analytical = _analytical(xp, outs, inputs, checked)
    numerical = _numerical(xp, fn, inputs, checked, analytical, len(outs), eps)
    lines = _mismatches(xp, analytical, numerical, outs, inputs, atol, rtol, max_report)
    if lines:
        report = "\n".join(lines)
        raise GradcheckError(f"gradcheck failed (atol={atol:g}, rtol={rtol:g}):\n{report}")
    return True


def _checked_inputs(inputs) -> list:
    """The positions of the inputs that require grad; each must be float64."""
    checked = [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input requires grad")
    for i in checked:
        if inputs[i].dtype.name != "float64":
            raise ValueError(
                f"gradcheck: input {i} has dtype {inputs[i].dtype.name}; finite differences "
                "need float64 inputs"
            )
    return checked


def _analytical(xp, outs, inputs, checked) -> dict:
    """(out k, in i) -> Jacobian (out numel, in numel): one vector-Jacobian product per
    output element."""
    analytical = {}
    for k, o in enumerate(outs):
        for i in checked:
            analytical[k, i] = xp.zeros((o.numel(), inputs[i].numel()))
        if not o.requires_grad:
            continue
        for j in range(o.numel()):
            seed = xp.zeros(o.numel(), dtype=o.dtype.np)
            seed[j] = 1
            grads = grad([o], [inputs[i] for i in checked],
                         [from_array(seed.reshape(o.shape))], retain_graph=True,
                         allow_unused=True)
            for i, g in zip(checked, grads):
                if g is not None:
                    analytical[k, i][j] = g._array().reshape(-1)
    return analytical


def _numerical(xp, fn, inputs, checked, analytical, n_outs, eps) -> dict:
    """The same Jacobians by central differences, one input element at a time."""
    numerical = {key: xp.zeros_like(v) for key, v in analytical.items()}
    with no_grad():
        for i in checked:
            arr = inputs[i]._array()
            for n, idx in enumerate(itertools.product(*(range(s) for s in arr.shape))):
                orig = arr[idx].copy()
                arr[idx] = orig + eps
                plus = [o._array().reshape(-1).copy() for o in _outputs(fn(*inputs))]
                arr[idx] = orig - eps
                minus = [o._array().reshape(-1).copy() for o in _outputs(fn(*inputs))]
                arr[idx] = orig
                for k in range(n_outs):
                    numerical[k, i][:, n] = (plus[k] - minus[k]) / (2 * eps)
    return numerical


def _mismatches(xp, analytical, numerical, outs, inputs, atol, rtol, max_report) -> list:
    """The report's lines: per (output, input) pair, how many entries differ and the first
    `max_report` of them."""
    lines = []
    for (k, i), a in analytical.items():
        num = numerical[k, i]
        bad = xp.abs(a - num) > atol + rtol * xp.abs(num)
        if bad.any():
            where = backend.to_host(xp.argwhere(bad))
            lines.append(
                f"output {k} (shape {tuple(outs[k].shape)}) w.r.t. input {i} (shape "
                f"{tuple(inputs[i].shape)}): {len(where)} of {bad.size} Jacobian entries differ"
            )
            for r, c in where[:max_report]:
                lines.append(
                    f"  d out[{r}] / d in[{c}]: analytical {float(a[r, c]):+.8g}, "
                    f"numerical {float(num[r, c]):+.8g}"
                )
    return lines


def gradgradcheck(func, inputs, grad_outputs=None, *, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, gen_non_contig_grad_outputs: bool = False,
                  raise_exception: bool = True, nondet_tol: float = 0.0,
                  check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
                  check_batched_grad: bool = False, check_fwd_over_rev: bool = False,
                  check_rev_over_rev: bool = True, fast_mode: bool = False, masked=None,
                  max_report: int = 10) -> bool:
    """Check second derivatives: the gradient of func's vector-Jacobian product (recorded
    with create_graph=True) against finite differences of that product, with torch's
    signature. `grad_outputs` (float64, one per output) default to random tensors that
    require grad (non-contiguous with gen_non_contig_grad_outputs), so that the check covers
    the derivative with respect to them too.

    Also checks that the recorded first gradient equals the plain (create_graph=False) one
    to 1e-10: the recorded path must compute the same values as the array path (which may
    run a compiled kernel). Arguments of torch's that concern what the engine does not have
    (forward mode, batched gradients) are accepted and must keep their defaults.
    """
    if check_fwd_over_rev or check_batched_grad:
        raise NotImplementedError("gradgradcheck: the engine has no forward-mode AD or vmap; "
                                  "check_fwd_over_rev and check_batched_grad must be False")
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    checked = _checked_inputs(inputs)
    outs = _outputs(func(*inputs))
    if grad_outputs is None:
        grad_outputs = tuple(_random_like(o, gen_non_contig_grad_outputs) for o in outs)
    else:
        grad_outputs = (grad_outputs,) if isinstance(grad_outputs, Tensor) \
            else tuple(grad_outputs)
    n = len(inputs)

    def first_gradient(*args, create_graph=True):
        with enable_grad():  # also when gradcheck evaluates it for finite differences
            pairs = [(o, g) for o, g in zip(_outputs(func(*args[:n])), args[n:])
                     if o.requires_grad]
            if not pairs:
                return ()
            grads = grad([o for o, _ in pairs], [args[i] for i in checked],
                         [g for _, g in pairs], create_graph=create_graph, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    try:
        _same_first_gradient(first_gradient, inputs + grad_outputs)
        if check_rev_over_rev:
            gradcheck(first_gradient, inputs + grad_outputs, eps=eps, atol=atol, rtol=rtol,
                      max_report=max_report)
    except GradcheckError:
        if raise_exception:
            raise
        return False
    return True


def _random_like(o: Tensor, non_contiguous: bool) -> Tensor:
    """A float64 tensor of o's shape, normal(0, 1), requiring grad (a leaf)."""
    from .creation import randn  # noqa: PLC0415 - creation sits beside gradcheck's layer

    if non_contiguous:
        t = randn(*o.shape, 2, dtype=o.dtype, device=o.device)[..., 0]
    else:
        t = randn(*o.shape, dtype=o.dtype, device=o.device)
    t = t.detach()
    t.requires_grad = True
    return t


def _same_first_gradient(first_gradient, args) -> None:
    """The recorded gradient's values against the plain one's."""
    recorded = first_gradient(*args, create_graph=True)
    plain = first_gradient(*args, create_graph=False)
    if len(recorded) != len(plain):
        raise GradcheckError(f"gradgradcheck: create_graph=True gave {len(recorded)} "
                             f"gradients, create_graph=False {len(plain)}")
    for k, (r, p) in enumerate(zip(recorded, plain)):
        a, b = r.detach()._array(), p._array()
        xp = backend.xp_for(r.device)
        if a.shape != b.shape or r.dtype is not p.dtype or \
                bool(xp.any(xp.abs(a - b) > 1e-10 * (1 + xp.abs(b)))):
            raise GradcheckError(
                f"gradgradcheck: gradient {k} recorded with create_graph=True (shape "
                f"{a.shape}, {r.dtype.name}) differs from the plain one (shape {b.shape}, "
                f"{p.dtype.name}): the recorded backward must compute the same values")
