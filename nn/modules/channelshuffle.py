"""torch.nn.modules.channelshuffle: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "ChannelShuffle",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
