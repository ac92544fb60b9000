"""nn.modules: torch's `torch.nn.modules.<file>.<Class>` import paths over the `nn` namespace.

Each submodule lists torch's names of that file and reads them from `nn` on first use, so
`from nn.modules.linear import Linear` (and, under the compat runner, `from
torch.nn.modules.linear import Linear`) gives nn.Linear itself, a class another part of the
project adds to nn appears with no edit here, and a class the engine lacks raises an
AttributeError naming it. `nn.modules.<Class>` reads any of those names the same way.
"""

from . import (  # noqa: F401
    activation,
    adaptive,
    batchnorm,
    channelshuffle,
    container,
    conv,
    distance,
    dropout,
    flatten,
    fold,
    instancenorm,
    linear,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
)

_FILES = (activation, adaptive, batchnorm, channelshuffle, container, conv, distance, dropout,
          flatten, fold, instancenorm, linear, loss, module, normalization, padding,
          pixelshuffle, pooling, rnn, sparse, transformer, upsampling)
_OWNER = {name: mod for mod in _FILES for name in mod.NAMES}


def __getattr__(name: str):
    if name in _OWNER:
        return getattr(_OWNER[name], name)
    raise AttributeError(f"module 'nn.modules' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {n for n in _OWNER if hasattr(_OWNER[n], n)})
