"""MPI through mpi4py: the one module of the project that imports it.

A thin layer over NumPy arrays. `Communicator` wraps MPI.COMM_WORLD and runs each collective
on the arrays it is given, in place where MPI allows it (MPI.IN_PLACE), so a tensor's memory
goes to MPI with no copy. The distributed package above checks tensors, shapes and the
order of calls; this module knows datatypes and reduction operators.

mpi4py is imported lazily. `import mpi4py` alone is cheap and starts nothing; `import
mpi4py.MPI` loads libmpi and calls MPI_Init_thread, so only `init()` (called by
init_process_group) does it, asking for MPI_THREAD_MULTIPLE: the collectives run on a
worker thread while the main thread may call MPI too (MPI_Abort after a timeout).
"""

from __future__ import annotations

import sys

import numpy as np

_MPI = None  # the mpi4py.MPI module, once init() ran

# reduction names (ReduceOp's lower-case names) -> the MPI operator's attribute name
_OPS = {"sum": "SUM", "avg": "SUM", "product": "PROD", "min": "MIN", "max": "MAX",
        "band": "BAND", "bor": "BOR", "bxor": "BXOR"}
# MPI defines only the logical operators on C_BOOL; torch's SUM/MAX of bools is "any" and
# PRODUCT/MIN "all", which are these
_BOOL_OPS = {"sum": "LOR", "max": "LOR", "bor": "LOR", "product": "LAND", "min": "LAND",
             "band": "LAND", "bxor": "LXOR"}
_DATATYPES = {  # numpy dtype name -> MPI datatype attribute
    "bool": "C_BOOL", "int8": "INT8_T", "int16": "INT16_T", "int32": "INT32_T",
    "int64": "INT64_T", "uint8": "UINT8_T", "uint16": "UINT16_T", "uint32": "UINT32_T",
    "uint64": "UINT64_T", "float32": "FLOAT", "float64": "DOUBLE",
    "complex64": "C_FLOAT_COMPLEX", "complex128": "C_DOUBLE_COMPLEX",
}


def available() -> bool:
    """True if mpi4py can be imported; MPI itself is not started."""
    try:
        import mpi4py  # noqa: F401 - the package only: mpi4py.MPI would initialise MPI
    except ImportError:
        return False
    return True


def initialized() -> bool:
    """True once MPI was initialised in this process (by init() or by the user's script)."""
    return _MPI is not None


def init() -> Communicator:
    """Start MPI with MPI_THREAD_MULTIPLE (once per process) and wrap COMM_WORLD."""
    global _MPI
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:  # the script did not start MPI itself
        mpi4py.rc.threads = True
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    if MPI.Is_finalized():
        raise RuntimeError("MPI was already finalized in this process; it cannot start again")
    if not MPI.Is_initialized():  # mpi4py.rc.initialize was set to False by the script
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            "MPI was initialised without MPI_THREAD_MULTIPLE (thread level "
            f"{MPI.Query_thread()}); the collectives run on a worker thread and need it. "
            "If the script imports mpi4py.MPI itself, set mpi4py.rc.thread_level = "
            "'multiple' before that import, or use an MPI built with thread support")
    _MPI = MPI
    return Communicator(MPI.COMM_WORLD)


def datatype(dtype, op: str):
    """The MPI datatype of a NumPy dtype; TypeError naming the op for one MPI lacks."""
    name = np.dtype(dtype).name
    attr = _DATATYPES.get(name)
    if attr is None:
        hint = (" (MPI has no standard 16-bit float; cast to float32 for the collective)"
                if name in ("float16", "bfloat16") else "")
        raise TypeError(f"{op}: the MPI backend does not support dtype {name}{hint}")
    return getattr(_MPI, attr)


def check_reduction(reduce_op: str, dtype, op: str) -> None:
    """Refuse, as torch does, a reduction its dtype does not define."""
    kind = np.dtype(dtype).kind
    name = np.dtype(dtype).name
    if reduce_op in ("band", "bor", "bxor") and kind in "fc":
        raise RuntimeError(f"{op}: Cannot use ReduceOp.{reduce_op.upper()} with non-integral "
                           f"dtype ({name})")
    if reduce_op in ("min", "max") and kind == "c":
        raise ValueError(f"{op} does not support RedOpType.{reduce_op.upper()} on complex "
                         "tensors")
    if reduce_op == "avg" and kind not in "fc":
        raise RuntimeError(f"{op}: ReduceOp.AVG on a tensor of dtype {name}: result type "
                           f"Float can't be cast to the desired output type {name}; AVG "
                           "divides by the world size, so it needs a floating tensor")


def _reduction(reduce_op: str, dtype):
    table = _BOOL_OPS if np.dtype(dtype).kind == "b" else _OPS
    return getattr(_MPI, table[reduce_op])


class Communicator:
    """MPI.COMM_WORLD: rank, size, local rank, and the collectives on NumPy arrays."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        node = comm.Split_type(_MPI.COMM_TYPE_SHARED, key=self.rank)  # the ranks on this host
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        node.Free()
        self.host = _MPI.Get_processor_name()

    # ------------------------------------------------------------------ collectives
    def allreduce(self, arr, reduce_op: str, op: str = "all_reduce") -> None:
        """arr <- reduction of every rank's arr, in place."""
        self.comm.Allreduce(_MPI.IN_PLACE, [arr, datatype(arr.dtype, op)],
                            op=_reduction(reduce_op, arr.dtype))
        if reduce_op == "avg":
            np.divide(arr, self.size, out=arr)

    def reduce(self, arr, root: int, reduce_op: str, op: str = "reduce") -> None:
        """On root, arr <- reduction of every rank's arr, in place; elsewhere arr is read."""
        spec = [arr, datatype(arr.dtype, op)]
        red = _reduction(reduce_op, arr.dtype)
        if self.rank == root:
            self.comm.Reduce(_MPI.IN_PLACE, spec, op=red, root=root)
            if reduce_op == "avg":
                np.divide(arr, self.size, out=arr)
        else:
            self.comm.Reduce(spec, None, op=red, root=root)

    def bcast(self, arr, root: int, op: str = "broadcast") -> None:
        """arr <- root's arr, in place."""
        self.comm.Bcast([arr, datatype(arr.dtype, op)], root=root)

    def allgather(self, send, recv, op: str = "all_gather_into_tensor") -> None:
        """recv (size x send's elements, contiguous) <- every rank's send, in rank order;
        send None: this rank's block of recv already holds it (MPI_IN_PLACE)."""
        mpi_type = datatype(recv.dtype, op)
        source = _MPI.IN_PLACE if send is None else [send, mpi_type]
        self.comm.Allgather(source, [recv, mpi_type])

    def allgather_list(self, send, recvs, op: str = "all_gather") -> None:
        """recvs[r] <- rank r's send. MPI gathers into one buffer, copied out to each."""
        gathered = np.empty((self.size, send.size), dtype=send.dtype)
        self.allgather(send, gathered, op)
        for r, out in enumerate(recvs):
            out.reshape(-1)[...] = gathered[r]  # out is contiguous: reshape is a view

    def reduce_scatter(self, send, recv, reduce_op: str, op: str = "reduce_scatter") -> None:
        """recv <- block `rank` of the reduction of every rank's send (size blocks of
        recv's elements). `send` may be a list of size arrays, packed into one buffer."""
        if isinstance(send, (list, tuple)):
            send = np.concatenate([a.reshape(-1) for a in send])
        mpi_type = datatype(recv.dtype, op)
        self.comm.Reduce_scatter_block([send, mpi_type], [recv, mpi_type],
                                       op=_reduction(reduce_op, recv.dtype))
        if reduce_op == "avg":
            np.divide(recv, self.size, out=recv)

    def barrier(self) -> None:
        self.comm.Barrier()

    def allgather_object(self, obj) -> list:
        """Every rank's small Python value (used once at start: pids and host names)."""
        return self.comm.allgather(obj)

    def abort(self, code: int = 1) -> None:
        """End every process of the job (MPI_Abort): nothing waits in MPI_Finalize."""
        self.comm.Abort(code)
