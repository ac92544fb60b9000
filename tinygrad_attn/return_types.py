"""The named tuples ops return, as torch.return_types: `x.max(dim=1).values`, `.indices`.

Each is a tuple (it unpacks, indexes and compares as one: `values, indices = x.max(1)`)
whose type has torch's name and field names. An op returns one only where torch does:
max and min over a dim, sort, topk, kthvalue, median and nanmedian over a dim, mode,
cummax, cummin and aminmax; var_mean, std_mean, split and chunk return plain tuples, as
torch's. Pure Python: the op layer builds them, nothing here knows a Tensor.
"""

from __future__ import annotations

from collections import namedtuple


def _structseq(name: str, fields: tuple[str, ...]) -> type:
    """A namedtuple printed as torch prints its return types, one field a line."""
    base = namedtuple(name, fields, module=__name__)

    def __repr__(self) -> str:
        body = ",\n".join(f"{f}={v!r}" for f, v in zip(fields, self))
        return f"{__name__}.{name}(\n{body})"

    return type(name, (base,), {"__slots__": (), "__repr__": __repr__,
                                "__module__": __name__, "__qualname__": name})


_VALUES_INDICES = ("values", "indices")

max = _structseq("max", _VALUES_INDICES)  # noqa: A001 - torch.return_types.max
min = _structseq("min", _VALUES_INDICES)  # noqa: A001
sort = _structseq("sort", _VALUES_INDICES)
topk = _structseq("topk", _VALUES_INDICES)
kthvalue = _structseq("kthvalue", _VALUES_INDICES)
median = _structseq("median", _VALUES_INDICES)
nanmedian = _structseq("nanmedian", _VALUES_INDICES)
mode = _structseq("mode", _VALUES_INDICES)
cummax = _structseq("cummax", _VALUES_INDICES)
cummin = _structseq("cummin", _VALUES_INDICES)
aminmax = _structseq("aminmax", ("min", "max"))

__all__ = ["aminmax", "cummax", "cummin", "kthvalue", "max", "median", "min", "mode",
           "nanmedian", "sort", "topk"]
