"""torch.nn.modules.conv: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "LazyConv1d", "LazyConv2d", "LazyConv3d", "LazyConvTranspose1d", "LazyConvTranspose2d",
    "LazyConvTranspose3d",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
