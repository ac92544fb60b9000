"""The random functions: torch's signatures, Generator objects, and the distributions drawn.

Distribution checks run on fixed seeds (so they are deterministic) over many draws: a
chi-square statistic against its 0.1% critical value, or a mean within a few standard
errors. The engine's streams are its own (NumPy's PCG64), so the numbers differ from
torch's for a seed; only the laws and the signatures are compared with torch.
"""

from __future__ import annotations

import math

import pytest

import tinygrad_attn as ta
import tinygrad_attn.random as ta_random
from tinygrad_attn.creation import randint, randint_like, randperm

# chi-square critical values at the 0.1% level, by degrees of freedom
CHI2_999 = {3: 16.27, 4: 18.47, 9: 27.88, 11: 31.26, 16: 39.25}


def _chi2(counts, expected) -> float:
    return sum((c - e) ** 2 / e for c, e in zip(counts, expected))


def _counts(values, k) -> list:
    counts = [0] * k
    for v in values:
        counts[v] += 1
    return counts


def _gen(seed=0):
    return ta.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- randint
def test_randint_reads_torchs_forms():
    torch = pytest.importorskip("torch")
    forms = [((10, (3,)), {}), ((3, 10, (2, 2)), {}), ((), {"high": 5, "size": (4,)}),
             ((2,), {"high": 5, "size": (4,)}), ((10,), {"size": [2, 3]}),
             ((2, 5, (3,)), {"dtype": "float32"}), ((2, (5,)), {"dtype": "bool"})]
    for args, kwargs in forms:
        ours = randint(*args, **{k: getattr(ta, v) if k == "dtype" else v
                                 for k, v in kwargs.items()})
        theirs = torch.randint(*args, **{k: getattr(torch, v) if k == "dtype" else v
                                         for k, v in kwargs.items()})
        assert tuple(ours.shape) == tuple(theirs.shape)
        assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    x = randint(3, 10, (1000,), generator=_gen())
    assert x.min().item() == 3 and x.max().item() == 9


def test_randint_errors_are_torchs():
    torch = pytest.importorskip("torch")
    bad = [lambda lib: lib.randint(10, 3), lambda lib: lib.randint(5, 5, (2,)),
           lambda lib: lib.randint(10.5, (2,)), lambda lib: lib.randint(300, (2,), dtype=lib.uint8),
           lambda lib: lib.randint(-1, 3, (2,), dtype=lib.uint8),
           lambda lib: lib.randint(10, (2,), requires_grad=True)]
    for make in bad:
        with pytest.raises(Exception) as theirs:
            make(torch)
        ours_lib = type("lib", (), {"randint": staticmethod(randint), "uint8": ta.uint8})
        with pytest.raises(type(theirs.value)):
            make(ours_lib)


def test_randint_is_uniform():
    draws = randint(10, (20000,), generator=_gen(1)).tolist()
    assert _chi2(_counts(draws, 10), [2000] * 10) < CHI2_999[9]


def test_randint_like_takes_the_tensors_shape_and_dtype():
    x = ta.zeros(2, 3)
    y = randint_like(x, 5, generator=_gen())
    assert y.shape == (2, 3) and y.dtype is ta.float32
    z = randint_like(x, 2, 4, dtype=ta.int64)
    assert z.dtype is ta.int64 and set(z.flatten().tolist()) <= {2, 3}


# ----------------------------------------------------------------------------- randperm
def test_randperm_is_a_permutation_uniform_over_positions():
    gen = _gen(2)
    table = [[0] * 5 for _ in range(5)]  # table[position][value]
    for _ in range(4000):
        p = randperm(5, generator=gen).tolist()
        assert sorted(p) == [0, 1, 2, 3, 4]
        for pos, v in enumerate(p):
            table[pos][v] += 1
    cells = [c for row in table for c in row]
    assert _chi2(cells, [800] * 25) < CHI2_999[16]


def test_randperm_dtype_and_errors():
    torch = pytest.importorskip("torch")
    assert randperm(0).dtype is ta.int64 and randperm(0).shape == (0,)
    assert randperm(6, dtype=ta.float32).dtype is ta.float32
    assert sorted(randperm(300).tolist()) == list(range(300))
    for lib, perm in ((torch, torch.randperm), (ta, randperm)):
        with pytest.raises(RuntimeError):
            perm(-1)
        with pytest.raises(RuntimeError):
            perm(300, dtype=lib.uint8)
        with pytest.raises(RuntimeError):
            perm(5, requires_grad=True)


# ----------------------------------------------------------------------------- multinomial
W = [1.0, 2.0, 3.0, 4.0]


def test_multinomial_with_replacement_follows_the_weights():
    draws = ta.multinomial(ta.tensor(W), 20000, replacement=True, generator=_gen(3)).tolist()
    assert _chi2(_counts(draws, 4), [2000 * w for w in W]) < CHI2_999[3]


def test_multinomial_without_replacement_draws_in_proportion_to_what_is_left():
    rows = ta.tensor([W] * 20000)  # 20000 independent rows, two draws each
    pairs = ta.multinomial(rows, 2, generator=_gen(4)).tolist()
    assert all(i != j for i, j in pairs)
    S = sum(W)
    keys = [(i, j) for i in range(4) for j in range(4) if i != j]
    observed = dict.fromkeys(keys, 0)
    for i, j in pairs:
        observed[(i, j)] += 1
    expected = [20000 * W[i] / S * W[j] / (S - W[i]) for i, j in keys]
    assert _chi2([observed[k] for k in keys], expected) < CHI2_999[11]


def test_multinomial_shapes_and_zero_weights():
    assert ta.multinomial(ta.tensor([0.0, 5.0, 0.0]), 1).tolist() == [1]
    assert ta.tensor([[0.0, 1.0], [1.0, 0.0]]).multinomial(3, True).tolist() == [[1] * 3,
                                                                                  [0] * 3]
    full = ta.multinomial(ta.tensor([0.0, 1.0, 0.0]), 3)  # zero weights come last
    assert full.tolist()[0] == 1 and sorted(full.tolist()) == [0, 1, 2]
    out = ta.multinomial(ta.ones(2, 5, dtype=ta.float16), 3)
    assert out.dtype is ta.int64 and out.shape == (2, 3)


def test_multinomial_on_a_transposed_input():
    w = ta.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]).t()  # rows [0, 0, 1], [1, 0, 0]
    assert ta.multinomial(w, 1).tolist() == [[2], [0]]


# ----------------------------------------------------------------------------- laws
def _mean_std(values):
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def _near(mean, expected, sd, n=20000, sigmas=4.0):
    assert abs(mean - expected) < sigmas * sd / math.sqrt(n), (mean, expected)


def test_bernoulli_means():
    gen = _gen(5)
    p = ta.full((20000,), 0.3, dtype=ta.float64)
    _near(_mean_std(ta.bernoulli(p, generator=gen).tolist())[0], 0.3, math.sqrt(0.21))
    x = ta.zeros(20000).bernoulli_(0.7, generator=gen)
    _near(_mean_std(x.tolist())[0], 0.7, math.sqrt(0.21))
    assert set(x.tolist()) == {0.0, 1.0}


def test_normal_mean_and_std():
    gen = _gen(6)
    for sample in (ta.zeros(20000, dtype=ta.float64).normal_(2.0, 3.0, generator=gen),
                   ta.normal(ta.full((20000,), 2.0), 3.0, generator=gen),
                   ta.normal(2.0, ta.full((20000,), 3.0), generator=gen),
                   ta.normal(2.0, 3.0, (20000,), generator=gen)):
        mean, std = _mean_std(sample.tolist())
        _near(mean, 2.0, 3.0)
        assert abs(std - 3.0) < 0.1


def test_randn_and_rand_take_a_generator():
    a = ta.randn(5, generator=_gen(8)).tolist()
    assert a == ta.randn(5, generator=_gen(8)).tolist()
    assert ta.rand(2, 3, generator=_gen(8)).shape == (2, 3)
    u = ta.rand(20000, dtype=ta.float64, generator=_gen(9)).tolist()
    assert 0 <= min(u) and max(u) < 1
    _near(_mean_std(u)[0], 0.5, math.sqrt(1 / 12))


def test_the_other_fills():
    gen = _gen(10)
    x = ta.zeros(20000, dtype=ta.float64)
    _near(_mean_std(x.exponential_(4.0, generator=gen).tolist())[0], 0.25, 0.25)
    assert x.min().item() >= 0
    geo = x.geometric_(0.25, generator=gen).tolist()
    assert min(geo) >= 1 and all(v == int(v) for v in geo)
    _near(_mean_std(geo)[0], 4.0, math.sqrt(0.75) / 0.25)
    u = x.uniform_(-2.0, 6.0, generator=gen).tolist()
    assert -2.0 <= min(u) and max(u) < 6.0
    _near(_mean_std(u)[0], 2.0, 8 / math.sqrt(12))
    log_mean = _mean_std([math.log(v) for v in x.log_normal_(1.0, 0.5, generator=gen).tolist()])
    _near(log_mean[0], 1.0, 0.5)
    median = sorted(x.cauchy_(3.0, 2.0, generator=gen).tolist())[10000]
    assert abs(median - 3.0) < 0.1
    r = ta.zeros(20000, dtype=ta.int64).random_(4, 9, generator=gen).tolist()
    assert _chi2(_counts([v - 4 for v in r], 5), [4000] * 5) < CHI2_999[4]
    rates = ta.full((20000,), 2.5, dtype=ta.float64)
    _near(_mean_std(ta.poisson(rates, generator=gen).tolist())[0], 2.5, math.sqrt(2.5))


def test_random_without_bounds_covers_the_dtypes_range():
    b = ta.zeros(1000, dtype=ta.bool).random_(generator=_gen())
    assert set(b.tolist()) == {False, True}
    u8 = ta.zeros(5000, dtype=ta.uint8).random_(generator=_gen()).tolist()
    assert min(u8) < 10 and max(u8) > 245
    f = ta.zeros(1000).random_(generator=_gen()).tolist()
    assert 0 <= min(f) and max(f) <= 2 ** 24 and max(f) > 2 ** 23
    i64 = ta.zeros(1000, dtype=ta.int64).random_(generator=_gen()).tolist()
    assert min(i64) >= 0 and max(i64) > 2 ** 62


# ----------------------------------------------------------------------------- generators
def test_a_seeded_generator_is_deterministic_and_independent():
    a, b = _gen(11), _gen(11)
    assert ta.rand(4, generator=a).tolist() == ta.rand(4, generator=b).tolist()
    ta.rand(100, generator=a)  # a moves on; b does not
    b2 = _gen(11)
    ta.rand(4, generator=b2)
    assert ta.randn(3, generator=b).tolist() == ta.randn(3, generator=b2).tolist()
    assert ta.rand(4, generator=_gen(12)).tolist() != ta.rand(4, generator=_gen(13)).tolist()
    ta.manual_seed(0)
    first = ta.rand(3).tolist()
    ta.manual_seed(0)
    ta.rand(50, generator=_gen(1))  # a Generator's draws leave the default stream alone
    assert ta.rand(3).tolist() == first


def test_generator_api_is_torchs():
    torch = pytest.importorskip("torch")
    g = ta.Generator()
    assert g.initial_seed() == torch.Generator().initial_seed()
    assert g.manual_seed(5) is g and g.initial_seed() == 5
    assert str(g.device) == str(torch.Generator().device) == "cpu"
    state = g.get_state()
    x = randperm(10, generator=g).tolist()
    assert g.set_state(state) is g
    assert randperm(10, generator=g).tolist() == x
    s = g.seed()
    assert g.initial_seed() == s and 0 <= s < 2 ** 64
    assert ta.manual_seed(3) is ta.manual_seed(4)
    assert ta.manual_seed(-1).initial_seed() == torch.manual_seed(-1).initial_seed()
    with pytest.raises(ValueError):
        torch.manual_seed(2 ** 64)
    with pytest.raises(ValueError):
        ta.manual_seed(2 ** 64)
    with pytest.raises(TypeError):
        ta.rand(2, generator=torch.Generator())


def test_torch_random_functions():
    ta_random.manual_seed(21)
    assert ta_random.initial_seed() == 21
    state = ta_random.get_rng_state()
    a = ta.rand(3).tolist()
    ta_random.set_rng_state(state)
    assert ta.rand(3).tolist() == a
    with ta_random.fork_rng():
        ta.rand(10)
    assert ta.rand(3).tolist() != a  # the stream went on from after `a` ...
    ta_random.set_rng_state(state)
    ta.rand(3)
    after = ta.rand(3).tolist()
    ta_random.set_rng_state(state)
    ta.rand(3)
    with ta_random.fork_rng():
        ta.randn(100)
    assert ta.rand(3).tolist() == after  # ... and fork_rng's draws did not move it
    s = ta_random.seed()
    assert ta_random.initial_seed() == s


# ----------------------------------------------------------------------------- in place
def test_fills_bump_the_version_and_write_through_views():
    base = ta.zeros(4, 6)
    view = base[:, ::2]
    before = base._version
    view.uniform_(1.0, 1.0)
    assert base.tolist() == [[1.0, 0.0] * 3] * 4
    assert base._version == view._version == before + 1
    x = ta.ones(3, requires_grad=True)
    y = x * 2
    z = y * y  # saves y
    y.normal_(generator=_gen())
    with pytest.raises(RuntimeError, match="modified by an inplace operation|version"):
        z.sum().backward()


def test_fill_of_a_leaf_that_requires_grad_is_refused_as_torch():
    torch = pytest.importorskip("torch")
    for lib in (torch, ta):
        x = lib.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError):
            x.uniform_()
        with lib.no_grad():
            x.uniform_(2.0, 2.0)
        assert x.tolist() == [2.0] * 3 and x.requires_grad


def test_fill_on_float16_and_a_non_contiguous_target():
    x = ta.zeros(4, 3, dtype=ta.float16).t()
    x.normal_(generator=_gen())
    assert x.dtype is ta.float16 and x.shape == (3, 4)
    assert len(set(x.flatten().tolist())) > 6


# ----------------------------------------------------------------------------- devices
def test_samplers_on_the_gpu_paths(gpu_device):
    """Every sampler but poisson on the CuPy code paths (the fake CuPy where no GPU)."""
    dev = gpu_device
    assert ta.rand(3, device=dev).device.startswith("cuda")
    assert randint(2, 5, (50,), device=dev).cpu().min().item() >= 2
    assert sorted(randperm(7, device=dev).cpu().tolist()) == list(range(7))
    w = ta.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0]], device=dev)
    assert ta.multinomial(w, 4, replacement=True).cpu().tolist()[1] == [0] * 4
    assert sorted(ta.multinomial(w, 3).cpu().tolist()[0]) == [0, 1, 2]
    x = ta.zeros(2, 3, device=dev)
    for fill, args in (("uniform_", (1.0, 2.0)), ("normal_", ()), ("exponential_", ()),
                       ("geometric_", (0.5,)), ("cauchy_", ()), ("log_normal_", ()),
                       ("bernoulli_", (0.5,)), ("random_", (0, 4))):
        assert getattr(x, fill)(*args) is x and x.device.startswith("cuda")
    assert ta.normal(x, 0.0).cpu().tolist() == x.cpu().tolist()
    assert ta.bernoulli(ta.ones(4, device=dev)).cpu().tolist() == [1.0] * 4
    with pytest.raises(RuntimeError, match="device type for generator"):
        ta.rand(2, device=dev, generator=ta.Generator("cpu"))
