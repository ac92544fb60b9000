"""torch.utils.data.distributed's counterpart: DistributedSampler (defined with the other
samplers, in sampler.py)."""

from .sampler import DistributedSampler

__all__ = ["DistributedSampler"]
