"""nn.data: the char tokenizer, the built-in corpus, the seeded batch sampler."""

import json
import subprocess
import sys

import numpy as np
import pytest

import tinygrad_attn as ta
from nn.data import BatchSampler, CharTokenizer, default_corpus, load_text, train_val_split


def test_tokenizer_round_trip_and_vocabulary():
    text = "hello, world!\n\tÜnïcode too"
    tok = CharTokenizer(text)
    assert tok.chars == sorted(set(text)) and tok.vocab_size == len(set(text))
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids) and max(ids) == tok.vocab_size - 1
    assert tok.decode(ids) == text
    assert tok.decode(ta.tensor(ids)) == text  # a tensor of ids decodes too
    assert tok.encode("") == [] and tok.decode([]) == ""
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("hello z")


def test_tokenizer_survives_json_in_checkpoint_metadata():
    tok = CharTokenizer("the quick brown fox\n\"'\\")
    again = CharTokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.chars == tok.chars and again.encode("fox") == tok.encode("fox")
    with pytest.raises(ValueError):
        CharTokenizer.from_dict({"type": "bpe"})
    with pytest.raises(ValueError):
        CharTokenizer("")


def test_default_corpus_is_deterministic_and_non_trivial():
    text = default_corpus()
    assert 500_000 <= len(text) <= 2_000_000
    assert text == default_corpus()
    tok = CharTokenizer(text)
    assert 60 <= tok.vocab_size <= 200
    assert "def " in text and "import " in text and "class " in text
    # the same text in a fresh interpreter (no state shared with this process)
    code = ("import hashlib, nn.data; "
            "print(hashlib.sha256(nn.data.default_corpus().encode()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    import hashlib

    assert out == hashlib.sha256(text.encode()).hexdigest()


def test_load_text(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    assert load_text(path).startswith("First Citizen")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_text(tmp_path / "empty.txt")
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(ValueError, match="UTF-8"):
        load_text(tmp_path / "bin.dat")


def test_train_val_split():
    ids = ta.arange(100)
    train, val = train_val_split(ids, 0.9)
    assert train.shape == (90,) and val.shape == (10,)
    assert train.shares_storage(ids) and val.numpy()[0] == 90
    assert train_val_split(list(range(10)), 0.5) == ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9])
    with pytest.raises(ValueError):
        train_val_split(ids, 1.0)


def test_sampler_shapes_and_shift():
    data = ta.arange(1000) * 3  # values identify positions
    sampler = BatchSampler(data, block_size=16, batch_size=8, seed=1)
    x, y = sampler.sample()
    assert x.shape == (8, 16) and y.shape == (8, 16)
    assert x.dtype == ta.int64 and y.dtype == ta.int64
    X, Y = x.numpy(), y.numpy()
    np.testing.assert_array_equal(Y[:, :-1], X[:, 1:])  # y is x shifted by one
    np.testing.assert_array_equal(Y[:, -1], X[:, -1] + 3)
    np.testing.assert_array_equal(np.diff(X, axis=1), 3)  # contiguous windows
    assert (X >= 0).all() and (Y <= 999 * 3).all()


def test_sampler_covers_every_window_start():
    data = ta.arange(20)
    sampler = BatchSampler(data, block_size=4, batch_size=64, seed=0)
    starts = set()
    for _ in range(10):
        x, y = next(iter(sampler))
        starts |= set(x.numpy()[:, 0].tolist())
        assert y.numpy().max() <= 19
    assert starts == set(range(16))  # the last window ends at the last token


def test_sampler_is_reproducible_and_resumes_exactly():
    tok = CharTokenizer("abcdefghij")
    ids = tok.encode("abcdefghij" * 50)
    a = BatchSampler(ids, block_size=8, batch_size=4, seed=123)
    b = BatchSampler(ta.tensor(ids), block_size=8, batch_size=4, seed=123)
    batches_a = [a.sample() for _ in range(5)]
    batches_b = [b() for _ in range(5)]
    for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
        np.testing.assert_array_equal(xa.numpy(), xb.numpy())
        np.testing.assert_array_equal(ya.numpy(), yb.numpy())
    other = BatchSampler(ids, block_size=8, batch_size=4, seed=124)
    assert not np.array_equal(other.sample()[0].numpy(), batches_a[0][0].numpy())

    # save mid-stream (through JSON, as a checkpoint would), restore into a fresh sampler
    saved = json.loads(json.dumps(a.state_dict()))
    expected = [a.sample() for _ in range(3)]
    resumed = BatchSampler(ids, block_size=8, batch_size=4, seed=0)
    resumed.load_state_dict(saved)
    assert resumed.seed == 123
    for (xe, ye), (xr, yr) in zip(expected, [resumed.sample() for _ in range(3)]):
        np.testing.assert_array_equal(xe.numpy(), xr.numpy())
        np.testing.assert_array_equal(ye.numpy(), yr.numpy())


def test_sampler_does_not_touch_the_global_random_streams():
    ta.manual_seed(5)
    expected = ta.randn(3).numpy().copy()
    ta.manual_seed(5)
    BatchSampler(ta.arange(50), block_size=4, batch_size=2, seed=0).sample()
    np.testing.assert_array_equal(ta.randn(3).numpy(), expected)


def test_sampler_device(device):
    x, y = BatchSampler(ta.arange(50), 4, 2, seed=0, device=device).sample()
    assert x.device == y.device == ta.tensor(0, device=device).device


def test_sampler_rejects_too_little_data():
    with pytest.raises(ValueError, match="too few"):
        BatchSampler(ta.arange(8), block_size=8, batch_size=2)
    with pytest.raises(ValueError, match="1-D"):
        BatchSampler(ta.zeros(4, 4, dtype=ta.int64), block_size=2, batch_size=2)
