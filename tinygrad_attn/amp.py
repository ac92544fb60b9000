"""ta.amp: torch's mixed-precision names, with torch's own behaviour where it does nothing.

The engine computes every op in the dtypes of its tensors; it has no autocast (the per-op
casting table torch keeps) and no loss scaler. What a training script meets on a machine
without CUDA is what torch does there, and that the engine reproduces exactly:

- `autocast("cuda")` without a GPU warns and is disabled: the block runs as written.
- `GradScaler()` (for "cuda") without a GPU warns and is disabled: `scale(loss)` returns the
  loss itself, `step(opt)` calls `opt.step()`, `unscale_` and `update` do nothing,
  `state_dict()` is `{}`.

Anything that would change results refuses loudly instead of running unscaled or uncast:
an enabled autocast where a GPU exists or on the CPU (torch's CPU autocast is bfloat16,
which the engine lacks), and an enabled scaler on an available device.
"""

from __future__ import annotations

import functools
import warnings

from . import backend
from .backend.dtypes import bfloat16

_DEVICE_TYPES = ("cpu", "cuda")


def _device_type(device_type, op: str) -> str:
    kind = str(device_type).partition(":")[0]
    if kind not in _DEVICE_TYPES:
        raise RuntimeError(f"{op}: unsupported device_type {device_type!r}; the engine has "
                           f"{_DEVICE_TYPES}")
    return kind


def is_autocast_available(device_type: str) -> bool:
    """Whether autocast can be enabled for `device_type`: never, in this engine."""
    _device_type(device_type, "is_autocast_available")
    return False


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """False: no autocast region is ever active (an enabled one refuses to start)."""
    return False


class autocast:  # noqa: N801 - torch's name
    """torch.amp.autocast(device_type, dtype=None, enabled=True, cache_enabled=None), as a
    context manager or decorator. Disabled (a no-op) when `enabled=False`, or for "cuda"
    when no GPU is available (with torch's warning); otherwise a NotImplementedError that
    says why (the engine has no per-op casting)."""

    def __init__(self, device_type: str, dtype=None, enabled: bool = True,
                 cache_enabled: bool | None = None):
        self.device = _device_type(device_type, "autocast")
        self.fast_dtype = dtype if dtype is not None else (
            backend.float16 if self.device == "cuda" else bfloat16)
        self._enabled = bool(enabled)
        if self._enabled and self.device == "cuda" and not backend.cuda_is_available():
            warnings.warn("CUDA is not available. Disabling autocast.", UserWarning,
                          stacklevel=2)
            self._enabled = False
        if self._enabled:
            name = getattr(self.fast_dtype, "name", self.fast_dtype)
            why = (" (the engine has no bfloat16: NumPy lacks the type)"
                   if self.fast_dtype is bfloat16 else "")
            raise NotImplementedError(
                f"autocast({self.device!r}, dtype={name}): the engine has no autocast{why}; "
                "it computes each op in its inputs' dtype. Cast the model and inputs "
                "(model.half(), x.half()) or pass enabled=False")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return wrapper


class GradScaler:
    """torch.amp.GradScaler(device="cuda", init_scale=2.**16, growth_factor=2.0,
    backoff_factor=0.5, growth_interval=2000, enabled=True).

    Disabled (torch's pass-through) when `enabled=False`, or for "cuda" when no GPU is
    available (with torch's warning). An enabled scaler on an available device raises
    NotImplementedError: the engine has no loss scaling, and an unscaled float16 step would
    differ from torch's."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        self._device = _device_type(device, "GradScaler")
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._enabled = bool(enabled)
        if self._enabled and self._device == "cuda" and not backend.cuda_is_available():
            warnings.warn("GradScaler is enabled, but CUDA is not available.  Disabling.",
                          UserWarning, stacklevel=2)
            self._enabled = False
        if self._enabled:
            raise NotImplementedError(
                f"GradScaler({self._device!r}, enabled=True): the engine has no loss scaling; "
                "train in float32 or pass enabled=False (the scaler then passes the loss "
                "and the step through)")

    def is_enabled(self) -> bool:
        return self._enabled

    def scale(self, outputs):
        """The outputs unchanged (a disabled scaler multiplies by nothing)."""
        return outputs

    def unscale_(self, optimizer) -> None:
        return None

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step(*args, **kwargs), and its return value."""
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None) -> None:
        return None

    def get_scale(self) -> float:
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def state_dict(self) -> dict:
        """{} for a disabled scaler, as torch's (a checkpoint stores it as it is)."""
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """A no-op on a disabled scaler, as torch's."""
        return None
