"""NumPy's dispatch protocols, for an object that stands in for an array in a backward.

An op's backward is written once, against the NumPy API (`xp.exp(G) * Y`, `xp.where(...)`,
`G.sum(axis=0)`). A first-order backward runs it on arrays. A backward under
create_graph=True runs the same text on `ArrayProtocol` objects: NumPy hands every ufunc
(`__array_ufunc__`) and array function (`__array_function__`) called on one of them to its
two hooks, `_ufunc` and `_function`, which the subclass (autograd's recorded arrays) answers
with recorded tensor ops. Python's operators go through the same ufuncs
(NDArrayOperatorsMixin), so `G * Y` and `np.multiply(G, Y)` take one path.

Converting one to a plain array (`np.asarray`, a write into an ndarray, a compiled kernel)
would drop the graph without a word, so it raises instead: `__array__` refuses.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin


class ArrayProtocol(NDArrayOperatorsMixin):
    """Routes NumPy's calls on this object to `_ufunc(name, ufunc, method, inputs, kwargs)`
    and `_function(name, func, args, kwargs)`; subclasses define both and `_refuse`."""

    __slots__ = ()
    __array_priority__ = 1000  # an ndarray on the left defers its operators to this object

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self._ufunc(ufunc.__name__, ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return self._function(func.__name__, func, args, kwargs)

    def __array__(self, dtype=None, copy=None):
        raise self._refuse("conversion to a NumPy array (np.asarray, or a write into one)")


def is_ufunc(x) -> bool:
    return isinstance(x, np.ufunc)


def np_dtype(x):
    """NumPy's dtype object for `x` (a dtype, a type such as np.float32, or a name)."""
    return np.dtype(x)


def result_type(*types):
    """NumPy's result dtype for operands given as dtypes (arrays) or Python numbers."""
    return np.result_type(*[np.empty((), t) if isinstance(t, np.dtype) else t for t in types])


def pad_width(width, ndim: int):
    """np.pad's pad_width as one (before, after) pair per dim."""
    return [tuple(int(v) for v in p) for p in np.broadcast_to(np.asarray(width), (ndim, 2))]
