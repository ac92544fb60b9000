"""torch.nn.modules.rnn: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNBase", "RNNCell", "RNNCellBase",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
