"""torch.nn.modules.flatten: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "Flatten", "Unflatten",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
