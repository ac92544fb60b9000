"""torch.nn.modules.batchnorm: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d",
    "LazyBatchNorm3d", "SyncBatchNorm",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
