"""The safetensors format, read and written here (no dependency): tensors by name, a JSON
header, no pickle.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype,
shape, byte range; plus a "__metadata__" dict of strings) and the raw little-endian bytes,
the byte ranges tiling the data exactly. Loading parses JSON and copies bytes, so it cannot
execute anything, and every check a reader needs is here, so a bad file is always a
CheckpointError (a ValueError, and a RuntimeError as torch.load raises) naming it. Files
written by `safetensors.torch.save_file` load here by name, and ours load there.

- `save_file` moves tensors to the CPU, keeps their dtype, and writes atomically: to a
  temporary file in the same directory, fsync'ed, then `os.replace`d over the target, so a
  crash mid-save (even `kill -9`) leaves the old file whole. The temporary's name carries
  the target's name, the host and the writer's pid; a later save of the same target removes
  the temporaries whose writer on this host is dead, and never a live writer's.
- Names that would make the file unloadable (`__metadata__`, text that is not UTF-8) and
  headers past the 100 MB that safetensors readers accept are refused before anything is
  written.
- Loading gives each engine dtype as is; dtypes the engine lacks load widened where that is
  exact, or are refused naming the file and the tensor (widening.py).
- Tied or shared tensors are written once per name, each its own copy of the bytes.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import secrets
import socket
import sys

from .. import backend
from ..creation import empty
from ..tensor import Tensor
from .widening import CONVERTED, REFUSED

# What safetensors readers accept as a header (its MAX_HEADER_SIZE); a longer length field
# is corruption, and refusing it early keeps a bad file from asking for a huge read.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"

# engine dtype <-> the format's code
CODE = {backend.float16: "F16", backend.float32: "F32", backend.float64: "F64",
        backend.int8: "I8", backend.uint8: "U8", backend.int16: "I16", backend.int32: "I32",
        backend.int64: "I64", backend.bool_: "BOOL"}
_NATIVE = {code: dt for dt, code in CODE.items()}
_ITEMSIZE = {"F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8,
             "BOOL": 1}

# The conversion of a state dict that torch.save wrote (run where torch is installed); the
# error for such a file and docs/checkpoints.md both show it.
CONVERT_STATE_DICT = (
    "python -c \"import sys, torch; from safetensors.torch import save_file; "
    "sd = torch.load(sys.argv[1], map_location='cpu'); "
    "save_file({k: v.contiguous().clone() for k, v in sd.items()}, sys.argv[2])\" "
    "model.pt model.safetensors"
)


class CheckpointError(ValueError, RuntimeError):
    """A file that is not a readable checkpoint: truncated, corrupted, or another format.

    A ValueError (as nn.load has always raised) and a RuntimeError (as torch.load raises)."""


def check_byteorder() -> None:
    if sys.byteorder != "little":  # the format is little-endian; arrays here are native
        raise NotImplementedError("safetensors I/O is implemented for little-endian hosts only")


def check_text(who: str, what: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON readers other than Python's refuse it
        raise ValueError(f"{who}: {what} {text!r} is not valid UTF-8 text; the "
                         "file would not load elsewhere") from None


# ---------------------------------------------------------------------------- saving
def save_file(tensors: dict, path, metadata: dict | None = None) -> None:
    """Write `tensors` (name -> Tensor) to `path` as safetensors, atomically.

    `metadata` is a dict of strings stored in the header (use json.dumps for structures).
    """
    check_byteorder()
    path = os.fspath(path)
    who = f"save({path!r})"
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"{who}: tensor names must be str, got {name!r}")
        if not isinstance(t, Tensor):
            raise TypeError(f"{who}: {name!r} is a {type(t).__name__}, not a Tensor")
        if name == METADATA_KEY:
            raise ValueError(f"{who}: {name!r} is reserved for the header's "
                             "metadata and cannot name a tensor; rename it")
        check_text(who, "tensor name", name)
    if metadata is not None:
        bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise TypeError(f"{who}: metadata keys and values must be str: {bad}")
        for k, v in metadata.items():
            check_text(who, "metadata key", k)
            check_text(who, f"metadata value of {k!r}", v)
    header, arrays = encode(who, tensors, metadata)
    write_path(path, header, arrays)


def encode(who: str, tensors: dict, metadata: dict | None) -> tuple[bytes, list]:
    """(the header, the arrays in file order) for checked names and metadata: each tensor's
    dense host bytes (contiguous() copies only views that need it)."""
    arrays = {name: (CODE[t.dtype], t.detach().cpu().contiguous().numpy())
              for name, t in tensors.items()}
    header, order = _header(who, arrays, metadata)
    return header, [arrays[name][1] for name in order]


def _header(who: str, arrays: dict, metadata: dict | None) -> tuple[bytes, list]:
    """(the JSON header, the names in file order). The header is padded with spaces to a
    multiple of 8 bytes; tensors are laid out as safetensors lays them, by element size
    (largest first) and then by name, so each one's bytes start at a multiple of its
    element size."""
    order = sorted(arrays, key=lambda n: (-arrays[n][1].itemsize, n))
    entries: dict = {}
    if metadata:
        entries[METADATA_KEY] = dict(metadata)
    offset = 0
    for name in order:
        code, arr = arrays[name]
        entries[name] = {"dtype": code, "shape": list(arr.shape),
                         "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    header = json.dumps(entries, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)
    if len(header) > MAX_HEADER_BYTES:
        sizes = {k: len(k) + len(v) for k, v in (metadata or {}).items()}
        biggest = max(sizes, key=sizes.get) if sizes else None
        hint = f"; the largest metadata entry is {biggest!r} ({sizes[biggest]:,} characters)" \
            if biggest is not None else ""
        raise ValueError(f"{who}: the header would be {len(header):,} bytes, over "
                         f"the {MAX_HEADER_BYTES:,} that safetensors readers accept{hint}")
    return header, order


def _write_file(f, header: bytes, arrays: list) -> None:
    """The length field, the header and each array's bytes, in the header's order."""
    f.write(len(header).to_bytes(8, "little"))
    f.write(header)
    for arr in arrays:
        if arr.size:
            try:
                f.write(memoryview(arr).cast("B"))  # no copy of the tensor's bytes
            except TypeError:  # a layout the buffer protocol calls non-contiguous
                f.write(arr.tobytes())


def write_stream(f, header: bytes, arrays: list) -> None:
    """Write to a caller's binary file object, from its current position (not atomic: the
    caller owns the object)."""
    _write_file(f, header, arrays)


def write_path(path: str, header: bytes, arrays: list) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    _remove_stale_temporaries(directory, base)
    # a fresh name next to the target (os.replace can't cross filesystems); created here,
    # not by mkstemp, to get the usual permissions (0o666 less the umask)
    tmp = os.path.join(directory, f".{base}.{_HOST}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            _write_file(f, header, arrays)
            f.flush()
            os.fsync(f.fileno())  # the bytes reach the disk before the rename
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


# A temporary is ".{target}.{host}.{pid}.{12 hex}.tmp"; the host keeps two machines that
# share a directory from judging each other's pids.
_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _remove_stale_temporaries(directory: str, base: str) -> None:
    """Delete the temporaries a killed save of this same target left behind: only those
    named for `base`, written on this host, by a process that no longer exists."""
    if os.name != "posix":  # a pid probe by signal 0 is POSIX; elsewhere leave them
        return
    pattern = re.compile(rf"\.{re.escape(base)}\.{re.escape(_HOST)}\.(\d+)\.[0-9a-f]{{12}}\.tmp")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = pattern.fullmatch(name)
        if m and not _pid_alive(int(m.group(1))):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:  # another save cleaning up at the same time got it first
                pass


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():  # another thread of this process may be saving
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's; anything else: don't guess
        return True
    return True


def _fsync_dir(directory: str) -> None:
    """Persist the rename itself (POSIX); a no-op where directories can't be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- loading
def load_file(path, device: str = "cpu") -> dict:
    """Read a safetensors file into {name: Tensor} on `device`.

    A file that is truncated, has a corrupted header, holds a dtype the engine cannot
    represent exactly, or is not safetensors at all raises CheckpointError (a ValueError)
    naming the file and the problem.
    """
    with opened(path) as reader:
        entries, _ = reader.header()
        reader.check_loadable(entries)
        out = {}
        for entry in entries:
            t = reader.tensor(entry)
            out[entry[0]] = t if device == "cpu" else t.to(device)
    return out


def load_metadata(path) -> dict:
    """The header's string metadata (empty if the file has none)."""
    with opened(path) as reader:
        return reader.header()[1]


@contextlib.contextmanager
def opened(f):
    """A Reader over a path (str or PathLike) or a readable binary file object, which is read
    from its current position."""
    check_byteorder()
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no checkpoint file at {path!r}")
        with open(path, "rb") as fh:
            yield Reader(fh, repr(path), 0, os.fstat(fh.fileno()).st_size)
        return
    if not callable(getattr(f, "read", None)):
        raise TypeError(f"expected a path or a readable binary file object, got a "
                        f"{type(f).__name__}")
    name = getattr(f, "name", None)
    label = repr(name) if isinstance(name, str) else f"<{type(f).__name__}>"
    seekable = getattr(f, "seekable", None)
    if not (callable(seekable) and seekable()):
        f = io.BytesIO(f.read())  # a pipe or socket: the reader seeks
    base = f.tell()
    size = f.seek(0, io.SEEK_END) - base
    f.seek(base)
    yield Reader(f, label, base, size)


def bad_file(label: str, problem: str) -> CheckpointError:
    return CheckpointError(
        f"{label} is not a readable safetensors checkpoint ({problem}); it may be truncated, "
        "corrupted, or another format (pickled .pt/.pth files are never loaded)"
    )


def _torch_file(label: str, kind: str) -> CheckpointError:
    return CheckpointError(
        f"{label} is {kind}, as torch.save writes, not safetensors: it is never loaded "
        "here, since unpickling can run any code in the file (weights_only=False does not "
        "change that). Convert it once where torch is installed; for a state dict:\n    "
        f"{CONVERT_STATE_DICT}\n(docs/checkpoints.md also converts a whole training "
        "checkpoint)"
    )


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice")
        out[key] = value
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class Reader:
    """One safetensors file being read: `header()` checks it whole, `tensor(entry)` reads
    one tensor. Offsets are from `base`, where the file (or the caller's stream) starts."""

    def __init__(self, f, label: str, base: int, size: int):
        self.f, self.label, self.base, self.size = f, label, base, size
        self.data_start = None

    def _read(self, n: int) -> bytes:
        raw = self.f.read(n)
        if len(raw) != n:
            raise bad_file(self.label, "the file shrank while being read")
        return raw

    def header(self) -> tuple[list, dict]:
        """([(name, dtype code, shape, begin, end)] in file order, metadata), after every
        check that the header describes this file's bytes exactly."""
        label, size = self.label, self.size
        self.f.seek(self.base)
        first = self.f.read(8) if size >= 8 else b""
        if first.startswith(b"PK\x03\x04"):
            raise _torch_file(label, "a zip archive (of pickles)")
        if first[:1] == b"\x80" and first[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
            raise _torch_file(label, "a pickle")
        if size < 8:
            raise bad_file(label, f"only {size} bytes, too short for a header")
        n = int.from_bytes(first, "little")
        if n > MAX_HEADER_BYTES:
            raise bad_file(label, f"a header length of {n:,} bytes, over the "
                                  f"{MAX_HEADER_BYTES:,} the format allows")
        if 8 + n > size:
            raise bad_file(label, f"a header length of {n:,} bytes runs past the end of the "
                                  f"{size:,}-byte file")
        raw = self._read(n)
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise bad_file(label, f"the header is not valid JSON: {e}") from None
        if not isinstance(header, dict):
            raise bad_file(label, "the header is not a JSON object")
        metadata = header.pop(METADATA_KEY, None)
        metadata = {} if metadata is None else metadata
        if not isinstance(metadata, dict) or not all(
                isinstance(v, str) for v in metadata.values()):
            raise bad_file(label, f"{METADATA_KEY!r} must map strings to strings")
        entries = [self._entry(name, info) for name, info in header.items()]
        entries.sort(key=lambda e: (e[3], e[4]))
        expected = 0
        for name, _, _, begin, end in entries:
            if begin != expected:
                raise bad_file(label, f"tensor {name!r}: its bytes start at {begin}, not at "
                                      f"{expected} where the previous tensor's end (the "
                                      "tensors' byte ranges must tile the data)")
            expected = end
        data = size - 8 - n
        if expected != data:
            raise bad_file(label, f"the tensors take {expected:,} bytes but {data:,} follow "
                                  "the header")
        self.data_start = self.base + 8 + n
        return entries, metadata

    def _entry(self, name: str, info) -> tuple:
        label = self.label
        if not isinstance(info, dict):
            raise bad_file(label, f"tensor {name!r}: expected an object with dtype, shape and "
                                  "data_offsets")
        code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(code, str):
            raise bad_file(label, f"tensor {name!r}: dtype must be a string, got {code!r}")
        if code in _ITEMSIZE:
            bits = 8 * _ITEMSIZE[code]
        elif code in CONVERTED:
            bits = 8 * CONVERTED[code][0]
        elif code in REFUSED:  # refused by load, but the header stays readable
            bits = REFUSED[code][0]
        else:
            raise bad_file(label, f"tensor {name!r}: unknown dtype {code!r}")
        if not (isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)):
            raise bad_file(label, f"tensor {name!r}: shape must be a list of non-negative "
                                  f"integers, got {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(map(_is_int, offsets)) and 0 <= offsets[0] <= offsets[1]):
            raise bad_file(label, f"tensor {name!r}: data_offsets must be [begin, end] with "
                                  f"0 <= begin <= end, got {offsets!r}")
        extent = bits * math.prod(d for d in shape if d)  # what an allocator must index
        if extent >= 2**64:
            raise bad_file(label, f"tensor {name!r}: shape {shape} is too large to allocate")
        nbits = bits * math.prod(shape)
        nbytes = nbits // 8
        if nbits % 8 or nbytes != offsets[1] - offsets[0]:
            raise bad_file(label, f"tensor {name!r}: {code} of shape {shape} takes {nbytes} "
                                  f"bytes, but data_offsets {offsets} give "
                                  f"{offsets[1] - offsets[0]}")
        return name, code, tuple(shape), offsets[0], offsets[1]

    def check_loadable(self, entries) -> None:
        """Refuse, before reading any bytes, a tensor whose dtype the engine cannot hold."""
        for name, code, *_ in entries:
            if code in REFUSED:
                raise CheckpointError(
                    f"{self.label}: tensor {name!r} has dtype {code}, which cannot be loaded: "
                    f"{REFUSED[code][1]}. Convert it where it was saved (e.g. to int64 or "
                    "float32)")

    def tensor(self, entry) -> Tensor:
        """The CPU tensor of one header entry, in memory the caller owns."""
        name, code, shape, begin, end = entry
        self.check_loadable([entry])
        nbytes = end - begin
        self.f.seek(self.data_start + begin)
        if code in _NATIVE and code != "BOOL":
            t = empty(shape, dtype=_NATIVE[code])
            if nbytes and self.f.readinto(memoryview(t.numpy()).cast("B")) != nbytes:
                raise bad_file(self.label, f"tensor {name!r}: the file shrank while being read")
            return t
        raw = self._read(nbytes)
        if code == "BOOL":
            dtype, data = backend.bool_, raw.translate(_BOOL_BYTE)
        else:
            _, dtype, convert = CONVERTED[code]
            data = convert(raw)
        t = empty(shape, dtype=dtype)
        if nbytes:
            memoryview(t.numpy()).cast("B")[:] = data
        return t


_BOOL_BYTE = bytes([0] + [1] * 255)  # any nonzero byte is True, stored as the canonical 1
