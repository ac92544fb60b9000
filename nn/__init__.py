"""nn: modules, layers and a GPT, built on tinygrad_attn's public API only.

Written as a user's own model code would be: `import tinygrad_attn as ta` and nothing
private, so whatever the engine makes efficient here, it makes efficient for users too.
"""

from . import functional
from .activations import (
    CELU,
    ELU,
    GLU,
    SELU,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    Mish,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softmin,
    Softplus,
    Softsign,
    Tanh,
)
from .conv import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AvgPool1d,
    AvgPool2d,
    Conv1d,
    Conv2d,
    ConvTranspose1d,
    ConvTranspose2d,
    MaxPool1d,
    MaxPool2d,
)
from .gpt import GPT, MLP, Block, CausalSelfAttention, GPTConfig
from .layers import GELU, Dropout, Embedding, LayerNorm, Linear, ReLU
from .losses import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from .module import Module, ModuleDict, ModuleList, Parameter, Sequential
from .norm import (
    BatchNorm1d,
    BatchNorm2d,
    Flatten,
    GroupNorm,
    Identity,
    RMSNorm,
    Unflatten,
)

__all__ = [
    "Module", "Parameter", "Sequential", "ModuleList", "ModuleDict",
    "Linear", "LayerNorm", "Embedding", "Dropout", "GELU", "ReLU",
    "GPTConfig", "GPT", "CausalSelfAttention", "MLP", "Block", "functional",
    "LeakyReLU", "ELU", "SELU", "CELU", "Softplus", "Softsign", "Mish", "Hardswish",
    "Hardsigmoid", "Hardtanh", "ReLU6", "LogSigmoid", "Softmin", "GLU", "Sigmoid", "Tanh",
    "SiLU", "Softmax", "LogSoftmax", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss",
    "KLDivLoss", "BCELoss", "BCEWithLogitsLoss", "NLLLoss", "CrossEntropyLoss",
    "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "Identity", "Flatten", "Unflatten",
    "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "MaxPool1d", "MaxPool2d",
    "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
]

from . import data, init, modules, optim, parallel, utils  # noqa: E402
from .parallel import DataParallel  # noqa: E402 - torch.nn.DataParallel (raises when made)
from .serialization import load, load_metadata, save  # noqa: E402

__all__ += ["init", "optim", "utils", "data", "save", "load", "load_metadata", "modules",
            "parallel", "DataParallel"]

from .attention import MultiheadAttention  # noqa: E402
from .rnn import (  # noqa: E402
    GRU,
    LSTM,
    RNN,
    GRUCell,
    LSTMCell,
    RNNBase,
    RNNCell,
    RNNCellBase,
)
from .transformer import (  # noqa: E402
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ += ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell",
            "MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerEncoderLayer",
            "TransformerDecoder", "TransformerDecoderLayer"]
