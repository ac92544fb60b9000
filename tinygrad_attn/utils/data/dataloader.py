"""DataLoader, default_collate and default_convert, with torch.utils.data's semantics.

num_workers > 0 loads in this process, with torch's batches in torch's order: batch k of a
map-style dataset is fetched by "worker" k % num_workers, and an iterable dataset is read
by num_workers independent iterators taken in turn (each a copy of the stream, as torch's
worker processes are, unless the dataset splits itself with get_worker_info()). Each worker
has its own random state, seeded as torch seeds a worker process (the default generator
and Python's `random` with base_seed + worker_id, base_seed drawn from the loader's
generator), swapped in while it fetches, so get_worker_info(), worker_init_fn and random
draws inside a dataset behave as in a worker; the main process's streams are untouched.
Only the speed differs (one process does the loading); NumPy's global RNG is not seeded
per worker (torch seeds it too).
"""

from __future__ import annotations

import collections.abc
import random
from dataclasses import dataclass

import tinygrad_attn as ta

from ...creation import default_generator
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]

_COLLATE_ERROR = ("default_collate: batch must contain tensors, numpy arrays, numbers, "
                  "dicts or lists; found {}")


def _is_numpy(x) -> bool:
    return type(x).__module__ == "numpy"


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _remake(elem, items):
    """`items` in elem's container type where that type can be built from them, as torch."""
    try:
        return type(elem)(items)
    except TypeError:
        return items


def default_collate(batch):
    """A list of samples -> one batch: tensors stacked on a new first dim, NumPy arrays and
    numbers made tensors (a Python float is float64, an int int64, a bool bool), strings
    left as a list, and dicts, named tuples and sequences collated field by field (a
    tuple's fields come back as a list, as torch)."""
    elem = batch[0]
    if isinstance(elem, ta.Tensor):
        return ta.stack(list(batch), 0)
    if _is_numpy(elem):
        if getattr(elem, "dtype", None) is not None and elem.dtype.kind in "SaUO":
            raise TypeError(_COLLATE_ERROR.format(elem.dtype))
        if getattr(elem, "shape", ()) == ():
            return ta.stack([ta.tensor(b) for b in batch], 0)
        return default_collate([ta.tensor(b) for b in batch])
    if isinstance(elem, float):
        return ta.tensor(batch, dtype=ta.float64)
    if isinstance(elem, int):  # bool is an int: a list of bools becomes a bool tensor
        return ta.tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        collated = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(collated)
        except TypeError:
            return collated
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        if any(len(b) != len(elem) for b in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        fields = [default_collate(list(s)) for s in zip(*batch)]
        return fields if isinstance(elem, tuple) else _remake(elem, fields)
    raise TypeError(_COLLATE_ERROR.format(type(elem)))


def default_convert(data):
    """One sample as it is, NumPy arrays made tensors, containers converted item by item:
    the collate_fn of a DataLoader with batch_size=None."""
    if isinstance(data, ta.Tensor):
        return data
    if _is_numpy(data):
        kind = getattr(getattr(data, "dtype", None), "kind", "O")
        return data if kind in "SaUO" else ta.tensor(data)
    if isinstance(data, collections.abc.Mapping):
        converted = {k: default_convert(v) for k, v in data.items()}
        try:
            return type(data)(converted)
        except TypeError:
            return converted
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return _remake(data, [default_convert(d) for d in data])
    return data


# ----------------------------------------------------------------------------- workers
@dataclass(frozen=True)
class WorkerInfo:
    """What get_worker_info() returns inside a worker, as torch's."""

    id: int
    num_workers: int
    seed: int
    dataset: object


_current_worker: list = [None]


def get_worker_info() -> WorkerInfo | None:
    """The current worker's WorkerInfo while a DataLoader worker fetches, else None."""
    return _current_worker[0]


class _Worker:
    """One worker's random state, swapped in (and the main process's out) while it runs."""

    def __init__(self, info: WorkerInfo, init_fn) -> None:
        self.info = info
        self.rng = ta.Generator().manual_seed(info.seed).get_state()
        self.py_rng = random.Random(info.seed).getstate()
        self.iterator = None
        if init_fn is not None:
            self.run(init_fn, info.id)

    def run(self, fn, *args):
        main = default_generator.get_state(), random.getstate(), _current_worker[0]
        default_generator.set_state(self.rng)
        random.setstate(self.py_rng)
        _current_worker[0] = self.info
        try:
            return fn(*args)
        finally:
            self.rng, self.py_rng = default_generator.get_state(), random.getstate()
            default_generator.set_state(main[0])
            random.setstate(main[1])
            _current_worker[0] = main[2]


class _InfiniteConstantSampler(Sampler):
    """None forever: the index 'sampler' of an iterable dataset."""

    def __iter__(self):
        while True:
            yield None


# ----------------------------------------------------------------------------- loader
class DataLoader:
    """Batches of a dataset: torch.utils.data.DataLoader's arguments and checks.

    pin_memory, timeout, multiprocessing_context, prefetch_factor, pin_memory_device and
    in_order are accepted and checked as torch checks them; with one process loading they
    change nothing (see the module docstring for num_workers).
    """

    _FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
               "persistent_workers")

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers: int = 0, collate_fn=None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None,
                 persistent_workers: bool = False, pin_memory_device: str = "",
                 in_order: bool = True) -> None:
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 "
                             "to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in "
                             "multiprocessing.let num_workers > 0 to enable multiprocessing, "
                             "otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if multiprocessing_context is not None and num_workers == 0:
            raise ValueError("multiprocessing_context can only be used with multi-process "
                             "loading (num_workers > 0), but got num_workers=0")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        iterable = isinstance(dataset, IterableDataset)
        if iterable:
            if shuffle not in (False, None):
                raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                                 f"option, but got shuffle={shuffle}")
            for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
                if value is not None:
                    raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                     f"{name} option, but got {name}={value}")
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if sampler is None:
            if iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        if collate_fn is None:
            collate_fn = default_collate if batch_sampler is not None else default_convert
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.num_workers, self.collate_fn, self.generator = num_workers, collate_fn, generator
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.timeout, self.worker_init_fn = timeout, worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.prefetch_factor, self.persistent_workers = prefetch_factor, persistent_workers
        self.in_order = in_order
        self._iterable = iterable
        self._workers = None  # the persistent workers, once made
        self._initialized = True

    def __setattr__(self, name, value) -> None:
        if getattr(self, "_initialized", False) and name in self._FROZEN:
            raise ValueError(f"{name} attribute should not be set after "
                             f"{type(self).__name__} is initialized")
        super().__setattr__(name, value)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            length = len(self.dataset)
            if self.batch_size is not None:
                whole, part = divmod(length, self.batch_size)
                length = whole if self.drop_last or not part else whole + 1
            return length
        return len(self._index_sampler)

    def __iter__(self):
        # as torch's iterator: one int64 drawn from the loader's generator first (its
        # workers' base seed), then the sampler's draws as batches are asked for
        base_seed = int(ta.empty((), dtype=ta.int64).random_(generator=self.generator).item())
        workers = self._make_workers(base_seed)
        if self._iterable:
            return self._iter_stream(workers)
        return self._iter_map(workers)

    def _make_workers(self, base_seed: int) -> list:
        if self.num_workers == 0:
            return []
        if self.persistent_workers and self._workers is not None:
            return self._workers
        workers = [_Worker(WorkerInfo(w, self.num_workers, base_seed + w, self.dataset),
                           self.worker_init_fn) for w in range(self.num_workers)]
        if self.persistent_workers:
            object.__setattr__(self, "_workers", workers)
        return workers

    def _fetch(self, index):
        if not self._auto_collation:
            return self.collate_fn(self.dataset[index])
        many = getattr(self.dataset, "__getitems__", None)
        data = many(index) if callable(many) else [self.dataset[i] for i in index]
        return self.collate_fn(data)

    def _iter_map(self, workers):
        for k, index in enumerate(self._index_sampler):
            if workers:
                yield workers[k % len(workers)].run(self._fetch, index)
            else:
                yield self._fetch(index)

    def _next_of_stream(self, stream, index):
        """The next batch (or sample) of one stream, or raise StopIteration."""
        if not self._auto_collation:
            return self.collate_fn(next(stream))
        data = []
        for _ in index:
            try:
                data.append(next(stream))
            except StopIteration:
                break
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return self.collate_fn(data)

    def _iter_stream(self, workers):
        indices = iter(self._index_sampler)
        if not workers:
            stream = iter(self.dataset)
            while True:
                try:
                    yield self._next_of_stream(stream, next(indices))
                except StopIteration:
                    return
        active = list(workers)
        for w in active:  # each worker iterates its own copy of the stream
            w.iterator = w.run(iter, self.dataset)
        k = 0
        while active:
            w = active[k % len(active)]
            try:
                batch = w.run(self._next_of_stream, w.iterator, next(indices))
            except StopIteration:
                active.remove(w)
                continue
            k += 1
            yield batch
