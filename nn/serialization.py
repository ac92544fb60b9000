"""Checkpoints in the safetensors format: tensors by name, a JSON header, no pickle.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype,
shape, byte range; plus a "__metadata__" dict of strings) and the raw little-endian bytes,
the byte ranges tiling the data exactly. This module reads and writes it itself (no
dependency): loading parses JSON and copies bytes, so it cannot execute anything, and every
check a reader needs is here, so a bad file is always a ValueError naming it. Files PyTorch
writes with `safetensors.torch.save_file` load here by name, and ours load there.

- `save` moves tensors to the CPU, keeps their dtype, and writes atomically: to a temporary
  file in the same directory, fsync'ed, then `os.replace`d over the target, so a crash
  mid-save (even `kill -9`) leaves the old checkpoint whole. The temporary's name carries
  the target's name, the host and the writer's pid; a later save of the same target removes
  the temporaries whose writer on this host is dead, and never a live writer's.
- Names that would make the file unloadable (`__metadata__`, text that is not UTF-8) and
  headers past the 100 MB that safetensors readers accept are refused before anything is
  written.
- Loading gives each engine dtype as is. Dtypes the engine lacks load only where a wider
  engine dtype holds every value exactly: uint16 -> int32, uint32 -> int64,
  bfloat16 and float8_e8m0 -> float32, the float8 kinds e4m3/e5m2 (and their fnuz
  variants) -> float16. uint64, complex and the packed 4/6-bit floats are refused, naming
  the file and the tensor.
- Tied or shared tensors (GPT's `transformer.wte.weight` is `lm_head.weight`) are written
  once per name, each its own copy of the bytes; loading gives separate tensors, and a
  Module's `load_state_dict` copies both into the one tied parameter (same values).
- `flatten_state` / `unflatten_state` turn a nested state (an optimizer's state_dict, a
  sampler's state, step counters) into named tensors plus a JSON string for the metadata.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import socket
import struct
import sys

import tinygrad_attn as ta

# What safetensors readers accept as a header (its MAX_HEADER_SIZE); a longer length field
# is corruption, and refusing it early keeps a bad file from asking for a huge read.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"

# engine dtype <-> the format's code
_CODE = {ta.float16: "F16", ta.float32: "F32", ta.float64: "F64", ta.int8: "I8",
         ta.uint8: "U8", ta.int16: "I16", ta.int32: "I32", ta.int64: "I64", ta.bool: "BOOL"}
_NATIVE = {code: dt for dt, code in _CODE.items()}
_ITEMSIZE = {"F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8,
             "BOOL": 1}
# the format's dtypes the engine lacks and cannot hold exactly: (bits per element, why)
_REFUSED = {
    "U64": (64, "uint64 values up to 2**64 - 1 do not fit the engine's widest integer, int64"),
    "C64": (64, "the engine has no complex dtype"),
    "F4": (4, "the engine has no packed 4-bit float"),
    "F6_E2M3": (6, "the engine has no packed 6-bit float"),
    "F6_E3M2": (6, "the engine has no packed 6-bit float"),
}


def _minifloat_table(exp_bits: int, man_bits: int, bias: int, kind: str) -> list[float]:
    """The value of each of the 256 bytes of an 8-bit float.

    kind "ieee": the top exponent is inf (mantissa 0) or nan; "fn": only the all-ones
    pattern (either sign) is nan, no inf; "fnuz": only 0x80 (negative zero's pattern) is
    nan, no inf; "e8m0": unsigned, a power of two, 0xFF nan.
    """
    values = []
    for b in range(256):
        if kind == "e8m0":
            values.append(math.nan if b == 0xFF else math.ldexp(1.0, b - 127))
            continue
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> man_bits) & ((1 << exp_bits) - 1)
        m = b & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if kind == "ieee" and e == top:
            values.append(sign * math.inf if m == 0 else math.nan)
        elif kind == "fn" and e == top and m == (1 << man_bits) - 1:
            values.append(math.nan)
        elif kind == "fnuz" and b == 0x80:
            values.append(math.nan)
        elif e == 0:
            values.append(sign * math.ldexp(m, 1 - bias - man_bits))
        else:
            values.append(sign * math.ldexp((1 << man_bits) + m, e - bias - man_bits))
    return values


def _byte_tables(values: list[float], fmt: str) -> list[bytes]:
    """One bytes.translate table per byte of the wider float `fmt` ('<e' or '<f'): table k
    maps an 8-bit float to byte k of the same value in the wider format. Exact by check."""
    packed = []
    for v in values:
        p = struct.pack(fmt, v)
        back = struct.unpack(fmt, p)[0]
        assert back == v or (math.isnan(v) and math.isnan(back)), (v, back)
        packed.append(p)
    return [bytes(p[k] for p in packed) for k in range(struct.calcsize(fmt))]


def _widen_int(raw: bytes, size: int, wide: int, signed: bool) -> bytearray:
    """Little-endian integers of `size` bytes as `wide`-byte ones: the low bytes copied,
    the rest 0, or 0xFF where a signed value is negative."""
    out = bytearray(len(raw) // size * wide)
    for k in range(size):
        out[k::wide] = raw[k::size]
    if signed:
        fill = raw[size - 1::size].translate(_SIGN_FILL)
        for k in range(size, wide):
            out[k::wide] = fill
    return out


def _widen_float(raw: bytes, tables: list[bytes]) -> bytearray:
    """8-bit floats as wider floats, byte by byte through the tables of _byte_tables."""
    wide = len(tables)
    out = bytearray(len(raw) * wide)
    for k, table in enumerate(tables):
        out[k::wide] = raw.translate(table)
    return out


def _bfloat16(raw: bytes) -> bytearray:
    """bfloat16 is the top half of a float32: put its two bytes above two zero bytes."""
    out = bytearray(len(raw) * 2)
    out[2::4] = raw[0::2]
    out[3::4] = raw[1::2]
    return out


_SIGN_FILL = bytes(0xFF if b & 0x80 else 0 for b in range(256))
_F8 = {  # code: (exp bits, mantissa bits, bias, kind, wider format, engine dtype)
    "F8_E4M3": (4, 3, 7, "fn", "<e", ta.float16),
    "F8_E5M2": (5, 2, 15, "ieee", "<e", ta.float16),
    "F8_E4M3FNUZ": (4, 3, 8, "fnuz", "<e", ta.float16),
    "F8_E5M2FNUZ": (5, 2, 16, "fnuz", "<e", ta.float16),
    "F8_E8M0": (8, 0, 127, "e8m0", "<f", ta.float32),
}
_F8_TABLES: dict = {}  # built on first use


def _f8_tables(code: str) -> list[bytes]:
    if code not in _F8_TABLES:
        e, m, bias, kind, fmt, _ = _F8[code]
        _F8_TABLES[code] = _byte_tables(_minifloat_table(e, m, bias, kind), fmt)
    return _F8_TABLES[code]


# code: (bytes per element in the file, engine dtype, raw bytes -> engine bytes)
_CONVERTED = {
    "U16": (2, ta.int32, lambda raw: _widen_int(raw, 2, 4, signed=False)),
    "U32": (4, ta.int64, lambda raw: _widen_int(raw, 4, 8, signed=False)),
    "BF16": (2, ta.float32, _bfloat16),
    **{code: (1, spec[5], lambda raw, code=code: _widen_float(raw, _f8_tables(code)))
       for code, spec in _F8.items()},
}


def _check_byteorder() -> None:
    if sys.byteorder != "little":  # the format is little-endian; arrays here are native
        raise NotImplementedError("safetensors I/O is implemented for little-endian hosts only")


# ---------------------------------------------------------------------------- saving
def save(state_dict: dict, path, metadata: dict | None = None) -> None:
    """Write `state_dict` (name -> Tensor) to `path` as safetensors, atomically.

    `metadata` is a dict of strings stored in the header (use json.dumps for structures).
    """
    _check_byteorder()
    path = os.fspath(path)
    arrays = {}
    for name, t in state_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"save({path!r}): tensor names must be str, got {name!r}")
        if not isinstance(t, ta.Tensor):
            raise TypeError(f"save({path!r}): {name!r} is a {type(t).__name__}, not a Tensor")
        if name == METADATA_KEY:
            raise ValueError(f"save({path!r}): {name!r} is reserved for the header's "
                             "metadata and cannot name a tensor; rename it")
        _check_text(path, "tensor name", name)
    if metadata is not None:
        bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise TypeError(f"save({path!r}): metadata keys and values must be str: {bad}")
        for k, v in metadata.items():
            _check_text(path, "metadata key", k)
            _check_text(path, f"metadata value of {k!r}", v)
    for name, t in state_dict.items():
        # contiguous() copies only views that need it; the file holds raw dense bytes
        arrays[name] = (_CODE[t.dtype], t.detach().cpu().contiguous().numpy())
    header, order = _header(path, arrays, metadata)

    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    _remove_stale_temporaries(directory, base)
    # a fresh name next to the target (os.replace can't cross filesystems); created here,
    # not by mkstemp, to get the usual permissions (0o666 less the umask)
    tmp = os.path.join(directory, f".{base}.{_HOST}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            _write_file(f, header, [arrays[name][1] for name in order])
            f.flush()
            os.fsync(f.fileno())  # the bytes reach the disk before the rename
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _check_text(path: str, what: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON readers other than Python's refuse it
        raise ValueError(f"save({path!r}): {what} {text!r} is not valid UTF-8 text; the "
                         "file would not load elsewhere") from None


def _header(path: str, arrays: dict, metadata: dict | None) -> tuple[bytes, list]:
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
        raise ValueError(f"save({path!r}): the header would be {len(header):,} bytes, over "
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
def load(path, device: str = "cpu") -> dict:
    """Read a safetensors file into {name: Tensor} on `device`.

    A file that is truncated, has a corrupted header, holds a dtype the engine cannot
    represent exactly, or is not safetensors at all raises ValueError naming the file and
    the problem.
    """
    _check_byteorder()
    path = os.fspath(path)
    out = {}
    with _open(path) as f:
        entries, _, data_start = _read_header(path, f)
        for name, code, *_ in entries:
            if code in _REFUSED:
                raise ValueError(f"{path!r}: tensor {name!r} has dtype {code}, which cannot be "
                                 f"loaded: {_REFUSED[code][1]}. Convert it where it was saved "
                                 "(e.g. to int64 or float32)")
        for name, code, shape, begin, end in entries:
            t = _read_tensor(path, f, name, code, shape, data_start + begin, end - begin)
            out[name] = t if device == "cpu" else t.to(device)
    return out


def load_metadata(path) -> dict:
    """The header's string metadata (empty if the file has none)."""
    path = os.fspath(path)
    with _open(path) as f:
        return _read_header(path, f)[1]


def _open(path: str):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint file at {path!r}")
    return open(path, "rb")


def _bad_file(path: str, problem: str) -> ValueError:
    return ValueError(
        f"{path!r} is not a readable safetensors checkpoint ({problem}); it may be truncated, "
        "corrupted, or another format (pickled .pt/.pth files are never loaded)"
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


def _read_header(path: str, f) -> tuple[list, dict, int]:
    """([(name, dtype code, shape, begin, end)] in file order, metadata, where data starts),
    after every check that the header describes this file's bytes exactly."""
    size = os.fstat(f.fileno()).st_size
    if size < 8:
        raise _bad_file(path, f"only {size} bytes, too short for a header")
    n = int.from_bytes(f.read(8), "little")
    if n > MAX_HEADER_BYTES:
        raise _bad_file(path, f"a header length of {n:,} bytes, over the "
                              f"{MAX_HEADER_BYTES:,} the format allows")
    if 8 + n > size:
        raise _bad_file(path, f"a header length of {n:,} bytes runs past the end of the "
                              f"{size:,}-byte file")
    raw = f.read(n)
    if len(raw) != n:
        raise _bad_file(path, "the file shrank while being read")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise _bad_file(path, f"the header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise _bad_file(path, "the header is not a JSON object")
    metadata = header.pop(METADATA_KEY, None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()):
        raise _bad_file(path, f"{METADATA_KEY!r} must map strings to strings")
    entries = [_entry(path, name, info) for name, info in header.items()]
    entries.sort(key=lambda e: (e[3], e[4]))
    expected = 0
    for name, _, _, begin, end in entries:
        if begin != expected:
            raise _bad_file(path, f"tensor {name!r}: its bytes start at {begin}, not at "
                                  f"{expected} where the previous tensor's end (the "
                                  "tensors' byte ranges must tile the data)")
        expected = end
    data = size - 8 - n
    if expected != data:
        raise _bad_file(path, f"the tensors take {expected:,} bytes but {data:,} follow "
                              "the header")
    return entries, metadata, 8 + n


def _entry(path: str, name: str, info) -> tuple:
    if not isinstance(info, dict):
        raise _bad_file(path, f"tensor {name!r}: expected an object with dtype, shape and "
                              "data_offsets")
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(code, str):
        raise _bad_file(path, f"tensor {name!r}: dtype must be a string, got {code!r}")
    if code in _ITEMSIZE:
        bits = 8 * _ITEMSIZE[code]
    elif code in _CONVERTED:
        bits = 8 * _CONVERTED[code][0]
    elif code in _REFUSED:  # refused by load, but the header stays readable
        bits = _REFUSED[code][0]
    else:
        raise _bad_file(path, f"tensor {name!r}: unknown dtype {code!r}")
    if not (isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)):
        raise _bad_file(path, f"tensor {name!r}: shape must be a list of non-negative "
                              f"integers, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))
            and 0 <= offsets[0] <= offsets[1]):
        raise _bad_file(path, f"tensor {name!r}: data_offsets must be [begin, end] with "
                              f"0 <= begin <= end, got {offsets!r}")
    extent = bits * math.prod(d for d in shape if d)  # what an allocator must index
    if extent >= 2**64:
        raise _bad_file(path, f"tensor {name!r}: shape {shape} is too large to allocate")
    nbits = bits * math.prod(shape)
    nbytes = nbits // 8
    if nbits % 8 or nbytes != offsets[1] - offsets[0]:
        raise _bad_file(path, f"tensor {name!r}: {code} of shape {shape} takes {nbytes} "
                              f"bytes, but data_offsets {offsets} give "
                              f"{offsets[1] - offsets[0]}")
    return name, code, tuple(shape), offsets[0], offsets[1]


_BOOL_BYTE = bytes([0] + [1] * 255)  # any nonzero byte is True, stored as the canonical 1


def _read_tensor(path: str, f, name: str, code: str, shape: tuple, start: int,
                 nbytes: int):
    if code in _NATIVE and code != "BOOL":
        t = ta.empty(shape, dtype=_NATIVE[code])
        if nbytes:
            f.seek(start)
            if f.readinto(memoryview(t.numpy()).cast("B")) != nbytes:
                raise _bad_file(path, f"tensor {name!r}: the file shrank while being read")
        return t
    f.seek(start)
    raw = f.read(nbytes)
    if len(raw) != nbytes:
        raise _bad_file(path, f"tensor {name!r}: the file shrank while being read")
    if code == "BOOL":
        dtype, data = ta.bool, raw.translate(_BOOL_BYTE)
    else:
        _, dtype, convert = _CONVERTED[code]
        data = convert(raw)
    t = ta.empty(shape, dtype=dtype)
    if nbytes:
        memoryview(t.numpy()).cast("B")[:] = data
    return t


# ---------------------------------------------------------------------- nested state
def flatten_state(state, prefix: str = "") -> tuple[dict, str]:
    """(tensors, layout) for a nested state of dicts, lists, tuples, numbers, strings, None and
    Tensors: tensors are named `prefix` + their path ("state.0.exp_avg"), and `layout` is a
    JSON string of the rest, with each tensor replaced by its name. Store the tensors with
    `save` and the layout in its metadata; `unflatten_state` rebuilds the original."""
    tensors: dict = {}

    def encode(obj, path: str):
        if isinstance(obj, ta.Tensor):
            if prefix + path in tensors:
                raise ValueError(f"flatten_state: two tensors would be named {prefix + path!r}")
            tensors[prefix + path] = obj
            return {"tensor": prefix + path}
        if isinstance(obj, dict):  # keys keep their type (int keys of optimizer state)
            bad = [k for k in obj if not isinstance(k, (str, int))]
            if bad:
                raise TypeError(f"flatten_state: dict keys must be str or int, got {bad!r}")
            return {"dict": [[k, encode(v, f"{path}.{k}" if path else str(k))]
                             for k, v in obj.items()]}
        if isinstance(obj, (list, tuple)):
            kind = "tuple" if isinstance(obj, tuple) else "list"
            return {kind: [encode(v, f"{path}.{i}" if path else str(i))
                           for i, v in enumerate(obj)]}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"value": obj}
        raise TypeError(f"flatten_state: cannot store a {type(obj).__name__} at {path!r}")

    layout = json.dumps(encode(state, ""))
    return tensors, layout


def unflatten_state(tensors: dict, layout: str):
    """The nested state that flatten_state took apart."""

    def decode(node):
        (kind, body), = node.items()
        if kind == "tensor":
            return tensors[body]
        if kind == "dict":
            return {k: decode(v) for k, v in body}
        if kind in ("list", "tuple"):
            items = [decode(v) for v in body]
            return tuple(items) if kind == "tuple" else items
        return body

    return decode(json.loads(layout))
