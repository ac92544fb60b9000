"""torch.nn.modules.container: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "Container", "ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Sequential",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
