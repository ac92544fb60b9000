"""Random numbers: one seeded stream per device (ta.manual_seed, get/set_rng_state)."""

from __future__ import annotations

import numpy as np

from . import devices
from .dtypes import DType


class Generator:
    """One seeded random stream per device, like torch.manual_seed."""

    def __init__(self, seed: int = 0):
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> None:
        self.seed = int(seed)
        self._cpu = np.random.default_rng(self.seed)
        self._cuda = {}  # device -> number of draws made on it so far

    def _rng(self, device: str):
        """The generator for one draw on `device` (call inside on_device(device)).

        CuPy's generators keep their state in GPU memory with no way to read or restore it
        (`bit_generator.state` is a method returning a device pointer), so a CUDA stream is
        a counter instead: draw n is made by a generator seeded with (seed, n). Its state is
        that count, which get_state/set_state (and so checkpoint's replay) can save exactly.
        """
        if device == "cpu":
            return self._cpu
        n = self._cuda.get(device, 0)
        self._cuda[device] = n + 1
        return devices.cp.random.default_rng([self.seed, n])

    def normal(self, shape, dtype: DType, device: str):
        rng = self._rng(device)
        if dtype.np in (np.float32, np.float64):
            return rng.standard_normal(shape, dtype=dtype.np)
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype.np)

    def uniform(self, shape, dtype: DType, device: str):
        rng = self._rng(device)
        if dtype.np in (np.float32, np.float64):
            return rng.random(shape, dtype=dtype.np)
        return rng.random(shape, dtype=np.float32).astype(dtype.np)

    def integers(self, low, high, shape, dtype: DType, device: str):
        return self._rng(device).integers(low, high, size=shape).astype(dtype.np)

    def get_state(self):
        """The generator's state (every device's stream), for set_state."""
        import copy

        return {"seed": self.seed, "cpu": copy.deepcopy(self._cpu.bit_generator.state),
                "cuda": dict(self._cuda)}

    def set_state(self, state) -> None:
        import copy

        self.seed = int(state.get("seed", self.seed))
        self._cpu.bit_generator.state = copy.deepcopy(state["cpu"])
        self._cuda = {d: int(n) for d, n in state.get("cuda", {}).items()}
