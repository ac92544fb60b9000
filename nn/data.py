"""Text data for the char-level GPT: a tokenizer, a built-in corpus, a batch sampler.

The default corpus needs no download: it is the source of a fixed list of standard-library
modules, read from this Python's installation, so every run on the same Python sees the
same ~1 MB of text.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random

import tinygrad_attn as ta

# Fixed and ordered: the corpus is these files' text, joined in this order. Pure-Python
# modules present in every CPython >= 3.10 (none frozen, few non-ASCII characters).
CORPUS_MODULES = (
    "this", "textwrap", "string", "difflib", "argparse", "functools", "dataclasses", "heapq",
    "bisect", "fractions", "random", "statistics", "pprint", "contextlib", "copy", "fnmatch",
    "glob", "json.decoder", "json.encoder", "queue", "sched", "tokenize", "traceback",
    "timeit", "graphlib", "colorsys", "numbers", "reprlib", "calendar", "csv", "operator",
    "types", "weakref", "cmd", "code", "getopt", "linecache", "keyword", "collections",
    "enum", "shutil", "tempfile", "threading", "gettext", "configparser",
)


def default_corpus() -> str:
    """The built-in training text: the CORPUS_MODULES' source files, concatenated.

    A module whose source is not on disk (a frozen or stripped installation) is skipped.
    """
    parts = []
    for name in CORPUS_MODULES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is None or not origin.endswith(".py") or not os.path.isfile(origin):
            continue
        with open(origin, encoding="utf-8") as f:
            parts.append(f.read())
    if not parts:
        raise RuntimeError("default_corpus: no standard-library source files found; "
                           "pass a text file instead")
    return "\n\n".join(parts)


def load_text(path) -> str:
    """The contents of a UTF-8 text file."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path!r} is not UTF-8 text ({e})") from None
    if not text:
        raise ValueError(f"{path!r} is empty")
    return text


def text_identity(text: str) -> dict:
    """What identifies a training text wherever its file lies: the sha256 and size of its
    UTF-8 bytes (as read: newlines already made "\\n"), its length and its characters.
    A checkpoint records it, so a resumed run can accept the text at a new path and refuse
    a different text at the old one. JSON-able."""
    raw = text.encode("utf-8")
    return {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw),
            "characters": len(text), "vocabulary": "".join(sorted(set(text)))}


def identity_changes(recorded: dict, text: str) -> list[str]:
    """How `text` differs from the text `recorded` (a text_identity) identified, one
    phrase per difference; empty when it is that text."""
    now = text_identity(text)
    if now["sha256"] == recorded.get("sha256") and now["bytes"] == recorded.get("bytes"):
        return []
    changes = []
    if now["bytes"] != recorded.get("bytes"):
        changes.append(f"size {recorded.get('bytes', '?'):,} -> {now['bytes']:,} bytes")
    else:
        changes.append(f"same size ({now['bytes']:,} bytes)")
    changes.append(f"sha256 {str(recorded.get('sha256'))[:12]}... -> {now['sha256'][:12]}...")
    if "vocabulary" in recorded:
        old, new = set(recorded["vocabulary"]), set(now["vocabulary"])
        if new - old:
            changes.append(f"characters added: {_chars(new - old)}")
        if old - new:
            changes.append(f"characters removed: {_chars(old - new)}")
        if old == new:
            changes.append("the same characters in a different text")
    return changes


def _chars(chars: set) -> str:
    return ", ".join(repr(c) for c in sorted(chars))


class CharTokenizer:
    """One token per distinct character of the text it was built from, in sorted order."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        if not self.chars:
            raise ValueError("CharTokenizer: cannot build a vocabulary from empty text")
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(f"CharTokenizer.encode: character {e.args[0]!r} is not in the "
                             f"vocabulary of {self.vocab_size} characters") from None

    def decode(self, ids) -> str:
        if isinstance(ids, ta.Tensor):
            ids = ids.tolist()
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self) -> dict:
        """A JSON-able description (store json.dumps of it in checkpoint metadata)."""
        return {"type": "char", "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        if d.get("type") != "char":
            raise ValueError(f"CharTokenizer.from_dict: not a char tokenizer: {d.get('type')!r}")
        tok = cls(d["chars"])
        if tok.chars != list(d["chars"]):
            raise ValueError("CharTokenizer.from_dict: 'chars' must be sorted and distinct")
        return tok

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def train_val_split(ids, frac: float = 0.9):
    """(first frac of ids, the rest), as nanoGPT splits; slices of a Tensor are views."""
    if not 0 < frac < 1:
        raise ValueError(f"train_val_split: frac must be in (0, 1), got {frac}")
    n = int(frac * len(ids))
    return ids[:n], ids[n:]


class BatchSampler:
    """Random windows of a token sequence: (x, y) int64 tensors of shape (B, T), y = x shifted
    left by one (the next token at every position).

    Window starts come from a `random.Random(seed)` of its own, so batches are reproducible
    and independent of any other randomness; `state_dict()` / `load_state_dict()` save and
    restore it, so a resumed run draws the batches the uninterrupted one would have.
    """

    def __init__(self, data_ids, block_size: int, batch_size: int, seed: int = 0,
                 device: str = "cpu") -> None:
        if not isinstance(data_ids, ta.Tensor):
            data_ids = ta.tensor(list(data_ids), dtype=ta.int64)
        if data_ids.ndim != 1:
            raise ValueError(f"BatchSampler: data_ids must be 1-D, got {tuple(data_ids.shape)}")
        if len(data_ids) <= block_size:
            raise ValueError(
                f"BatchSampler: {len(data_ids)} tokens are too few for windows of "
                f"block_size + 1 = {block_size + 1}"
            )
        self.data = data_ids
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.device = device
        self.rng = random.Random(seed)

    def sample(self):
        """The next batch (x, y), each (batch_size, block_size) int64 on `device`."""
        T, last = self.block_size, len(self.data) - self.block_size
        starts = [self.rng.randrange(last) for _ in range(self.batch_size)]
        x = ta.stack([self.data[i : i + T] for i in starts])  # (B, T)
        y = ta.stack([self.data[i + 1 : i + 1 + T] for i in starts])  # (B, T)
        if x.dtype != ta.int64:
            x, y = x.long(), y.long()
        if self.device != "cpu":
            x, y = x.to(self.device), y.to(self.device)
        return x, y

    __call__ = sample

    def __iter__(self):
        return self

    def __next__(self):
        return self.sample()

    def state_dict(self) -> dict:
        """JSON-able: the seed and the generator's full state."""
        version, internal, gauss_next = self.rng.getstate()
        return {"seed": self.seed, "rng_state": [version, list(internal), gauss_next]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss_next = state["rng_state"]
        self.seed = state["seed"]
        self.rng.setstate((version, tuple(internal), gauss_next))
