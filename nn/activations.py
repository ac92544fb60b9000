"""Activation modules (torch.nn's names and arguments), each a thin Module over one
functional op. `inplace` is accepted for signature compatibility and computes out of place.
"""

from __future__ import annotations

from . import functional as F
from .module import Module


class _Activation(Module):
    """A module with fixed keyword arguments for its functional op."""

    fn = None
    args: tuple = ()

    def __init__(self, **kwargs) -> None:
        super().__init__()
        for name, value in kwargs.items():
            setattr(self, name, value)

    def forward(self, x):
        return type(self).fn(x, **{name: getattr(self, name) for name in self.args})

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self.args)


class LeakyReLU(_Activation):
    fn, args = F.leaky_relu, ("negative_slope",)

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__(negative_slope=negative_slope)


class ELU(_Activation):
    fn, args = F.elu, ("alpha",)

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__(alpha=alpha)


class SELU(_Activation):
    fn = F.selu

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()


class CELU(_Activation):
    fn, args = F.celu, ("alpha",)

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__(alpha=alpha)


class Softplus(_Activation):
    fn, args = F.softplus, ("beta", "threshold")

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__(beta=beta, threshold=threshold)


class Softsign(_Activation):
    fn = F.softsign


class Mish(_Activation):
    fn = F.mish

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()


class Hardswish(_Activation):
    fn = F.hardswish

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()


class Hardsigmoid(_Activation):
    fn = F.hardsigmoid

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()


class Hardtanh(_Activation):
    fn, args = F.hardtanh, ("min_val", "max_val")

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val ({min_val}) cannot be greater than max_val "
                             f"({max_val})")
        super().__init__(min_val=min_val, max_val=max_val)


class ReLU6(_Activation):
    fn = F.relu6

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()


class LogSigmoid(_Activation):
    fn = F.logsigmoid


class Sigmoid(_Activation):
    fn = F.sigmoid


class Tanh(_Activation):
    fn = F.tanh


class SiLU(_Activation):
    fn = F.silu

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()


class Softmax(_Activation):
    fn, args = F.softmax, ("dim",)

    def __init__(self, dim: int | None = None) -> None:
        super().__init__(dim=-1 if dim is None else dim)


class LogSoftmax(_Activation):
    fn, args = F.log_softmax, ("dim",)

    def __init__(self, dim: int | None = None) -> None:
        super().__init__(dim=-1 if dim is None else dim)


class Softmin(_Activation):
    fn, args = F.softmin, ("dim",)

    def __init__(self, dim: int | None = None) -> None:
        super().__init__(dim=-1 if dim is None else dim)


class GLU(_Activation):
    fn, args = F.glu, ("dim",)

    def __init__(self, dim: int = -1) -> None:
        super().__init__(dim=dim)
