"""Work and the worker thread: every collective of a process runs on one thread, in the order
it was issued.

MPI requires every rank to call the collectives of a communicator in the same order. The
simplest way to keep that order while letting a caller overlap compute with communication
is the one of torch's MPI process group: one worker thread per process takes the queued
collectives one at a time; a synchronous call is an enqueue followed by `wait()`. mpi4py
releases the GIL inside each MPI call, so the caller's thread keeps running while the worker
waits in MPI.

A Work is one queued collective. It records when it was issued, started and finished
(time.perf_counter()) and how many bytes it moves, for timelines. An exception raised in the
worker is kept and raised again by `wait()`. A blocked MPI call cannot be cancelled, so a
`wait()` that runs past its timeout raises and marks the group broken: later collectives
refuse at once, and the process aborts the MPI job when it exits instead of hanging in
MPI_Finalize.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time


def seconds(timeout, what: str) -> float | None:
    """A timeout given as a timedelta or a number of seconds, in seconds (None: none)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout)
    raise TypeError(f"{what}: expected timeout argument to be of type datetime.timedelta, "
                    f"got {timeout!r}")


class Work:
    """One collective issued to the worker: torch's Work (wait, is_completed, is_success,
    exception) plus the times and size the data-parallel timeline reads."""

    def __init__(self, op: str, describe: str, nbytes: int, run, group) -> None:
        self.op = op  # "all_reduce", "broadcast", ...
        self.describe = describe  # "tensor of shape (4, 3), float32", for messages
        self.nbytes = nbytes  # bytes this rank sends
        self.t_issued = time.perf_counter()
        self.t_started: float | None = None
        self.t_finished: float | None = None
        self._run = run
        self._group = group
        self._done = threading.Event()
        self._exception: BaseException | None = None

    def _execute(self) -> None:
        self.t_started = time.perf_counter()
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - handed to wait(), on the caller's thread
            self._exception = e
        finally:
            self._run = None
            self.t_finished = time.perf_counter()
            self._done.set()

    def wait(self, timeout=None) -> bool:
        """Block until the collective finished (True), raise what it raised, or raise a
        RuntimeError after `timeout` (a timedelta or seconds; default: the group's)."""
        limit = seconds(timeout, "wait")
        if limit is None:
            limit = self._group.timeout_s
        if not self._done.wait(limit):
            raise self._group._timed_out(self, limit)
        if self._exception is not None:
            raise self._exception
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exception is None

    def exception(self) -> BaseException | None:
        return self._exception

    def __repr__(self) -> str:
        state = ("failed" if self._exception is not None else "completed"
                 if self._done.is_set() else "pending")
        return f"<Work {self.op} ({self.describe}), {state}>"


class Worker:
    """The daemon thread that runs queued Work in order; stop() drains the queue first."""

    def __init__(self, rank: int) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.last: Work | None = None  # the most recently issued Work
        self._thread = threading.Thread(target=self._loop, name=f"ta.distributed rank {rank}",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            work._execute()

    def submit(self, work: Work) -> Work:
        self.last = work
        self._queue.put(work)
        return work

    def stop(self) -> None:
        """Ask the thread to end after the queued work (it ends once that has run)."""
        self._queue.put(None)
        self._thread.join(timeout=1.0)
