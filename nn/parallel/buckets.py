"""DistributedDataParallel's gradient buckets: which parameters share one all-reduce, the
flat buffer each bucket reduces, and the record of when each bucket's all-reduce ran.

A bucket is one contiguous tensor (tagged "bucket" in the memory ledger) holding the
gradients of a run of parameters of one dtype, laid out back to back. Parameters are taken
in reverse registration order, the order a model's gradients usually become ready in
backward (the last layer's first); the first bucket closes at 1 MiB, so that the first
all-reduce starts early, the others at `bucket_cap_mb` (25 MiB). A bucket closes once it
holds at least its cap (a parameter larger than the cap gets a bucket of its own). Every
rank computes the same assignment from the same model, so every rank issues the same
all-reduces in the same order.
"""

from __future__ import annotations

import time

import tinygrad_attn as ta

FIRST_BUCKET_BYTES = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25


def assign(params: list, first_cap: int, cap: int) -> list:
    """Indices into `params`, one list per bucket, in the order the buckets are reduced:
    `params` walked from the last to the first, split by dtype, each open bucket closed
    once its bytes reach its cap (the first bucket of every dtype `first_cap`)."""
    open_: dict = {}  # dtype -> (indices, bytes)
    caps: dict = {}  # dtype -> the cap of its open bucket
    closed: list = []
    for i in reversed(range(len(params))):
        p = params[i]
        key = p.dtype
        indices, size = open_.get(key, ([], 0))
        indices.append(i)
        size += p.numel() * p.element_size()
        limit = caps.setdefault(key, first_cap)
        if size >= limit:
            closed.append(indices)
            open_.pop(key, None)
            caps[key] = cap
        else:
            open_[key] = (indices, size)
    closed.extend(indices for indices, _ in open_.values())
    # the order of closing (a bucket closes when its last parameter is added) is the order
    # in which a backward that follows reverse registration order finds each one full
    return closed


class Bucket:
    """One flat gradient buffer and the parameters whose gradients it holds."""

    def __init__(self, index: int, params: list, names: list):
        self.index = index
        self.params = params
        self.names = names
        self.numel = sum(p.numel() for p in params)
        self.nbytes = self.numel * params[0].element_size()
        with ta.no_grad():
            self.buffer = ta.zeros(self.numel, dtype=params[0].dtype, device=params[0].device)
        ta.memory.tag(self.buffer, "bucket")
        self.views = []  # a view of the buffer shaped like each parameter
        offset = 0
        for p in params:
            n = p.numel()
            self.views.append(self.buffer[offset:offset + n].view(p.shape))
            offset += n
        self.pending = len(params)
        self.work = None
        self.issued = None  # perf_counter when its all-reduce was issued

    def reset(self) -> None:
        self.pending = len(self.params)
        self.work = None
        self.issued = None


class CommRecord:
    """When one backward's all-reduces ran, relative to the backward they overlap with.

    Times are time.perf_counter() seconds. `backward_start`: the model's output received its
    gradient; `backward_end`: the engine had handed every gradient on (DDP's end-of-backward
    callback began). Each bucket: the bytes it reduced, when it was issued (its last
    gradient became ready), started and finished on the communication thread. `hidden`: the
    share of all-reduce time that ran before backward ended (overlapped with compute)."""

    def __init__(self, step: int):
        self.step = step
        self.backward_start = None
        self.backward_end = None
        self.waited = None  # when the callback had waited for the last all-reduce
        self.buckets: list = []

    def add(self, bucket: Bucket) -> None:
        w = bucket.work
        self.buckets.append({
            "bucket": bucket.index, "bytes": bucket.nbytes, "params": len(bucket.params),
            "issued": bucket.issued, "started": getattr(w, "t_started", None),
            "finished": getattr(w, "t_finished", None)})

    @property
    def comm_seconds(self) -> float:
        return sum(b["finished"] - b["started"] for b in self.buckets
                   if b["started"] is not None and b["finished"] is not None)

    @property
    def hidden_seconds(self) -> float:
        """All-reduce time spent before backward ended."""
        end = self.backward_end
        if end is None:
            return 0.0
        return sum(max(0.0, min(b["finished"], end) - b["started"]) for b in self.buckets
                   if b["started"] is not None and b["finished"] is not None)

    @property
    def hidden(self) -> float:
        total = self.comm_seconds
        return self.hidden_seconds / total if total > 0 else 0.0

    def as_dict(self) -> dict:
        return {"step": self.step, "backward_start": self.backward_start,
                "backward_end": self.backward_end, "waited": self.waited,
                "buckets": list(self.buckets), "comm_seconds": self.comm_seconds,
                "hidden_seconds": self.hidden_seconds, "hidden": self.hidden}

    def __str__(self) -> str:
        t0 = self.backward_start if self.backward_start is not None else (
            min((b["issued"] for b in self.buckets if b["issued"]), default=time.perf_counter()))

        def ms(t):
            return "-" if t is None else f"{(t - t0) * 1e3:8.2f}"

        end = ms(self.backward_end)
        lines = [f"DDP step {self.step}: times in ms from the start of backward "
                 f"(backward ended at {end.strip()} ms)",
                 " bucket      bytes  params   issued  started finished"]
        for b in self.buckets:
            lines.append(f" {b['bucket']:>6} {b['bytes']:>10} {b['params']:>7} "
                         f"{ms(b['issued'])} {ms(b['started'])} {ms(b['finished'])}")
        lines.append(f" all-reduce {self.comm_seconds * 1e3:.2f} ms, of which "
                     f"{self.hidden_seconds * 1e3:.2f} ms ({self.hidden:.0%}) before backward "
                     "ended")
        return "\n".join(lines)
