"""ta.utils.data against torch.utils.data: the same batches for sequential sampling, the
same collated structure (types, dtypes, shapes, values), the same lengths and the same
argument errors; shuffled orders are permutations, reproducible under a seeded
ta.Generator (the numbers differ from torch's for a seed: the engine's stream is its own)."""

from __future__ import annotations

import collections
import random

import numpy as np
import pytest

import tinygrad_attn as ta
import tinygrad_attn.utils.data as tdata

Point = collections.namedtuple("Point", "x y")


def _plain(obj):
    """A comparable form of a batch: tensors as (dtype, shape, values), containers kept."""
    if hasattr(obj, "dtype") and hasattr(obj, "shape") and hasattr(obj, "tolist"):
        name = getattr(obj.dtype, "name", None) or str(obj.dtype).removeprefix("torch.")
        if type(obj).__module__ == "numpy":
            return ("ndarray", str(obj.dtype), tuple(obj.shape), obj.tolist())
        return ("tensor", name, tuple(obj.shape), obj.tolist())
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if _is_namedtuple(obj):
        return (type(obj).__name__, tuple(_plain(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [_plain(v) for v in obj])
    return obj


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _both(torch):
    return ((ta, tdata), (torch, torch.utils.data))


def _tensor_dataset(lib, data, n=10):
    return data.TensorDataset(lib.arange(2 * n, dtype=lib.float32).reshape(n, 2),
                              lib.arange(n))


@pytest.mark.parametrize(("batch_size", "drop_last"), [(1, False), (3, False), (3, True),
                                                       (5, True), (12, False), (12, True)])
def test_sequential_batches_are_torchs(batch_size, drop_last):
    torch = pytest.importorskip("torch")
    got = []
    for lib, data in _both(torch):
        loader = data.DataLoader(_tensor_dataset(lib, data), batch_size=batch_size,
                                 drop_last=drop_last)
        got.append((len(loader), [_plain(b) for b in loader]))
    assert got[0] == got[1]


class Records:
    """A map-style dataset (duck-typed, as torch allows) of mixed Python samples."""

    def __init__(self, lib, n=5):
        self.lib, self.n = lib, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": self.lib.full((2,), float(i)), "id": i, "w": i / 2, "ok": i % 2 == 0,
                "name": f"s{i}", "pair": (i, [i * 1.5, np.float32(i)]),
                "pt": Point(i, np.arange(3) + i), "arr": np.full((2, 2), i, dtype=np.int32)}


def test_default_collate_structure_is_torchs():
    torch = pytest.importorskip("torch")
    got = [[_plain(b) for b in data.DataLoader(Records(lib), batch_size=2)]
           for lib, data in _both(torch)]
    assert got[0] == got[1]
    first = got[0][0]
    assert first["w"][1] == "float64" and first["id"][1] == "int64" and first["ok"][1] == "bool"
    assert first["name"] == ("list", ["s0", "s1"])


def test_batch_size_none_converts_samples_as_torch():
    torch = pytest.importorskip("torch")
    got = [[_plain(b) for b in data.DataLoader(Records(lib), batch_size=None)]
           for lib, data in _both(torch)]
    assert got[0] == got[1]
    sample = (np.ones(2), [np.zeros(1, dtype=np.float32)], "s", Point(1, np.int64(2)))
    assert _plain(tdata.default_convert(sample)) == _plain(
        torch.utils.data.default_convert(sample))


def test_collate_errors_are_torchs():
    torch = pytest.importorskip("torch")
    for lib, data in _both(torch):
        with pytest.raises(RuntimeError):
            data.default_collate([[1, 2], [1]])
        with pytest.raises(TypeError):
            data.default_collate([object(), object()])
        with pytest.raises(RuntimeError):
            data.default_collate([lib.zeros(2), lib.zeros(3)])


def test_len_is_torchs():
    torch = pytest.importorskip("torch")
    for n, bs, drop in [(10, 3, False), (10, 3, True), (9, 3, True), (1, 4, False)]:
        lens = [len(data.DataLoader(_tensor_dataset(lib, data, n), batch_size=bs,
                                    drop_last=drop)) for lib, data in _both(torch)]
        assert lens[0] == lens[1]


def _bad_loader_args(data, ds):
    sampler = data.SequentialSampler(ds)
    batches = data.BatchSampler(sampler, 2, False)
    return [dict(sampler=sampler, shuffle=True), dict(batch_sampler=batches, batch_size=2),
            dict(batch_sampler=batches, shuffle=True), dict(batch_sampler=batches,
                                                            drop_last=True),
            dict(batch_size=None, drop_last=True), dict(num_workers=-1), dict(timeout=-1),
            dict(prefetch_factor=2), dict(persistent_workers=True),
            dict(multiprocessing_context="fork")]


def test_loader_argument_errors_are_torchs():
    torch = pytest.importorskip("torch")
    for lib, data in _both(torch):
        ds = _tensor_dataset(lib, data)
        for kwargs in _bad_loader_args(data, ds):
            with pytest.raises(ValueError):
                data.DataLoader(ds, **kwargs)
        loader = data.DataLoader(ds, batch_size=2)
        with pytest.raises(ValueError):
            loader.batch_size = 3
        for bad in (dict(batch_size=0), dict(batch_size=True), dict(drop_last=1)):
            with pytest.raises(ValueError):
                data.BatchSampler(range(3), **{"batch_size": 2, "drop_last": False, **bad})
        with pytest.raises(TypeError):
            data.RandomSampler(ds, replacement=1)
        with pytest.raises(ValueError):
            data.RandomSampler(ds, num_samples=0)
        with pytest.raises(ValueError):
            data.WeightedRandomSampler([[1.0, 2.0]], 2)


def test_batch_sampler_drives_the_loader():
    torch = pytest.importorskip("torch")
    got = []
    for lib, data in _both(torch):
        ds = _tensor_dataset(lib, data)
        loader = data.DataLoader(ds, batch_sampler=[[3, 1], [0], [9, 8, 7]])
        got.append([_plain(b) for b in loader])
    assert got[0] == got[1]


# ----------------------------------------------------------------------------- shuffling
def _order(loader):
    return [i for _, idx in loader for i in idx.tolist()]


def test_shuffle_is_a_permutation_reproducible_under_a_generator():
    ds = _tensor_dataset(ta, tdata, 20)

    def order(seed):
        return _order(tdata.DataLoader(ds, batch_size=6, shuffle=True,
                                       generator=ta.Generator().manual_seed(seed)))

    assert sorted(order(0)) == list(range(20))
    assert order(0) == order(0) and order(0) != order(1)
    loader = tdata.DataLoader(ds, batch_size=6, shuffle=True)
    ta.manual_seed(5)
    first = _order(loader)
    assert _order(loader) != first  # each epoch a new order ...
    ta.manual_seed(5)
    assert _order(loader) == first  # ... fixed by the default generator's seed


def test_random_sampler_with_replacement_and_num_samples():
    gen = ta.Generator().manual_seed(3)
    drawn = list(tdata.RandomSampler(range(4), replacement=True, num_samples=70, generator=gen))
    assert len(drawn) == 70 and set(drawn) <= {0, 1, 2, 3} and len(set(drawn)) == 4
    longer = list(tdata.RandomSampler(range(4), num_samples=10, generator=gen))
    assert sorted(longer[:4]) == sorted(longer[4:8]) == [0, 1, 2, 3] and len(longer) == 10
    assert len(tdata.RandomSampler(range(4), num_samples=10)) == 10
    sub = list(tdata.SubsetRandomSampler([10, 20, 30], generator=gen))
    assert sorted(sub) == [10, 20, 30]


def test_weighted_random_sampler_follows_the_weights():
    weights = [1.0, 0.0, 3.0]
    drawn = list(tdata.WeightedRandomSampler(weights, 8000,
                                             generator=ta.Generator().manual_seed(4)))
    counts = [drawn.count(i) for i in range(3)]
    assert counts[1] == 0 and abs(counts[2] / counts[0] - 3.0) < 0.3
    once = list(tdata.WeightedRandomSampler([1.0, 1.0, 1.0], 3, replacement=False))
    assert sorted(once) == [0, 1, 2]


@pytest.mark.parametrize(("n", "lengths"), [(10, [3, 7]), (10, [0.3, 0.7]),
                                            (10, [0.33, 0.33, 0.34]), (7, [0.5, 0.5]),
                                            (11, [0.2, 0.2, 0.2, 0.2, 0.2]), (5, [1.0])])
def test_random_split_lengths_are_torchs_and_cover_the_dataset(n, lengths):
    torch = pytest.importorskip("torch")
    ours = tdata.random_split(range(n), lengths, generator=ta.Generator().manual_seed(0))
    theirs = torch.utils.data.random_split(range(n), lengths)
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert sorted(i for s in ours for i in s) == list(range(n))
    again = tdata.random_split(range(n), lengths, generator=ta.Generator().manual_seed(0))
    assert [list(s) for s in again] == [list(s) for s in ours]


def test_random_split_errors_are_torchs():
    torch = pytest.importorskip("torch")
    for data in (tdata, torch.utils.data):
        with pytest.raises(ValueError):
            data.random_split(range(10), [3, 3])
        with pytest.raises(ValueError):
            data.random_split(range(10), [1.5, -0.5])


# ----------------------------------------------------------------------------- datasets
def test_composed_datasets_index_as_torchs():
    torch = pytest.importorskip("torch")
    got = []
    for lib, data in _both(torch):
        a, b = _tensor_dataset(lib, data, 4), _tensor_dataset(lib, data, 3)
        cat = data.ConcatDataset([a, b])
        sub = data.Subset(cat, [6, 0, 4])
        stack = data.StackDataset(first=a, second=a)
        summed = a + b
        got.append([len(cat), _plain(cat[5]), _plain(cat[-1]), len(sub), _plain(sub[0]),
                    _plain(stack[1]), len(summed), _plain(summed[4]),
                    _plain(next(iter(data.DataLoader(sub, batch_size=3))))])
        with pytest.raises(ValueError):
            cat[-8]
        with pytest.raises(AssertionError):
            data.TensorDataset(lib.zeros(3), lib.zeros(4))
        with pytest.raises(ValueError):
            data.StackDataset(a, b)
    assert got[0] == got[1]


class _StreamBase:
    """An iterable dataset of range(n); with workers, each takes every num_workers-th item
    if `split` (the sharding torch's docs show), else each streams all of it."""

    def __init__(self, data, n, split=False):
        self.worker_info, self.n, self.split = data.get_worker_info, n, split

    def __iter__(self):
        info = self.worker_info()
        start, step = (info.id, info.num_workers) if info and self.split else (0, 1)
        return iter(range(start, self.n, step))

    def __len__(self):
        return self.n


def Stream(data, n, split=False):  # noqa: N802 - reads as the class it makes
    """A _StreamBase that is an IterableDataset of `data` (the engine's or torch's)."""
    cls = type("Stream", (_StreamBase, data.IterableDataset), {})
    return cls(data, n, split)


@pytest.mark.parametrize("kwargs", [dict(batch_size=3), dict(batch_size=3, drop_last=True),
                                    dict(batch_size=None)])
def test_iterable_datasets_batch_as_torchs(kwargs):
    torch = pytest.importorskip("torch")
    got = []
    for _, data in _both(torch):
        loader = data.DataLoader(Stream(data, 8), **kwargs)
        got.append((len(loader), [_plain(b) for b in loader]))
        with pytest.raises(ValueError):
            data.DataLoader(Stream(data, 8), shuffle=True)
    assert got[0] == got[1]


@pytest.mark.parametrize("split", [False, True])
def test_workers_give_torchs_batches_in_torchs_order(split):
    """torch runs two worker processes here; the engine loads in-process, the same batches."""
    torch = pytest.importorskip("torch")
    got = []
    for lib, data in _both(torch):
        stream = data.DataLoader(Stream(data, 11, split), batch_size=2, num_workers=2)
        mapped = data.DataLoader(_tensor_dataset(lib, data, 7), batch_size=2, num_workers=2)
        got.append(([_plain(b) for b in stream], [_plain(b) for b in mapped]))
    assert got[0] == got[1]


class Seeds(tdata.Dataset):
    """Each sample is what the worker's random streams give (augmentation-style)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = tdata.get_worker_info()
        return {"worker": info.id, "seed": info.seed, "py": random.random(),
                "ta": ta.rand(1).item()}


def test_each_worker_has_torchs_seed_and_its_own_streams():
    ids = []
    loader = tdata.DataLoader(Seeds(), batch_size=None, num_workers=2,
                              worker_init_fn=ids.append,
                              generator=ta.Generator().manual_seed(9))
    ta.manual_seed(1)
    main_next = ta.rand(1).item()
    ta.manual_seed(1)
    samples = list(loader)
    assert ta.rand(1).item() == main_next  # the main process's stream did not move
    assert tdata.get_worker_info() is None and ids == [0, 1]
    assert [s["worker"] for s in samples] == [0, 1, 0, 1]
    base = samples[0]["seed"]
    assert samples[1]["seed"] == base + 1
    py = random.Random(base)
    assert [samples[0]["py"], samples[2]["py"]] == [py.random(), py.random()]
    assert samples[0]["ta"] == ta.rand(1, generator=ta.Generator().manual_seed(base)).item()
    again = list(tdata.DataLoader(Seeds(), batch_size=None, num_workers=2,
                                  generator=ta.Generator().manual_seed(9)))
    assert again == samples


def test_persistent_workers_keep_their_streams_across_epochs():
    def epochs(persistent):
        loader = tdata.DataLoader(Seeds(), batch_size=None, num_workers=2,
                                  persistent_workers=persistent,
                                  generator=ta.Generator().manual_seed(2))
        return [[s["ta"] for s in loader] for _ in range(2)]

    kept, fresh = epochs(True), epochs(False)
    assert kept[0] == fresh[0]
    assert kept[1] != kept[0]  # the same workers went on drawing
    assert len(set(kept[1]) & set(fresh[1])) == 0  # reseeded workers drew anew
