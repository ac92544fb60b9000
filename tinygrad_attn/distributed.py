"""ta.distributed: torch.distributed's names, until the engine has data-parallel training.

A script imports these at its top and calls them only when launched on several processes
(`torchrun`), so the names exist and importing them works; `is_available()` is False and
`is_initialized()` False, as torch reports for a build without distributed support, and
every other call raises a RuntimeError saying distributed training is not implemented yet.
"""

from __future__ import annotations

_NAMES = (
    "init_process_group", "destroy_process_group", "get_rank", "get_world_size",
    "get_local_rank", "get_node_local_rank", "get_backend", "barrier", "monitored_barrier",
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list",
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "new_group", "new_subgroups",
    "get_global_rank", "get_group_rank", "get_process_group_ranks", "init_device_mesh",
    "is_nccl_available", "is_gloo_available", "is_mpi_available", "is_torchelastic_launched",
)


def is_available() -> bool:
    """False: the engine has no distributed (multi-process) training yet."""
    return False


def is_initialized() -> bool:
    """False: no process group can be made."""
    return False


def _not_implemented(name: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"distributed.{name}: distributed training is not implemented yet "
                           "in tinygrad_attn (is_available() is False); run on one process")

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"torch.distributed.{name}: raises RuntimeError (not implemented yet)."
    return call


class _NotImplementedType:
    """A torch.distributed class name (ReduceOp, Backend, ...): exists, unusable."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _not_implemented(f"{self._name}.{attr}")()

    def __call__(self, *args, **kwargs):
        return _not_implemented(self._name)()

    def __repr__(self) -> str:
        return f"<distributed.{self._name}: not implemented>"


globals().update({name: _not_implemented(name) for name in _NAMES})
ReduceOp = _NotImplementedType("ReduceOp")
Backend = _NotImplementedType("Backend")
ProcessGroup = _NotImplementedType("ProcessGroup")
group = _NotImplementedType("group")
