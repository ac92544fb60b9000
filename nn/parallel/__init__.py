"""nn.parallel: torch's data-parallel wrappers.

`DistributedDataParallel` (distributed.py) trains one model replica per process on
ta.distributed, with bucketed all-reduces overlapped with backward (buckets.py).
`DataParallel`, torch's single-process multi-GPU wrapper, has no counterpart: the engine
drives one device per process, so making one raises a RuntimeError that points at
DistributedDataParallel (an import at a script's top still works).
"""

from .distributed import DistributedDataParallel


class DataParallel:
    """torch.nn.parallel.DataParallel: raises RuntimeError (one device per process here)."""

    def __init__(self, module=None, *args, **kwargs):
        raise RuntimeError("nn.parallel.DataParallel: single-process multi-device training is "
                           "not implemented in tinygrad_attn (the engine drives one device per "
                           "process); launch one process per rank with mpiexec and wrap the "
                           "model in nn.parallel.DistributedDataParallel")


__all__ = ["DistributedDataParallel", "DataParallel"]
