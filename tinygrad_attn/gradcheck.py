"""gradcheck: compare autograd's gradients with central finite differences (float64)."""

from __future__ import annotations

import itertools

from . import backend
from .autograd import grad, no_grad
from .tensor import Tensor, from_array


class GradcheckError(AssertionError):
    """Analytical and numerical Jacobians disagree; the message lists the elements."""


def _outputs(out) -> list:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o for o in outs if isinstance(o, Tensor) and o.dtype.is_floating_point]


def gradcheck(fn, inputs, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              max_report: int = 10) -> bool:
    """Check d fn(*inputs) / d inputs against finite differences; raise on a mismatch.

    `inputs` is a tensor or a sequence; tensors that require grad are checked and must be
    float64. Every output element's row of the Jacobian is computed with autograd.grad
    and every input element's column with (f(x + eps) - f(x - eps)) / 2 eps. Returns True,
    or raises GradcheckError with a per-element report of the mismatches.
    """
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
