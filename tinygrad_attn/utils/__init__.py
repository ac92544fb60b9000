"""torch.utils's counterpart: `ta.utils.data` (datasets, samplers, DataLoader)."""

from . import data  # noqa: F401
