"""ta.distributed: torch.distributed's names and semantics, on MPI (mpi4py).

A script launched on N processes with `mpiexec -n N python train.py` calls
`init_process_group()`; rank and world size come from MPI.COMM_WORLD. The collectives
(all_reduce, broadcast, all_gather, all_gather_into_tensor, reduce_scatter,
reduce_scatter_tensor, reduce, barrier) take CPU tensors and hand their memory to MPI
directly: a contiguous tensor is written in place, with no copy, and its version counter is
bumped so autograd sees the write. Every collective of a process runs on one worker thread in
the order it was issued (see work.py); `async_op=True` returns the Work to wait on.

Backends: "mpi" (the default) and "gloo", which a PyTorch CPU script names: it is accepted
and runs on MPI. "nccl" is refused: it would need CuPy's NCCL on a GPU, and has not been run
on one.

Failures: `wait()` past the group's timeout (30 minutes, as torch; the environment variable
TINYGRAD_ATTN_DIST_TIMEOUT, in seconds, overrides it) raises a RuntimeError naming the op, the
tensor and this rank, and the process aborts the MPI job when it exits instead of hanging in
MPI_Finalize. With more than one rank, an uncaught exception aborts the job too, so the
others do not wait for a rank that is gone. A rank killed by a signal is seen by mpiexec,
which ends the others itself.
"""

from __future__ import annotations

import atexit
import datetime
import enum
import os
import sys
import time

from ..backend import mpi as _mpi
from ..tensor import Tensor
from .work import Work, Worker, seconds

__all__ = [
    "Backend", "GroupMember", "ProcessGroup", "ReduceOp", "Work", "all_gather",
    "all_gather_into_tensor", "all_reduce", "barrier", "broadcast", "destroy_process_group",
    "get_backend", "get_global_rank", "get_group_rank", "get_local_rank",
    "get_node_local_rank", "get_process_group_ranks", "get_rank", "get_world_size", "group",
    "init_process_group", "is_available", "is_gloo_available", "is_initialized",
    "is_mpi_available", "is_nccl_available", "is_torchelastic_launched", "reduce",
    "reduce_scatter", "reduce_scatter_tensor",
]

_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # torch's default for a CPU group
_TIMEOUT_ENV = "TINYGRAD_ATTN_DIST_TIMEOUT"
_NOT_INITIALIZED = ("Default process group has not been initialized, please make sure to call "
                    "init_process_group.")


# ----------------------------------------------------------------------------- availability
def is_available() -> bool:
    """True if mpi4py can be imported (MPI is not started by asking)."""
    return _mpi.available()


def is_mpi_available() -> bool:
    return _mpi.available()


def is_nccl_available() -> bool:
    """False: the NCCL backend is not built."""
    return False


def is_gloo_available() -> bool:
    """False: there is no gloo library here; init_process_group("gloo") runs on MPI."""
    return False


def is_torchelastic_launched() -> bool:
    """True if torchrun started this process (it sets TORCHELASTIC_RUN_ID)."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


# ----------------------------------------------------------------------------- names
class Backend(str):
    """A backend name, lower-cased ("mpi", "gloo", "nccl"), as torch's Backend."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise ValueError(f"Backend name must be a string, but got: {name!r}")
        return super().__new__(cls, name.lower())


class ReduceOp:
    """The reductions: ReduceOp.SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR (torch's
    values; AVG is SUM divided by the world size, for floating tensors)."""

    class RedOpType(enum.IntEnum):
        SUM = 0
        AVG = 1
        PRODUCT = 2
        MIN = 3
        MAX = 4
        BAND = 5
        BOR = 6
        BXOR = 7

    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR


def _reduction(op, what: str) -> str:
    if not isinstance(op, ReduceOp.RedOpType):
        raise TypeError(f"{what}: op must be a ReduceOp (ta.distributed.ReduceOp.SUM, ...), "
                        f"got {op!r}")
    return op.name.lower()


class ProcessGroup:
    """The default (world) group: every rank of the MPI job. rank() and size() as torch."""

    def __init__(self, comm, backend: str, timeout_s: float, local_rank: int,
                 name: str) -> None:
        self._comm = comm
        self._backend = Backend(backend)
        self._name = name or "0"
        self.timeout_s = timeout_s
        self.local_rank = local_rank
        self._broken: str | None = None  # why, once a collective timed out
        self._peers = comm.allgather_object((os.getpid(), comm.host))  # for messages
        self._worker = Worker(comm.rank)

    def rank(self) -> int:
        return self._comm.rank

    def size(self) -> int:
        return self._comm.size

    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return (f"<ProcessGroup {self._backend} rank {self.rank()} of {self.size()}"
                + (", broken" if self._broken else "") + ">")

    # ------------------------------------------------------------------ running work
    def _issue(self, op: str, describe: str, nbytes: int, run, async_op: bool):
        if self._broken is not None:
            raise RuntimeError(f"{op} ({describe}): the process group is broken since "
                               f"{self._broken}; no further collective can run (a blocked "
                               "MPI call cannot be cancelled)")
        work = self._worker.submit(Work(op, describe, nbytes, run, self))
        if async_op:
            return work
        work.wait()
        return None

    def _timed_out(self, work: Work, limit: float) -> RuntimeError:
        """The error of a wait that ran out. Past the group's timeout the group is broken
        (the collective is taken as lost); a shorter timeout given to wait() only reports."""
        rank, size = self.rank(), self.size()
        where = (f"{work.op} ({work.describe}) did not finish within {limit:g} s on rank "
                 f"{rank} of {size} (pid {os.getpid()}): another rank may have died or not "
                 f"called {work.op} (every rank must issue the same collectives in the same "
                 "order).")
        if limit < self.timeout_s:
            return RuntimeError(f"{where} It is still queued and this group's timeout "
                                f"({self.timeout_s:g} s) has not run out: wait() may be "
                                f"called again. Ranks' pids: {self._pid_list()}")
        self._broken = f"{work.op} ({work.describe}) timed out after {limit:g} s on rank {rank}"
        return RuntimeError(
            f"{where} An MPI collective cannot be cancelled: this process will abort the MPI "
            f"job when it exits. Ranks' pids: {self._pid_list()}")

    def _pid_list(self) -> str:
        return ", ".join(f"{r}={pid}@{host}" for r, (pid, host) in enumerate(self._peers))

    def _drain(self, limit: float) -> bool:
        """Wait for every queued collective to finish; False if that took past `limit`."""
        last = self._worker.last
        if last is not None and not last._done.wait(limit):
            self._timed_out(last, limit)
            return False
        return True


class _WorldMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:  # noqa: N802 - torch's name
        return _default


class group(metaclass=_WorldMeta):  # noqa: N801 - torch's name
    """group.WORLD: the default process group (None before init_process_group)."""


GroupMember = group

_default: ProcessGroup | None = None
_pending_abort: tuple | None = None  # (comm, reason, rank) of a destroyed, broken group
_exit_hooks_installed = False
_previous_excepthook = None


# ----------------------------------------------------------------------------- setup
def _backend_name(backend) -> str:
    name = "mpi" if backend is None else Backend(backend)
    if ":" in name:  # torch's per-device form, "cpu:gloo,cuda:nccl": the CPU entry is used
        pairs = dict(part.split(":", 1) for part in name.split(",") if ":" in part)
        if pairs.get("cpu") in ("mpi", "gloo"):
            return Backend(pairs["cpu"])
        raise ValueError(f"init_process_group: backend {name!r} names no CPU backend this "
                         "engine has ('cpu:mpi' or 'cpu:gloo'; tensors stay on the CPU)")
    if name in ("mpi", "gloo"):
        return name
    if name == "nccl":
        raise RuntimeError(
            "init_process_group: the NCCL backend is not built in tinygrad_attn (it would "
            "need CuPy's NCCL on a GPU and has not been run on one); use backend='mpi' or "
            "'gloo' (both run on MPI, on CPU tensors)")
    raise AssertionError(f"Unknown backend type {name}")  # torch's type and text


def _timeout_seconds(timeout) -> float:
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise TypeError("Expected timeout argument to be of type datetime.timedelta, got "
                        f"{timeout}")
    value = os.environ.get(_TIMEOUT_ENV)
    if value is not None:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{_TIMEOUT_ENV}={value!r}: expected a number of seconds") from None
    return (timeout or _DEFAULT_TIMEOUT).total_seconds()


def _launch_description() -> str:
    env = os.environ
    if "PMI_RANK" in env or "PMI_SIZE" in env or "PMIX_RANK" in env:
        return f"by mpiexec with {env.get('PMI_SIZE', '?')} processes"
    if is_torchelastic_launched():
        return ("by torchrun (TORCHELASTIC_RUN_ID is set): MPI sees each process torchrun "
                "starts as a job of its own, of size 1")
    return "without mpiexec, so MPI runs it alone (a world of size 1)"


def _check_launch(comm, world_size: int, rank: int) -> None:
    """torchrun-style settings (env RANK/WORLD_SIZE, explicit arguments) must agree with MPI."""
    claims = [("WORLD_SIZE", "environment", os.environ.get("WORLD_SIZE"), comm.size),
              ("RANK", "environment", os.environ.get("RANK"), comm.rank),
              ("world_size", "argument", None if world_size == -1 else world_size, comm.size),
              ("rank", "argument", None if rank == -1 else rank, comm.rank)]
    problems = []
    for name, where, value, mpi_value in claims:
        if value is None:
            continue
        try:
            agrees = int(value) == mpi_value
        except (TypeError, ValueError):
            agrees = False
        if not agrees:
            problems.append(f"{name}={value} ({where})")
    if problems:
        raise RuntimeError(
            f"init_process_group: {', '.join(problems)} but MPI reports rank {comm.rank} of a "
            f"world of size {comm.size}: this process was launched {_launch_description()}. "
            "Launch every rank with `mpiexec -n N python script.py`: rank and world size "
            "come from MPI")


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None) -> None:
    """Join the MPI job as the default process group. init_method, store and pg_options are
    accepted and unused: mpiexec does the rendezvous."""
    global _default
    if _default is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if _pending_abort is not None:
        raise RuntimeError(f"init_process_group: an earlier group broke ({_pending_abort[1]}) "
                           "and its collective still holds MPI; this process cannot use MPI "
                           "again (it aborts the job when it exits)")
    name = _backend_name(backend)
    timeout_s = _timeout_seconds(timeout)
    if device_id is not None and not str(device_id).startswith("cpu"):
        raise RuntimeError(f"init_process_group: device_id={device_id!r}: the MPI backend "
                           "moves CPU tensors only")
    if not _mpi.available():
        raise RuntimeError(
            "init_process_group: the MPI backend needs mpi4py and an MPI library: pip install "
            "'tinygrad_attn[distributed]' (mpi4py and mpich), then launch with "
            "`mpiexec -n N python script.py`")
    comm = _mpi.init()
    _check_launch(comm, world_size, rank)
    local = os.environ.get("LOCAL_RANK")
    local_rank = int(local) if local is not None else comm.local_rank
    _default = ProcessGroup(comm, name, timeout_s, local_rank, group_name)
    _install_exit_hooks()


def destroy_process_group(group=None) -> None:
    """Wait for the queued collectives (up to the group's timeout), stop the worker thread and
    forget the group; init_process_group may be called again (MPI stays initialised)."""
    global _default, _pending_abort
    pg = _default
    if pg is None:
        raise AssertionError("Process group cannot be None")  # torch's type and text
    _check_group(group, pg)
    drained = pg._broken is None and pg._drain(pg.timeout_s)
    _default = None
    if drained:
        pg._worker.stop()
    else:  # the worker is stuck in MPI: nothing can finalize cleanly now
        _pending_abort = (pg._comm, pg._broken, pg.rank())
    if _previous_excepthook is not None and sys.excepthook is _abort_on_uncaught:
        sys.excepthook = _previous_excepthook
    if not drained:
        raise RuntimeError(f"destroy_process_group: {pg._broken}; the MPI job will be aborted "
                           "when this process exits")


def _install_exit_hooks() -> None:
    global _exit_hooks_installed, _previous_excepthook
    if not _exit_hooks_installed:
        atexit.register(_at_exit)  # mpi4py finalizes MPI from Py_AtExit, after every atexit hook
        _exit_hooks_installed = True
    if _default.size() > 1 and sys.excepthook is not _abort_on_uncaught:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _abort_on_uncaught


def _abort(comm, rank: int, reason: str) -> None:
    print(f"ta.distributed: rank {rank}: {reason}; aborting the MPI job (MPI_Abort) so that "
          "no rank waits for this one", file=sys.stderr, flush=True)
    sys.stdout.flush()
    time.sleep(0.2)  # the launcher forwards what was printed before it tears the job down
    comm.abort(1)


def _at_exit() -> None:
    """Before mpi4py finalizes MPI: drain the queue; abort if a collective never finished."""
    pg = _default
    if _pending_abort is not None:
        comm, reason, rank = _pending_abort
        _abort(comm, rank, f"exiting with {reason}")
    elif pg is not None:
        if pg._broken is None and pg._drain(pg.timeout_s):
            pg._worker.stop()
            return
        _abort(pg._comm, pg.rank(), f"exiting with {pg._broken}")


def _abort_on_uncaught(exc_type, exc, tb) -> None:
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)
    pg = _default
    if pg is not None and pg.size() > 1:
        _abort(pg._comm, pg.rank(), f"uncaught {exc_type.__name__} on rank {pg.rank()} of "
                                    f"{pg.size()}")


# ----------------------------------------------------------------------------- queries
def _group_of(group) -> ProcessGroup:
    pg = _default
    if pg is None:
        raise ValueError(_NOT_INITIALIZED)
    _check_group(group, pg)
    return pg


def _check_group(group, pg: ProcessGroup) -> None:
    if group is not None and group is not pg:
        raise ValueError(f"Group {group!r} is not registered, please create group with "
                         "new_group (only the default group exists here: new_group is not "
                         "implemented in tinygrad_attn)")


def is_initialized() -> bool:
    return _default is not None


def get_rank(group=None) -> int:
    return _group_of(group).rank()


def get_world_size(group=None) -> int:
    return _group_of(group).size()


def get_backend(group=None) -> Backend:
    """"mpi", or "gloo" when that name was asked for (it runs on MPI)."""
    return _group_of(group)._backend


def get_local_rank() -> int:
    """This process's rank among those on its host (LOCAL_RANK if set, else MPI's)."""
    return _group_of(None).local_rank


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """LOCAL_RANK from the environment, else the group's local rank (MPI knows it), else
    fallback_rank; torch's RuntimeError without any of them."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if _default is not None:
        return _default.local_rank
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow "
        "`get_node_local_rank` to work, assuming you are not running in a multi-device "
        "context and want the code to run locally instead.")


def get_process_group_ranks(group) -> list[int]:
    return list(range(_group_of(group).size()))


def get_global_rank(group, group_rank: int) -> int:
    """The one group is the world: a group rank is the global rank."""
    _group_of(group)
    return group_rank


def get_group_rank(group, global_rank: int) -> int:
    _group_of(group)
    return global_rank


# ----------------------------------------------------------------------------- tensor checks
def _describe(t: Tensor) -> str:
    return f"tensor of shape {tuple(t.shape)}, {t.dtype.name}"


def _array_of(op: str, t, name: str = "tensor"):
    """The NumPy array over t's memory (no copy), after torch's checks."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: Invalid function argument. Expected parameter `{name}` of "
                        f"type Tensor but got {type(t)} instead.")
    if t.device != "cpu":
        raise RuntimeError(f"{op}: {name} is on {t.device}: the MPI backend moves CPU tensors "
                           "only (the NCCL backend for GPU tensors is not built); use .cpu()")
    if not t.is_contiguous():
        raise RuntimeError(
            f"{op}: Tensors must be contiguous ({name} has shape {tuple(t.shape)} and strides "
            f"{tuple(t.stride())}): MPI reads and writes the tensor's memory in place; pass "
            "t.contiguous() and copy the result back")
    arr = t._array()
    _mpi.datatype(arr.dtype, op)  # a dtype MPI lacks is refused before anything is queued
    return arr


def _written(*tensors: Tensor) -> None:
    """Declare the in-place write (at issue time, on the caller's thread) so a tensor saved
    for backward sees its version move, as after any in-place op."""
    for t in tensors:
        t._storage.version += 1


def _root(op: str, pg: ProcessGroup, rank, group_rank, names: tuple[str, str]) -> int:
    if rank is None and group_rank is None:
        raise ValueError("Must specify global_rank or group_rank")
    if rank is not None and group_rank is not None and rank != group_rank:
        raise ValueError(f"{op}: {names[0]}={rank} and {names[1]}={group_rank} disagree "
                         "(the one group is the world: they are the same rank)")
    root = rank if rank is not None else group_rank
    if not isinstance(root, int) or not 0 <= root < pg.size():
        raise RuntimeError(f"{op}: invalid root rank: {root} (world size {pg.size()})")
    return root


def _check_list(op: str, tensors, name: str, pg: ProcessGroup, like: Tensor) -> list:
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, Tensor)
                                                         for t in tensors):
        raise TypeError(f"{op}: Invalid function argument. Expected parameter `{name}` of "
                        f"type List[Tensor] but got {type(tensors)} instead.")
    if len(tensors) != pg.size():
        raise RuntimeError(f"{op}: invalid tensor list {name} (expected length "
                           f"{pg.size()}, the world size, got {len(tensors)})")
    for i, t in enumerate(tensors):
        if t.dtype != like.dtype:
            raise ValueError(f"{op}: Invalid usage of tensors with different dtypes: "
                             f"{name}[{i}] is {t.dtype.name}, the tensor is {like.dtype.name}")
        if t.shape != like.shape:
            raise RuntimeError(f"{op}: invalid tensor size at index {i} of {name} (expected "
                               f"{tuple(like.shape)}, got {tuple(t.shape)})")
    return [_array_of(op, t, f"{name}[{i}]") for i, t in enumerate(tensors)]


def _check_pair(op: str, big: Tensor, small: Tensor, names: tuple[str, str],
                pg: ProcessGroup) -> None:
    if big.dtype != small.dtype:
        raise RuntimeError(f"{op}: invalid tensor type: {names[0]} is {big.dtype.name}, "
                           f"{names[1]} is {small.dtype.name}")
    if big.numel() != small.numel() * pg.size():
        raise RuntimeError(
            f"{op}: {names[0]} of shape {tuple(big.shape)} must hold world size "
            f"({pg.size()}) times the elements of {names[1]} of shape {tuple(small.shape)}")


# ----------------------------------------------------------------------------- collectives
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """tensor <- the reduction of every rank's tensor, in place."""
    pg = _group_of(group)
    arr = _array_of("all_reduce", tensor)
    red = _reduction(op, "all_reduce")
    _mpi.check_reduction(red, arr.dtype, "all_reduce")
    _written(tensor)
    return pg._issue("all_reduce", _describe(tensor), arr.nbytes,
                     lambda: pg._comm.allreduce(arr, red), async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """On rank dst, tensor <- the reduction of every rank's tensor; elsewhere it is read."""
    pg = _group_of(group)
    root = _root("reduce", pg, dst, group_dst, ("dst", "group_dst"))
    arr = _array_of("reduce", tensor)
    red = _reduction(op, "reduce")
    _mpi.check_reduction(red, arr.dtype, "reduce")
    if pg.rank() == root:
        _written(tensor)
    return pg._issue("reduce", _describe(tensor), arr.nbytes,
                     lambda: pg._comm.reduce(arr, root, red), async_op)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """tensor <- rank src's tensor, in place."""
    pg = _group_of(group)
    root = _root("broadcast", pg, src, group_src, ("src", "group_src"))
    arr = _array_of("broadcast", tensor)
    if pg.rank() != root:
        _written(tensor)
    return pg._issue("broadcast", _describe(tensor), arr.nbytes if pg.rank() == root else 0,
                     lambda: pg._comm.bcast(arr, root), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """tensor_list[r] <- rank r's tensor. MPI gathers into one buffer, then copies out."""
    pg = _group_of(group)
    send = _array_of("all_gather", tensor)
    outs = _check_list("all_gather", tensor_list, "tensor_list", pg, tensor)
    _written(*tensor_list)
    return pg._issue("all_gather", _describe(tensor), send.nbytes,
                     lambda: pg._comm.allgather_list(send, outs), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """output_tensor <- every rank's input_tensor, concatenated in rank order (zero copy)."""
    op = "all_gather_into_tensor"
    pg = _group_of(group)
    send = _array_of(op, input_tensor, "input_tensor")
    recv = _array_of(op, output_tensor, "output_tensor")
    _check_pair(op, output_tensor, input_tensor, ("output_tensor", "input_tensor"), pg)
    if input_tensor._storage is output_tensor._storage:
        at = output_tensor.data_ptr() + pg.rank() * input_tensor.nbytes
        if input_tensor.data_ptr() != at:
            raise RuntimeError(f"{op}: input_tensor overlaps output_tensor; it may share its "
                               "memory only as the block of this rank (the in-place form)")
        send = None  # MPI_IN_PLACE: this rank's block is already there
    _written(output_tensor)
    return pg._issue(op, _describe(input_tensor), input_tensor.nbytes,
                     lambda: pg._comm.allgather(send, recv, op), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """output <- the reduction over ranks of their input_list[rank]."""
    pg = _group_of(group)
    recv = _array_of("reduce_scatter", output, "output")
    sends = _check_list("reduce_scatter", input_list, "input_list", pg, output)
    red = _reduction(op, "reduce_scatter")
    _mpi.check_reduction(red, recv.dtype, "reduce_scatter")
    _written(output)
    return pg._issue("reduce_scatter", _describe(output), recv.nbytes * pg.size(),
                     lambda: pg._comm.reduce_scatter(sends, recv, red), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    """output <- block `rank` (output's size) of the reduction over ranks of input."""
    name = "reduce_scatter_tensor"
    pg = _group_of(group)
    recv = _array_of(name, output, "output")
    send = _array_of(name, input, "input")
    _check_pair(name, input, output, ("input", "output"), pg)
    if input._storage is output._storage:
        raise RuntimeError(f"{name}: output shares memory with input; give it its own tensor")
    red = _reduction(op, name)
    _mpi.check_reduction(red, recv.dtype, name)
    _written(output)
    return pg._issue(name, _describe(input), send.nbytes,
                     lambda: pg._comm.reduce_scatter(send, recv, red, name), async_op)


def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    """Return once every rank called barrier (after this rank's queued collectives)."""
    pg = _group_of(group)
    limit = seconds(timeout, "barrier")
    work = pg._issue("barrier", "no tensor", 0, pg._comm.barrier, True)
    if async_op:
        return work
    work.wait(limit)
    return None


# ----------------------------------------------------------------------------- not built
def _not_implemented(name: str, why: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"distributed.{name}: not implemented in tinygrad_attn ({why})")

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"torch.distributed.{name}: raises RuntimeError (not implemented)."
    return call


_OBJECTS = ("object collectives are not built: they pickle Python objects and unpickle what "
            "other ranks send, which runs their code; put the values in a tensor and use the "
            "tensor collectives")
_UNBUILT = {
    "monitored_barrier": "use barrier()",
    "all_gather_object": _OBJECTS, "broadcast_object_list": _OBJECTS,
    "gather_object": _OBJECTS, "scatter_object_list": _OBJECTS,
    "all_to_all": "the built collectives are all_reduce, broadcast, all_gather(_into_tensor), "
                  "reduce_scatter(_tensor), reduce and barrier",
    "all_to_all_single": "see all_to_all", "gather": "use all_gather",
    "scatter": "use broadcast", "send": "only collectives are built",
    "recv": "only collectives are built", "isend": "only collectives are built",
    "irecv": "only collectives are built", "batch_isend_irecv": "only collectives are built",
    "new_group": "only the default group (every rank) exists",
    "new_subgroups": "only the default group (every rank) exists",
    "init_device_mesh": "only the default group (every rank) exists",
}
globals().update({name: _not_implemented(name, why) for name, why in _UNBUILT.items()})
