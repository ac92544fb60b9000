"""torch.nn.modules.upsampling: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
