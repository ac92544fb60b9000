"""torch.nn.modules.normalization: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "CrossMapLRN2d", "GroupNorm", "LayerNorm", "LocalResponseNorm", "RMSNorm",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
