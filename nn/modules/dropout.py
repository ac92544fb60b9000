"""torch.nn.modules.dropout: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "AlphaDropout", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "FeatureAlphaDropout",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
