"""torch.nn.modules.fold: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "Fold", "Unfold",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
