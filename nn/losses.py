"""Loss modules (torch.nn's names and arguments), each a thin Module over one functional
loss; `reduction` is 'none', 'mean' or 'sum' (and 'batchmean' for KLDivLoss)."""

from __future__ import annotations

from . import functional as F
from .module import Module


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class MSELoss(_Loss):
    def forward(self, input, target):  # noqa: A002
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    def forward(self, input, target):  # noqa: A002
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input, target):  # noqa: A002
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        self.delta = delta

    def forward(self, input, target):  # noqa: A002
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class KLDivLoss(_Loss):
    def __init__(self, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(reduction)
        self.log_target = log_target

    def forward(self, input, target):  # noqa: A002
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class BCELoss(_Loss):
    def __init__(self, weight=None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.weight = weight  # a plain tensor, not a parameter (as torch's buffer)

    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None) -> None:
        super().__init__(reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy_with_logits(
            input, target, self.weight, reduction=self.reduction, pos_weight=self.pos_weight)


class NLLLoss(_Loss):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, ignore_index

    def forward(self, input, target):  # noqa: A002
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class CrossEntropyLoss(_Loss):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):  # noqa: A002
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction,
                               self.label_smoothing)
