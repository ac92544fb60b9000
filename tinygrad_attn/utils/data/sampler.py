"""Samplers as torch.utils.data has them: iterables of dataset indices (or, for
BatchSampler, of lists of them), drawing from a ta.Generator where they shuffle."""

from __future__ import annotations

import math

import tinygrad_attn as ta

from ...creation import Generator, randint, randperm

__all__ = ["BatchSampler", "DistributedSampler", "RandomSampler", "Sampler", "SequentialSampler",
           "SubsetRandomSampler", "WeightedRandomSampler"]


class Sampler:
    """The base class: subclasses define __iter__ (and __len__ where they know it)."""

    def __init__(self, data_source=None) -> None:
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


def _check_bool(name: str, value, error=TypeError) -> None:
    if not isinstance(value, bool):
        raise error(f"{name} should be a boolean value, but got {name}={value}")


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value}")


def _own_generator():
    """A generator seeded from the default one, as torch's samplers make when given none:
    one int64 draw moves the default stream, so manual_seed fixes the order."""
    seed = int(ta.empty((), dtype=ta.int64).random_().item())
    return Generator().manual_seed(seed)


class RandomSampler(Sampler):
    """A random permutation of the indices (num_samples of them: whole permutations, then
    part of one), or num_samples indices drawn with replacement."""

    def __init__(self, data_source, replacement: bool = False, num_samples=None,
                 generator=None) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        _check_bool("replacement", replacement)
        _check_positive("num_samples", self.num_samples)

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        gen = self.generator if self.generator is not None else _own_generator()
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield from randint(high=n, size=(32,), generator=gen).tolist()
            yield from randint(high=n, size=(self.num_samples % 32,), generator=gen).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from randperm(n, generator=gen).tolist()
        yield from randperm(n, generator=gen).tolist()[:self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order."""

    def __init__(self, indices, generator=None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self):
        for i in randperm(len(self.indices), generator=self.generator).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """num_samples indices in [0, len(weights)), index i with probability proportional to
    weights[i] (ta.multinomial)."""

    def __init__(self, weights, num_samples: int, replacement: bool = True,
                 generator=None) -> None:
        _check_positive("num_samples", num_samples)
        _check_bool("replacement", replacement)
        weights = ta.tensor(weights.tolist() if isinstance(weights, ta.Tensor) else weights,
                            dtype=ta.float64)
        if weights.ndim != 1:
            raise ValueError("weights should be a 1d sequence but given weights have shape "
                             f"{tuple(weights.shape)}")
        self.weights = weights
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self):
        drawn = ta.multinomial(self.weights, self.num_samples, self.replacement,
                               generator=self.generator)
        yield from drawn.tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of batch_size indices from `sampler` (the last one shorter, or dropped)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool) -> None:
        _check_positive("batch_size", batch_size)
        _check_bool("drop_last", drop_last, ValueError)
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        batch = []
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


def _from_process_group(name: str) -> int:
    """The world size or rank of the initialised process group, for an argument left None.
    Without distributed support this is torch's RuntimeError; with it, an uninitialised
    group is the distributed package's own error (torch's get_world_size raises it too)."""
    from ... import distributed as dist

    if not dist.is_available():
        raise RuntimeError("Requires distributed package to be available")
    return dist.get_world_size() if name == "num_replicas" else dist.get_rank()


class DistributedSampler(Sampler):
    """This process's share of the indices when num_replicas processes each load a part of
    one dataset: the index list (shuffled with a generator seeded seed + epoch, the same on
    every rank) is made a multiple of num_replicas long, by repeating its start or, with
    drop_last, by cutting its tail, and rank r takes positions r, r + num_replicas, ...

    Call set_epoch(epoch) before each epoch, or every epoch repeats one order. The order for
    a seed is the engine's (ta.randperm), not torch's: see the package docstring."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None:
            num_replicas = _from_process_group("num_replicas")
        if rank is None:
            rank = _from_process_group("rank")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            # the largest multiple of num_replicas not above n, per replica (torch's formula)
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            gen = Generator()
            gen.manual_seed(self.seed + self.epoch)
            indices = randperm(n, generator=gen).tolist()
        else:
            indices = list(range(n))
        if self.drop_last:
            indices = indices[:self.total_size]
        else:
            pad = self.total_size - n
            # a pad longer than the list (more replicas than items) repeats it whole
            indices += (indices * math.ceil(pad / n))[:pad] if pad > n else indices[:pad]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch that, added to seed, seeds the next shuffle."""
        self.epoch = epoch
