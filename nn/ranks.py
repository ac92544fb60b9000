"""The trainer's data-parallel helpers: the world it runs in, the rows of the global batch
each rank trains on, the dropout seed of each rank, and small texts and numbers agreed over
ta.distributed (imported when first needed, so a one-process run never loads MPI).

Everything here is a collective where it talks to the other ranks: every rank calls it at
the same point of a step, in the same order.
"""

from __future__ import annotations

import tinygrad_attn as ta


def distributed():
    """ta.distributed, imported when first needed: a one-process run never loads it."""
    import tinygrad_attn.distributed as dist

    return dist


def world() -> tuple[int, int]:
    """(world size, rank) of the default process group; (1, 0) without one."""
    dist = distributed()
    if not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(), dist.get_rank()


def quiet(*args, **kwargs) -> None:
    """The log of ranks > 0: rank 0 speaks for the run."""


def check_data_parallel(cfg, world_size: int) -> None:
    if cfg.batch_size % world_size:
        raise ValueError(f"batch_size {cfg.batch_size} is the global batch and must be "
                         f"divisible by the world size {world_size} (each rank trains on "
                         f"batch_size / world_size rows): use a multiple of {world_size}, "
                         "or another number of ranks")
    if cfg.device != "cpu":
        raise ValueError(f"device {cfg.device!r}: data-parallel training moves gradients "
                         "with the MPI backend, which takes CPU tensors only; use device cpu")


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """The dropout seed of rank `rank` > 0: seed + rank when a run starts; a resume that has
    no saved stream for the rank (a run on fewer ranks) mixes in the step, so it does not
    replay the masks of the run's first steps."""
    return seed + rank + 1_000_003 * step


def mean_over_ranks(value: float) -> float:
    dist = distributed()
    t = ta.tensor([value], dtype=ta.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return float(t.item())


def text_tensor(data: bytes, length: int):
    padded = data + b"\0" * (length - len(data))
    return ta.tensor(list(padded), dtype=ta.uint8)


def gather_text(text: str) -> list[str]:
    """Every rank's `text`, in rank order, on every rank: an all_gather of the UTF-8 bytes
    padded with NULs to the longest (JSON text holds none)."""
    dist = distributed()
    data = text.encode()
    longest = ta.tensor([len(data)], dtype=ta.int64)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    n = max(int(longest.item()), 1)
    gathered = [ta.zeros(n, dtype=ta.uint8) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, text_tensor(data, n))
    return [bytes(t.tolist()).rstrip(b"\0").decode() for t in gathered]


def broadcast_text(text: str, src: int = 0) -> str:
    """Rank src's `text`, on every rank."""
    dist = distributed()
    data = text.encode() if dist.get_rank() == src else b""
    length = ta.tensor([len(data)], dtype=ta.int64)
    dist.broadcast(length, src=src)
    n = int(length.item())
    if n == 0:
        return ""
    buf = text_tensor(data, n) if dist.get_rank() == src else ta.zeros(n, dtype=ta.uint8)
    dist.broadcast(buf, src=src)
    return bytes(buf.tolist()).decode()
