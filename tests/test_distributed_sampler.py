"""ta.utils.data.DistributedSampler against torch's: the same index lists, lengths, sizes
and errors. Shuffling draws the engine's permutation for seed + epoch (not torch's), so the
shuffled rows compare against torch's sampler fed that same permutation."""

from __future__ import annotations

import itertools

import pytest

import tinygrad_attn as ta
import tinygrad_attn.distributed as ta_dist
from tinygrad_attn.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    TensorDataset,
)

LENGTHS = (0, 1, 7, 10, 11)
SEEDS = (0, 5)
EPOCHS = (0, 1, 2)


SHAPES = list(itertools.product(LENGTHS, range(1, 5), (False, True)))  # n, replicas, drop_last


def _grid():
    """(length, num_replicas, rank, drop_last) for every rank of 1..4 replicas."""
    for n, replicas, drop_last in SHAPES:
        for rank in range(replicas):
            yield n, replicas, rank, drop_last


def _engine_perm(n: int, seed: int) -> list:
    gen = ta.Generator()
    gen.manual_seed(seed)
    return ta.randperm(n, generator=gen).tolist()


def _state(sampler) -> tuple:
    return list(sampler), len(sampler), sampler.num_samples, sampler.total_size


# ----------------------------------------------------------------------------- without torch
def test_hand_checked_split_of_ten_over_three():
    # torch 2.13 gives these lists (checked when the test was written)
    padded = [list(DistributedSampler(range(10), 3, r, shuffle=False)) for r in range(3)]
    assert padded == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    dropped = [list(DistributedSampler(range(10), 3, r, shuffle=False, drop_last=True))
               for r in range(3)]
    assert dropped == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    s = DistributedSampler(range(10), 3, 1, shuffle=False)
    assert (len(s), s.num_samples, s.total_size) == (4, 4, 12)
    s = DistributedSampler(range(10), 3, 1, shuffle=False, drop_last=True)
    assert (len(s), s.num_samples, s.total_size) == (3, 3, 9)


def test_a_pad_longer_than_the_dataset_repeats_it_whole():
    # 1 item over 4 replicas pads [0] to [0, 0, 0, 0]; 2 items pad [0, 1] to [0, 1, 0, 1]
    assert [list(DistributedSampler(range(1), 4, r, shuffle=False)) for r in range(4)] == [
        [0], [0], [0], [0]]
    assert [list(DistributedSampler(range(2), 4, r, shuffle=False)) for r in range(4)] == [
        [0], [1], [0], [1]]
    # drop_last with fewer items than replicas leaves every rank empty
    s = DistributedSampler(range(3), 4, 2, shuffle=False, drop_last=True)
    assert (list(s), len(s), s.total_size) == ([], 0, 0)


@pytest.mark.parametrize("n, replicas, drop_last", SHAPES)
def test_ranks_cover_the_dataset(n, replicas, drop_last):
    for shuffle in (False, True):
        shares = [list(DistributedSampler(range(n), replicas, r, shuffle=shuffle, seed=5,
                                          drop_last=drop_last)) for r in range(replicas)]
        union = set().union(*shares)
        kept = n - n % replicas if drop_last else n
        assert len(union) == kept and union <= set(range(n))
        assert sum(map(len, shares)) == (kept if drop_last else -(-n // replicas) * replicas)
        if drop_last or n % replicas == 0:  # no padding: the shares are disjoint
            assert sorted(itertools.chain(*shares)) == sorted(union)


def test_shuffle_is_the_engine_permutation_for_seed_plus_epoch():
    s = DistributedSampler(range(11), num_replicas=2, rank=1, seed=5)
    assert s.epoch == 0
    assert list(s) == (_engine_perm(11, 5) + _engine_perm(11, 5)[:1])[1::2]
    assert list(s) == list(s)  # the order is fixed until the epoch changes
    s.set_epoch(2)
    assert s.epoch == 2
    assert list(s) == (_engine_perm(11, 7) + _engine_perm(11, 7)[:1])[1::2]
    # every rank shuffles with the one permutation, so the shares stay disjoint
    shares = [list(DistributedSampler(range(10), 2, r, seed=3)) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(10))


def test_with_a_dataloader_and_a_batch_sampler():
    data = TensorDataset(ta.arange(10) * 10)
    sampler = DistributedSampler(data, num_replicas=3, rank=1, shuffle=False)
    loader = DataLoader(data, batch_size=3, sampler=sampler)
    assert len(loader) == 2
    assert [b[0].tolist() for b in loader] == [[10, 40, 70], [0]]
    batches = BatchSampler(DistributedSampler(data, 3, 2, shuffle=False), 3, drop_last=False)
    assert list(batches) == [[2, 5, 8], [1]] and len(batches) == 2
    # shuffled, set_epoch before each epoch gives the next epoch's order
    sampler = DistributedSampler(data, num_replicas=2, rank=0, seed=1)
    loader = DataLoader(data, batch_size=5, sampler=sampler)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        (batch,) = [b[0].tolist() for b in loader]
        assert batch == [10 * i for i in _engine_perm(10, 1 + epoch)[0::2]]


def test_bad_rank_is_a_value_error():
    with pytest.raises(ValueError, match=r"^Invalid rank 3, rank should be in the interval "
                                         r"\[0, 2\]$"):
        DistributedSampler(range(5), num_replicas=3, rank=3)
    with pytest.raises(ValueError, match=r"^Invalid rank -1, rank should be in the interval "
                                         r"\[0, 2\]$"):
        DistributedSampler(range(5), num_replicas=3, rank=-1)


def test_replicas_and_rank_come_from_the_process_group(monkeypatch):
    monkeypatch.setattr(ta_dist, "is_available", lambda: True)
    monkeypatch.setattr(ta_dist, "get_world_size", lambda *a, **k: 4)
    monkeypatch.setattr(ta_dist, "get_rank", lambda *a, **k: 2)
    s = DistributedSampler(range(10), shuffle=False)
    assert (s.num_replicas, s.rank, list(s)) == (4, 2, [2, 6, 0])
    s = DistributedSampler(range(10), rank=0, shuffle=False)  # only the missing one asked
    assert (s.num_replicas, s.rank) == (4, 0)


def test_without_distributed_support_a_missing_rank_is_a_runtime_error(monkeypatch):
    monkeypatch.setattr(ta_dist, "is_available", lambda: False)
    for kwargs in ({}, {"rank": 0}, {"num_replicas": 2}):
        with pytest.raises(RuntimeError, match="^Requires distributed package to be available$"):
            DistributedSampler(range(5), **kwargs)


def test_without_a_process_group_a_missing_rank_raises():
    # unpatched: no process group is initialised in the test process, so whichever the
    # distributed package answers (no support, or no group), construction fails
    with pytest.raises((RuntimeError, ValueError)):
        DistributedSampler(range(5))


# ----------------------------------------------------------------------------- against torch
def test_unshuffled_grid_matches_torch():
    pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    for n, replicas, rank, drop_last in _grid():
        args = (range(n), replicas, rank)
        ours = DistributedSampler(*args, shuffle=False, drop_last=drop_last)
        theirs = TorchSampler(*args, shuffle=False, drop_last=drop_last)
        assert _state(ours) == _state(theirs), (n, replicas, rank, drop_last)


def test_shuffled_grid_matches_torch_given_the_same_permutation(monkeypatch):
    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    # torch's sampler seeds a torch.Generator with seed + epoch and calls torch.randperm;
    # answering that call with the engine's permutation for the same seed leaves only the
    # padding, dropping and split across ranks to compare
    def engine_randperm(n, generator):
        return torch.tensor(_engine_perm(n, generator.initial_seed()), dtype=torch.int64)

    monkeypatch.setattr(torch, "randperm", engine_randperm)
    for (n, replicas, rank, drop_last), seed in itertools.product(_grid(), SEEDS):
        ours = DistributedSampler(range(n), replicas, rank, seed=seed, drop_last=drop_last)
        theirs = TorchSampler(range(n), replicas, rank, seed=seed, drop_last=drop_last)
        for epoch in EPOCHS:
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert _state(ours) == _state(theirs), (n, replicas, rank, drop_last, seed, epoch)


def test_errors_match_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    for replicas, rank in ((3, 3), (3, -1), (1, 1), (0, 0)):
        with pytest.raises(ValueError) as theirs:
            TorchSampler(range(5), num_replicas=replicas, rank=rank)
        with pytest.raises(ValueError) as ours:
            DistributedSampler(range(5), num_replicas=replicas, rank=rank)
        assert str(ours.value) == str(theirs.value)
    # a build without distributed support, on both sides
    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    monkeypatch.setattr(ta_dist, "is_available", lambda: False)
    for kwargs in ({}, {"rank": 0}, {"num_replicas": 2}):
        with pytest.raises(RuntimeError) as theirs:
            TorchSampler(range(5), **kwargs)
        with pytest.raises(RuntimeError) as ours:
            DistributedSampler(range(5), **kwargs)
        assert str(ours.value) == str(theirs.value)
