"""ta.cuda.amp: torch's older spellings of ta.amp for CUDA, with torch's FutureWarning."""

import warnings

from .. import amp as _amp
from ..backend import float16


def autocast(enabled: bool = True, dtype=float16, cache_enabled: bool = True):
    """torch.cuda.amp.autocast(...): ta.amp.autocast("cuda", ...)."""
    warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                  "`torch.amp.autocast('cuda', args...)` instead.", FutureWarning, stacklevel=2)
    return _amp.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def GradScaler(init_scale: float = 2.0**16, growth_factor: float = 2.0,  # noqa: N802
               backoff_factor: float = 0.5, growth_interval: int = 2000,
               enabled: bool = True):
    """torch.cuda.amp.GradScaler(...): ta.amp.GradScaler("cuda", ...)."""
    warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
                  "`torch.amp.GradScaler('cuda', args...)` instead.", FutureWarning,
                  stacklevel=2)
    return _amp.GradScaler("cuda", init_scale, growth_factor, backoff_factor, growth_interval,
                           enabled)
