"""Checkpoints in the safetensors format: tensors by name, a JSON header, no pickle.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype,
shape, byte range; plus a "__metadata__" dict of strings) and the raw bytes. Loading one
parses JSON and copies bytes, so it cannot execute anything; files PyTorch writes with
`safetensors.torch.save_file` load here by name, and ours load there.

- `save` moves tensors to the CPU, keeps their dtype, and writes atomically: to a temporary
  file in the same directory, fsync'ed, then `os.replace`d over the target, so a crash
  mid-save leaves the old checkpoint whole.
- Tied or shared tensors (GPT's `transformer.wte.weight` is `lm_head.weight`) are written
  once per name, each its own copy of the bytes; loading gives separate tensors, and a
  Module's `load_state_dict` copies both into the one tied parameter (same values).
- `flatten_state` / `unflatten_state` turn a nested state (an optimizer's state_dict, a
  sampler's state, step counters) into named tensors plus a JSON string for the metadata.
"""

from __future__ import annotations

import json
import os
import secrets

import tinygrad_attn as ta


def _safetensors():
    try:
        import safetensors
        import safetensors.numpy
    except ImportError as e:  # an optional dependency: pip install tinygrad_attn[train]
        raise ImportError(
            "checkpoints need the `safetensors` package: pip install safetensors"
        ) from e
    return safetensors


def save(state_dict: dict, path, metadata: dict | None = None) -> None:
    """Write `state_dict` (name -> Tensor) to `path` as safetensors, atomically.

    `metadata` is a dict of strings stored in the header (use json.dumps for structures).
    """
    st = _safetensors()
    path = os.fspath(path)
    arrays = {}
    for name, t in state_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"save({path!r}): tensor names must be str, got {name!r}")
        if not isinstance(t, ta.Tensor):
            raise TypeError(f"save({path!r}): {name!r} is a {type(t).__name__}, not a Tensor")
        # contiguous() copies only views that need it; safetensors reads raw dense bytes
        arrays[name] = t.detach().cpu().contiguous().numpy()
    if metadata is not None:
        bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise TypeError(f"save({path!r}): metadata keys and values must be str: {bad}")

    directory = os.path.dirname(os.path.abspath(path))
    # a fresh name next to the target (os.replace can't cross filesystems); created here,
    # not by mkstemp, to learn the usual permissions (0o666 less the umask)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        mode = os.stat(tmp).st_mode & 0o777
        st.numpy.save_file(arrays, tmp, metadata=metadata)
        os.chmod(tmp, mode)  # recent safetensors write a fresh 0o600 file: give the usual mode
        with open(tmp, "ab") as f:  # the bytes reach the disk before the rename
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


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


def load(path, device: str = "cpu") -> dict:
    """Read a safetensors file into {name: Tensor} on `device`.

    A file that is truncated, has a corrupted header or is not safetensors at all raises
    ValueError naming the file and the problem.
    """
    st = _safetensors()
    path = os.fspath(path)
    out = {}
    with _open(st, path) as f:
        for name in f.keys():
            try:
                arr = f.get_tensor(name)
            except Exception as e:  # noqa: BLE001 - safetensors' errors are not one class
                raise _bad_file(path, f"tensor {name!r}: {e}") from None
            if not arr.flags.writeable:  # parameters and optimizer state are written in place
                arr = arr.copy()
            t = ta.from_numpy(arr)
            out[name] = t if device == "cpu" else t.to(device)
    return out


def load_metadata(path) -> dict:
    """The header's string metadata (empty if the file has none)."""
    st = _safetensors()
    path = os.fspath(path)
    with _open(st, path) as f:
        return dict(f.metadata() or {})


def _open(st, path: str):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint file at {path!r}")
    if os.path.getsize(path) < 8:
        raise _bad_file(path, f"only {os.path.getsize(path)} bytes, too short for a header")
    try:
        return st.safe_open(path, framework="numpy")
    except Exception as e:  # noqa: BLE001 - SafetensorError, or OSError from the mmap
        raise _bad_file(path, str(e)) from None


def _bad_file(path: str, problem: str) -> ValueError:
    return ValueError(
        f"{path!r} is not a readable safetensors checkpoint ({problem}); it may be truncated, "
        "corrupted, or another format (pickled .pt/.pth files are never loaded)"
    )


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
