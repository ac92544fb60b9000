"""torch.nn.modules.linear: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "Bilinear", "Identity", "LazyLinear", "Linear",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
