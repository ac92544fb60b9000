"""torch.nn.modules.transformer: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "Transformer", "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
    "TransformerEncoderLayer",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
