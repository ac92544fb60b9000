"""torch.nn.modules.padding: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d",
    "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d",
    "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "ZeroPad1d", "ZeroPad2d",
    "ZeroPad3d",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
