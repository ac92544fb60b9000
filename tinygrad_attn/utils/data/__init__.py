"""torch.utils.data's counterpart: datasets, samplers, default_collate and DataLoader.

Shuffling draws from a ta.Generator (`DataLoader(..., generator=ta.Generator().manual_seed(0))`
is reproducible), whose stream is the engine's own: for one seed the shuffled order differs
from torch's, while sequential batches, batch sizes, drop_last and collation are torch's.
DistributedSampler is the same: its padding, dropping and split across ranks are torch's,
applied to the engine's permutation for seed + epoch.
"""

from . import distributed  # noqa: F401 - torch.utils.data.distributed, for its sampler
from .dataloader import DataLoader, default_collate, default_convert, get_worker_info
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset",
    "DistributedSampler", "IterableDataset", "RandomSampler", "Sampler", "SequentialSampler",
    "StackDataset", "Subset", "SubsetRandomSampler", "TensorDataset", "WeightedRandomSampler",
    "default_collate", "default_convert", "get_worker_info", "random_split",
]
