"""torch.nn.modules.instancenorm: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LazyInstanceNorm1d",
    "LazyInstanceNorm2d", "LazyInstanceNorm3d",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
