"""nn.parallel: torch's data-parallel wrappers, named so that a leftover import resolves here.

`from torch.nn.parallel import DistributedDataParallel` at a script's top is common even
when the script runs on one process; the import works, and making a wrapper raises a clear
RuntimeError (the engine has no data-parallel training yet), rather than reaching the real
torch or failing far from the cause.
"""


class _NotImplementedWrapper:
    def __init__(self, module=None, *args, **kwargs):
        raise RuntimeError(f"nn.parallel.{type(self).__name__}: data-parallel training is not "
                           "implemented yet in tinygrad_attn; use the module itself on one "
                           "process")


class DistributedDataParallel(_NotImplementedWrapper):
    """torch.nn.parallel.DistributedDataParallel: raises RuntimeError (not implemented yet)."""


class DataParallel(_NotImplementedWrapper):
    """torch.nn.parallel.DataParallel: raises RuntimeError (not implemented yet)."""


__all__ = ["DistributedDataParallel", "DataParallel"]
