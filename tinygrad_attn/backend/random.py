"""Random numbers: seeded streams (ta.Generator, ta.manual_seed, get/set_rng_state).

The CPU stream is NumPy's PCG64 bit generator (`numpy.random.default_rng(seed)`), so the
numbers differ from torch's Mersenne Twister for the same seed; every sampler below is
written on that stream and reproducible under a seed. A Generator made for one device
(`Generator("cpu")`, as torch's) refuses draws on another; the default generator holds one
stream per device.
"""

from __future__ import annotations

import copy
import math
import os

import numpy as np

from . import devices
from .dtypes import DType

DEFAULT_SEED = 67280421310721  # a new torch.Generator's initial_seed()
_U64 = 1 << 64


def _check_seed(seed) -> int:
    """torch's range for a seed: int64 or uint64 (a negative seed wraps into uint64)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise TypeError(f"manual_seed: the seed must be an int, got "
                            f"{type(seed).__name__}") from None
    if not -(1 << 63) <= seed < _U64:
        raise ValueError(f"manual_seed: Overflow when unpacking long long; the seed {seed} "
                           "is outside [-2**63, 2**64)")
    return seed % _U64


class Generator:
    """A seeded random stream, as torch.Generator: `Generator("cpu").manual_seed(0)`.

    device=None (the engine's default generator) keeps one stream per device.
    """

    def __init__(self, device: str | None = "cpu"):
        if device is not None:
            device = devices.canonical_device(device)
        self._device = device
        self.manual_seed(DEFAULT_SEED)

    @property
    def device(self) -> str:
        return self._device or "cpu"

    def manual_seed(self, seed: int) -> Generator:
        self._seed = _check_seed(seed)
        self._cpu = np.random.default_rng(self._seed)
        self._cuda = {}  # device -> number of draws made on it so far
        return self

    def seed(self) -> int:
        """Reseed from the operating system's entropy; returns the new seed (as torch)."""
        new = int.from_bytes(os.urandom(8), "little") >> 1  # a non-negative int64, as torch's
        self.manual_seed(new)
        return new

    def initial_seed(self) -> int:
        return self._seed

    def _rng(self, device: str):
        """The generator for one draw on `device` (call inside on_device(device)).

        CuPy's generators keep their state in GPU memory with no way to read or restore it
        (`bit_generator.state` is a method returning a device pointer), so a CUDA stream is
        a counter instead: draw n is made by a generator seeded with (seed, n). Its state is
        that count, which get_state/set_state (and so checkpoint's replay) can save exactly.
        """
        if self._device is not None and self._device.split(":")[0] != device.split(":")[0]:
            raise RuntimeError(f"Expected a '{device.split(':')[0]}' device type for generator "
                               f"but found '{self._device.split(':')[0]}'")
        if device == "cpu":
            return self._cpu
        n = self._cuda.get(device, 0)
        self._cuda[device] = n + 1
        return devices.cp.random.default_rng([self._seed, n])

    # ------------------------------------------------------------------ samplers
    def normal(self, shape, dtype: DType, device: str, mean=0.0, std=1.0):
        """mean + std * N(0, 1) in `dtype` (float16 drawn in float32 and rounded once);
        mean and std may be arrays that broadcast to `shape`."""
        z = self._floats(self._rng(device).standard_normal, shape, dtype)
        if not (_is_number(mean, 0.0) and _is_number(std, 1.0)):
            z = (z * std + mean).astype(dtype.np, copy=False)
        return z

    def uniform(self, shape, dtype: DType, device: str, low=0.0, high=1.0):
        """U[low, high) in `dtype`: low + (high - low) * U[0, 1)."""
        u = self._floats(self._rng(device).random, shape, dtype)
        if low != 0.0 or high != 1.0:
            u = (u * (high - low) + low).astype(dtype.np, copy=False)
        return u

    def _floats(self, draw, shape, dtype: DType):
        if dtype.np in (np.float32, np.float64):
            return draw(shape, dtype=dtype.np)
        return draw(shape, dtype=np.float32).astype(dtype.np)

    def integers(self, low, high, shape, dtype: DType, device: str):
        """Integers in [low, high), drawn in int64 (high may be 2**63: the top is inclusive
        high - 1, which int64 holds)."""
        return self._rng(device).integers(low, high - 1, size=shape, dtype=np.int64,
                                          endpoint=True).astype(dtype.np)

    def permutation(self, n: int, dtype: DType, device: str):
        """A uniform permutation of 0 .. n-1: the order that sorts n uniform keys."""
        keys = self._rng(device).random(n)
        return devices.xp_for(device).argsort(keys, kind="stable").astype(dtype.np)

    def exponential(self, shape, dtype: DType, device: str, lambd=1.0):
        """Exp(lambd): -log(1 - U) / lambd."""
        u = self._rng(device).random(shape)
        return (-devices.xp_for(device).log1p(-u) / lambd).astype(dtype.np)

    def geometric(self, shape, p: float, dtype: DType, device: str):
        """The number of Bernoulli(p) trials up to the first success (1, 2, ...):
        floor(log(1 - U) / log(1 - p)) + 1."""
        xp = devices.xp_for(device)
        u = self._rng(device).random(shape)
        return (xp.floor(xp.log1p(-u) / math.log1p(-p)) + 1).astype(dtype.np)

    def cauchy(self, shape, dtype: DType, device: str, median=0.0, sigma=1.0):
        """median + sigma * tan(pi * (U - 1/2))."""
        u = self._rng(device).random(shape)
        return (median + sigma * devices.xp_for(device).tan(math.pi * (u - 0.5))).astype(
            dtype.np)

    def poisson(self, rates, device: str):
        """One Poisson(rate) draw per rate, in the rates' dtype."""
        return self._rng(device).poisson(rates).astype(rates.dtype)

    def bernoulli(self, p, shape, dtype: DType, device: str):
        """1 where U < p (p a number or an array broadcasting to shape), else 0."""
        u = self._rng(device).random(shape)
        return (u < p).astype(dtype.np)

    def multinomial(self, weights, n: int, replacement: bool, device: str):
        """`n` category indices per row of the 2-D non-negative `weights` (int64, (R, n)).

        With replacement: each draw is the first category whose running total passes
        U * row total. Without: the n smallest of E_i / w_i for E_i ~ Exp(1), which picks
        categories one after another in proportion to the weights left (categories of
        weight 0 come last, in index order).
        """
        xp, rng = devices.xp_for(device), self._rng(device)
        w = weights.astype(np.float64)
        rows, k = w.shape
        if replacement:
            cdf = xp.cumsum(w, axis=1)
            u = rng.random((rows, n)) * cdf[:, -1:]
            out = xp.empty((rows, n), dtype=np.int64)
            for r in range(rows):
                out[r] = xp.searchsorted(cdf[r], u[r], side="right")
            # a draw rounded up to the row's total lands past the end: it belongs to the
            # last category of non-zero weight
            last = k - 1 - xp.argmax(w[:, ::-1] > 0, axis=1)
            return xp.where(out >= k, last[:, None], out)
        e = -xp.log1p(-rng.random((rows, k)))
        positive = w > 0
        keys = xp.where(positive, e / xp.where(positive, w, 1.0), xp.inf)
        if n == 1:  # one draw per row (sampling a token): the smallest key, no sort
            return xp.argmin(keys, axis=1)[:, None].astype(np.int64)
        return xp.argsort(keys, axis=1, kind="stable")[:, :n].astype(np.int64)

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict:
        """The generator's state (every device's stream), JSON-able, for set_state."""
        return {"seed": self._seed, "cpu": copy.deepcopy(self._cpu.bit_generator.state),
                "cuda": dict(self._cuda)}

    def set_state(self, state) -> Generator:
        if not isinstance(state, dict) or "cpu" not in state:
            raise TypeError(f"set_state: expected the dict get_state() returns, got "
                            f"{type(state).__name__}")
        self._seed = int(state.get("seed", self._seed))
        self._cpu.bit_generator.state = copy.deepcopy(state["cpu"])
        self._cuda = {d: int(n) for d, n in state.get("cuda", {}).items()}
        return self

    def __repr__(self) -> str:
        return f"Generator(device={self.device!r}, initial_seed={self._seed})"


def _is_number(x, value) -> bool:
    return isinstance(x, (int, float)) and x == value


def value_range(dtype: DType) -> tuple:
    """(lowest, highest) integer a random integer of `dtype` may take: the dtype's range for
    integers and bool, +-2**digits for floats (every integer there is exact), as torch."""
    kind = dtype.np.kind
    if kind == "b":
        return 0, 1
    if kind in "iu":
        info = np.iinfo(dtype.np)
        return int(info.min), int(info.max)
    digits = np.finfo(dtype.np).nmant + 1
    return -(1 << digits), 1 << digits


def check_range(op: str, low: int, high: int, dtype: DType) -> None:
    """torch's checks of a [low, high) integer range for `dtype` (randint, random_)."""
    if low >= high:
        raise RuntimeError(f"{op}: random_ expects 'from' to be less than 'to', but got "
                           f"from={low} >= to={high}")
    lowest, highest = value_range(dtype)
    if dtype.np.kind != "f":
        if low < lowest:
            raise RuntimeError(f"{op}: from={low} is out of bounds for {dtype.name}")
        if high - 1 > highest:
            raise RuntimeError(f"{op}: to - 1 = {high - 1} is out of bounds for {dtype.name}")
