"""einsum, mapped onto views and one batched matmul per pair of operands; and torch's
products of given ranks, each a matmul with its operands checked: mm, bmm, dot, mv, outer,
addmm, baddbmm."""

from __future__ import annotations

from .. import backend
from ..errors import ShapeError
from ._util import Tensor, from_array
from .elementwise import Add, Mul, add, mul
from .indexing import Where, where
from .movement import (
    Expand,
    Permute,
    ReshapeCopy,
    Unsqueeze,
    View,
    expand,
    permute,
    reshape,
    unsqueeze,
)
from .reduce import Matmul, Sum, matmul
from .reduce import sum as sum_dims
from .registry import op
from .shaping import Diagonal, diagonal


def _parse(equation: str, operands) -> tuple[list[str], str]:
    """Input subscripts (ellipsis spelled out as fresh capital letters) and the output."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ShapeError(f"einsum: equation {equation!r} names {len(terms)} operands, got "
                         f"{len(operands)}")
    for i, term in enumerate(terms + ([rhs] if arrow else [])):
        _check_dots(equation, term, f"operand {i}" if i < len(terms) else "the output")
    n_ell = 0
    for term, t in zip(terms, operands):
        if "..." in term:
            n_ell = max(n_ell, t.ndim - (len(term) - 3))
    ell = "".join(chr(ord("Z") - i) for i in range(n_ell))[::-1]
    used = set(eq)
    if set(ell) & used:
        raise ValueError(f"einsum: equation {equation!r} uses capital letters near 'Z' and "
                         "an ellipsis; rename them")
    subs = []
    for term, t in zip(terms, operands):
        if "..." in term:
            k = t.ndim - (len(term) - 3)
            term = term.replace("...", ell[n_ell - k:] if k else "")
        if len(term) != t.ndim or (term and not term.isalpha()):  # '' is a 0-d operand's
            raise ShapeError(f"einsum: subscripts {term!r} do not match an operand of shape "
                             f"{tuple(t.shape)}")
        subs.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: "".join(subs).count(c) for c in set("".join(subs))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    if len(set(out)) != len(out) or not set(out) <= set("".join(subs)):
        raise ShapeError(f"einsum: output subscripts {out!r} must be distinct input letters")
    return subs, out


def _check_dots(equation: str, term: str, what: str) -> None:
    """torch's reading of '.': only as one '...' per operand (and one in the output)."""
    dots = term.count(".")
    if dots and (dots != 3 or "..." not in term):
        problem = ("an ellipsis was already found" if term.count("...") > 1
                   else "it is not part of an ellipsis ('...')")
        raise RuntimeError(f"einsum: equation {equation!r}: found '.' in {what} "
                           f"({term!r}) but {problem}")


def _single(t: Tensor, sub: str, keep: str) -> tuple[Tensor, str]:
    """t with repeated letters reduced to their diagonal (a view) and the letters not in
    `keep` summed out."""
    while len(set(sub)) != len(sub):
        c = next(c for c in sub if sub.count(c) > 1)
        i = sub.index(c)
        j = sub.index(c, i + 1)
        t = diagonal(t, 0, i, j)
        sub = "".join(s for k, s in enumerate(sub) if k not in (i, j)) + c
    drop = tuple(k for k, c in enumerate(sub) if c not in keep)
    if drop:
        t = sum_dims(t, drop)
        sub = "".join(c for c in sub if c in keep)
    return t, sub


def _sizes(operands, subs) -> dict:
    """Each letter's size; a size of 1 broadcasts against the other operands'."""
    sizes = {}
    for t, sub in zip(operands, subs):
        for c, n in zip(sub, t.shape):
            prev = sizes.get(c)
            if prev is None or prev == 1:
                sizes[c] = n
            elif n not in (1, prev):
                raise ShapeError(f"einsum: letter {c!r} has sizes {prev} and {n} (shapes "
                                 f"{[tuple(o.shape) for o in operands]})")
    return sizes


def _pair(a: Tensor, sa: str, b: Tensor, sb: str, keep: str, sizes: dict):
    """Contract two operands with one batched matmul; returns (result, its letters)."""
    a, sa = _single(a, sa, keep + sb)
    b, sb = _single(b, sb, keep + sa)
    batch = [c for c in sa if c in sb and c in keep]
    contract = [c for c in sa if c in sb and c not in keep]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]

    def arrange(t, sub, order, groups):
        t = permute(t, tuple(sub.index(c) for c in order)) if sub != "".join(order) else t
        full = tuple(sizes[c] for c in order)
        if tuple(t.shape) != full:  # a size-1 letter broadcast against the other operand
            t = expand(t, full)
        shape, k = [], 0
        for n in groups:
            size = 1
            for c in order[k:k + n]:
                size *= sizes[c]
            shape.append(size)
            k += n
        return reshape(t, tuple(shape))

    A = arrange(a, sa, batch + left + contract, (len(batch), len(left), len(contract)))
    B = arrange(b, sb, batch + contract + right, (len(batch), len(contract), len(right)))
    out = matmul(A, B)  # (batch, left, right)
    letters = batch + left + right
    return reshape(out, tuple(sizes[c] for c in letters)), "".join(letters)


@op(Permute, View, ReshapeCopy, Expand, Diagonal, Sum, Matmul, ta=True)
def einsum(equation: str, *operands) -> Tensor:
    """torch.einsum. Each pair of operands becomes one batched matmul: both are permuted
    (a view) to (batch, free, contracted) and reshaped to 3-D, repeated letters become a
    diagonal view and letters used by one operand only are summed first.

    Copies: the reshape to 3-D is a view when the permuted operand's strides allow it and
    otherwise a recorded 'reshape-copy' (the same path as Tensor.reshape); a letter of
    size 1 broadcast against the other operand is expanded (a view) and then copied by
    that reshape. The matmul output is new; the final permute is a view.
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ValueError("einsum: expected at least one operand")
    for t in operands:
        if getattr(t, "dtype", None) is backend.bool_:  # torch's bmm has no bool kernel
            raise RuntimeError(f"einsum: not implemented for bool (operand of shape "
                               f"{tuple(t.shape)})")
    subs, out = _parse(equation, operands)
    sizes = _sizes(operands, subs)
    t, sub = operands[0], subs[0]
    for k in range(1, len(operands)):
        later = "".join(subs[k + 1:])
        t, sub = _pair(t, sub, operands[k], subs[k], out + later, sizes)
    t, sub = _single(t, sub, out)
    if sub != out or any(t is o for o in operands):  # never an operand itself: a view, as torch
        t = permute(t, tuple(sub.index(c) for c in out))
    return t


def _matrices(name: str, a, b, ndim: int) -> None:
    """torch's mm and bmm take exactly ndim-d operands with matching inner (and batch) sizes."""
    kind = "a matrix" if ndim == 2 else "a 3D tensor"
    for which, t in (("self", a), ("mat2", b)):
        if type(t) is not Tensor:
            raise TypeError(f"{name}(): argument '{which}' must be Tensor, not "
                            f"{type(t).__name__}")
        if t.ndim != ndim:
            raise RuntimeError(f"{name}: {which} must be {kind}, got shape {tuple(t.shape)}")
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                           "multiplied")


@op(Matmul, method=True, ta=True)
def mm(input, mat2):  # noqa: A002 - torch's argument names
    """input @ mat2 for two matrices (matmul without broadcasting)."""
    _matrices("mm", input, mat2, 2)
    return matmul(input, mat2)


@op(Matmul, method=True, ta=True)
def bmm(input, mat2):  # noqa: A002
    """A batch of matrix products: (b, n, m) @ (b, m, p) -> (b, n, p), no broadcasting."""
    _matrices("bmm", input, mat2, 3)
    return matmul(input, mat2)


def _check_ranks(name: str, pairs) -> None:
    for which, t, ndim in pairs:
        if type(t) is not Tensor:
            raise TypeError(f"{name}(): argument '{which}' must be Tensor, not "
                            f"{type(t).__name__}")
        if t.ndim != ndim:
            raise RuntimeError(f"{name}: {which} must be {ndim}-D, got shape {tuple(t.shape)}")


@op(Matmul, method=True, ta=True)
def dot(input, tensor):  # noqa: A002 - torch's argument names
    """The inner product of two 1-d tensors of one size: a 0-d tensor."""
    _check_ranks("dot", (("input", input, 1), ("tensor", tensor, 1)))
    if input.shape != tensor.shape:
        raise RuntimeError(f"dot: inconsistent tensor size, expected tensor {tuple(input.shape)}"
                           f" and src {tuple(tensor.shape)} to have the same number of elements")
    return matmul(input, tensor)


@op(Matmul, method=True, ta=True)
def mv(input, vec):  # noqa: A002
    """A matrix times a vector: (n, m) @ (m,) -> (n,)."""
    _check_ranks("mv", (("input", input, 2), ("vec", vec, 1)))
    if input.shape[1] != vec.shape[0]:
        raise RuntimeError(f"mv: size mismatch, got input {tuple(input.shape)} and vec "
                           f"{tuple(vec.shape)}")
    return matmul(input, vec)


@op(Unsqueeze, Mul, method=True, ta=True)
def outer(input, vec2):  # noqa: A002
    """The outer product of two 1-d tensors: (n,) x (m,) -> (n, m), a broadcast product."""
    _check_ranks("outer", (("input", input, 1), ("vec2", vec2, 1)))
    return mul(unsqueeze(input, 1), vec2)


def _beta_alpha(input, product, beta, alpha):  # noqa: A002
    """beta * input + alpha * product, as torch's addmm and baddbmm (beta=0 ignores input,
    nan and inf included)."""
    if alpha != 1:
        product = mul(product, alpha)
    if beta == 0:  # input's values are not read (a nan stays out); its gradient is zero
        xp = backend.xp_for(product.device)
        return where(from_array(xp.ones(product.shape, dtype=bool)), product, input)
    return add(product, input if beta == 1 else mul(input, beta))


@op(Matmul, Add, Mul, Where, method=True, ta=True)
def addmm(input, mat1, mat2, *, beta=1, alpha=1):  # noqa: A002
    """beta * input + alpha * (mat1 @ mat2): input broadcasts to the product's shape."""
    _matrices("addmm", mat1, mat2, 2)
    return _beta_alpha(input, matmul(mat1, mat2), beta, alpha)


@op(Matmul, Add, Mul, Where, method=True, ta=True)
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):  # noqa: A002
    """beta * input + alpha * bmm(batch1, batch2)."""
    _matrices("baddbmm", batch1, batch2, 3)
    return _beta_alpha(input, matmul(batch1, batch2), beta, alpha)
