"""Checkpoints without pickle: `ta.save(obj, f)` / `ta.load(f, map_location=...)`, as torch's.

`obj` is any nesting of dicts (str or int keys), OrderedDicts, lists and tuples of Tensors,
ints, floats (inf and nan too), bools, None and strings: a model's and an optimizer's
state_dicts, the step, the config. It is written as ONE safetensors file
(safetensors_format.py): each tensor under its key path joined by dots
("model.transformer.wte.weight", "optimizer.state.0.exp_avg"), so any safetensors reader
sees the tensors by name, and the structure as JSON in the header's metadata, under
"tinygrad_attn.checkpoint". Loading parses JSON and copies bytes: nothing in a file can run.

- Anything else (a function, an object, a NumPy array, a set, bytes) is refused by `save`
  with a TypeError naming its key path, before anything is written: an existing file at the
  path is left as it was (a path is written atomically, as save_file writes).
- Each tensor is saved as its values, on the CPU, dense: views do not keep their storage
  sharing (torch keeps it), and a tensor that appears twice loads as two tensors. Its dtype,
  its device ("cuda:0") and requires_grad are kept, as torch keeps them.
- `load` gives back the same structure: dict or OrderedDict, int keys, tuples, bools apart
  from ints. A safetensors file without the structure (nn.save's, safetensors.torch's)
  loads as a flat name -> tensor dict. A torch.save file is refused with the conversion.
- `flatten_state` / `unflatten_state` are the same encoding for callers that keep the
  tensors and the structure apart (nn's trainer stores the layout in its own metadata key).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import types

from .. import backend
from ..tensor import Tensor
from .safetensors_format import (  # noqa: F401 - the file format's API, re-exported
    CONVERT_STATE_DICT,
    METADATA_KEY,
    CheckpointError,
    check_text,
    encode,
    load_file,
    load_metadata,
    opened,
    save_file,
    write_path,
    write_stream,
)

STRUCTURE_KEY = "tinygrad_attn.checkpoint"
FORMAT_VERSION = 1
_STORES = ("stores tensors, numbers, strings, bools, None and dicts/lists/tuples of them "
           "(no pickle)")


# ---------------------------------------------------------------------------- encoding
def _key_text(key) -> str:
    return f"[{json.dumps(key, ensure_ascii=False)}]" if isinstance(key, str) else f"[{key}]"


def _refusal(obj) -> str:
    """'a function', 'a numpy.ndarray', ... and what to store instead, where that is clear."""
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return "a function"
    if isinstance(obj, type):
        return f"a class ({obj.__qualname__})"
    if isinstance(obj, types.ModuleType):
        return f"a module ({obj.__name__})"
    cls = type(obj)
    name = cls.__qualname__ if cls.__module__ == "builtins" else \
        f"{cls.__module__}.{cls.__qualname__}"
    hint = ""
    if cls.__module__ == "numpy" and cls.__name__ == "ndarray":
        hint = "; wrap it with ta.from_numpy(...) to store it as a tensor"
    elif cls.__module__.split(".")[0] == "torch" and hasattr(obj, "__dlpack__"):
        hint = "; convert it with ta.from_dlpack(t.detach().cpu())"
    elif cls.__module__ == "numpy" and callable(getattr(obj, "item", None)):
        hint = "; store .item(), a Python number"
    elif isinstance(obj, (set, frozenset)):
        hint = "; store it as a list"
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        hint = "; store it as a str, or as a uint8 tensor"
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        hint = "; store ._asdict() or tuple(...)"
    elif isinstance(obj, (dict, list, tuple)):
        hint = f"; convert it with {type(obj).__mro__[-2].__name__}(...)"
    elif dataclasses.is_dataclass(obj):
        hint = "; store dataclasses.asdict(...)"
    elif callable(getattr(obj, "state_dict", None)):
        hint = "; store its state_dict()"
    elif callable(obj):
        return f"a callable {name}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}{hint}"


class _Flattener:
    """Turns a nested object into (JSON-able layout, name -> Tensor), refusing anything else.

    Layout nodes: {"tensor": name} (with "device" and "requires_grad" when `tensor_info`),
    {"dict": [[key, node], ...]}, {"ordered_dict": [...]}, {"list": [...]}, {"tuple": [...]},
    {"value": None/bool/int/finite float/str}, {"float": "inf" | "-inf" | "nan"}.
    """

    def __init__(self, who: str, root: str, prefix: str = "", rename: bool = False,
                 tensor_info: bool = False):
        self.who, self.root, self.prefix = who, root, prefix
        self.rename, self.tensor_info = rename, tensor_info
        self.tensors: dict = {}
        self._open: set = set()  # ids of the containers on the current path (cycles)

    def _where(self, keys) -> str:
        return self.root + "".join(map(_key_text, keys))

    def _name(self, keys) -> str:
        name = self.prefix + ".".join(str(k) for k in keys)
        if self.rename:  # collisions ({"a.b": t, "a": {"b": u}}) get a suffix, never refused
            name = name or "tensor"
            base, n = name, 1
            while name in self.tensors or name == METADATA_KEY:
                name, n = f"{base}#{n}", n + 1
        elif name in self.tensors:
            raise ValueError(f"{self.who}: two tensors would be named {name!r}")
        return name

    def encode(self, obj, keys=()):
        if isinstance(obj, Tensor):
            name = self._name(keys)
            check_text(self.who, f"the tensor name of {self._where(keys)}", name)
            self.tensors[name] = obj
            node = {"tensor": name}
            if self.tensor_info and obj.device != "cpu":
                node["device"] = obj.device
            if self.tensor_info and obj.requires_grad:
                node["requires_grad"] = True
            return node
        if obj is None or type(obj) is bool:
            return {"value": obj}
        if isinstance(obj, int) and not isinstance(obj, bool):
            return {"value": int(obj)}
        if isinstance(obj, float):
            value = float(obj)
            return {"value": value} if math.isfinite(value) else {"float": str(value)}
        if isinstance(obj, str):
            check_text(self.who, f"the string at {self._where(keys)}", obj)
            return {"value": str(obj)}
        kind = {dict: "dict", collections.OrderedDict: "ordered_dict", list: "list",
                tuple: "tuple"}.get(type(obj))
        if kind is None:
            raise TypeError(f"{self.who}: {self._where(keys)} is {_refusal(obj)}; "
                            f"{self.who} {_STORES}")
        if id(obj) in self._open:
            raise ValueError(f"{self.who}: {self._where(keys)} contains itself; a checkpoint "
                             "must be a tree")
        self._open.add(id(obj))
        try:
            if kind in ("list", "tuple"):
                return {kind: [self.encode(v, (*keys, i)) for i, v in enumerate(obj)]}
            items = []
            for k, v in obj.items():
                if not isinstance(k, (str, int)):
                    raise TypeError(f"{self.who}: {self._where(keys)} has the key {k!r}, a "
                                    f"{type(k).__name__}; dict keys must be str or int, and "
                                    f"{self.who} {_STORES}")
                if isinstance(k, str):
                    check_text(self.who, f"a key of {self._where(keys)}", k)
                key = k if type(k) is bool else int(k) if isinstance(k, int) else str(k)
                items.append([key, self.encode(v, (*keys, k))])
            return {kind: items}
        finally:
            self._open.discard(id(obj))


def flatten_state(state, prefix: str = "") -> tuple[dict, str]:
    """(tensors, layout) for a nested state of dicts, lists, tuples, numbers, strings, None and
    Tensors: tensors are named `prefix` + their path ("state.0.exp_avg"), and `layout` is a
    JSON string of the rest, with each tensor replaced by its name. Store the tensors with
    `save_file` and the layout in its metadata; `unflatten_state` rebuilds the original."""
    flat = _Flattener("flatten_state", "state", prefix)
    layout = json.dumps(flat.encode(state), allow_nan=False)
    return flat.tensors, layout


def _decode(node, tensor_of):
    if "tensor" in node:
        return tensor_of(node)
    (kind, body), = node.items()
    if kind in ("dict", "ordered_dict"):
        items = [(k, _decode(v, tensor_of)) for k, v in body]
        return dict(items) if kind == "dict" else collections.OrderedDict(items)
    if kind in ("list", "tuple"):
        items = [_decode(v, tensor_of) for v in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "float":
        return float(body)
    if kind == "value":
        return body
    raise ValueError(f"unknown node kind {kind!r}")


def unflatten_state(tensors: dict, layout: str):
    """The nested state that flatten_state took apart."""
    return _decode(json.loads(layout), lambda node: tensors[node["tensor"]])


# ---------------------------------------------------------------------------- save / load
def save(obj, f, pickle_module=None, pickle_protocol: int = 2,
         _use_new_zipfile_serialization: bool = True,
         _disable_byteorder_record: bool = False) -> None:
    """Save `obj` (a nesting of dicts, lists, tuples, Tensors, numbers, strings, bools and
    None) to `f`, a path or a writable binary file object, as one safetensors file.

    Anything else is refused with a TypeError naming its key path, before anything is
    written. The pickle arguments are accepted for torch's signature and unused.

        ta.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                 "iter_num": 5, "config": config}, "ckpt.safetensors")
    """
    is_path = isinstance(f, (str, os.PathLike))
    if not is_path and not callable(getattr(f, "write", None)):
        raise TypeError(f"ta.save: f must be a path (str or os.PathLike) or a writable binary "
                        f"file object, got a {type(f).__name__}")
    flat = _Flattener("ta.save", "checkpoint", rename=True, tensor_info=True)
    root = flat.encode(obj)
    structure = json.dumps({"version": FORMAT_VERSION, "root": root}, ensure_ascii=False,
                           separators=(",", ":"), allow_nan=False)
    metadata = {"format": "pt", STRUCTURE_KEY: structure}  # "pt": as safetensors.torch marks
    header, arrays = encode("ta.save", flat.tensors, metadata)
    if is_path:
        write_path(os.fspath(f), header, arrays)
    else:
        write_stream(f, header, arrays)


def load(f, map_location=None, pickle_module=None, *, weights_only: bool | None = None,
         mmap: bool | None = None, **pickle_load_args):
    """What `save` wrote to `f` (a path or a readable binary file object), the same structure.

    `map_location` as torch's: None (each tensor back on the device it was saved from),
    a device ("cpu", "cuda:0", ta.device), a dict {saved: target} ({"cuda:0": "cpu"}), or a
    callable (tensor on the CPU, saved location) -> tensor or None (None: the saved device).
    A safetensors file without the structure loads as {name: tensor}. Nothing is unpickled
    whatever `weights_only` says; `mmap` and the pickle arguments are accepted and unused
    (the tensors are read into memory).
    """
    if mmap and not isinstance(f, (str, os.PathLike)):
        raise ValueError("f must be a file path in order to use the mmap argument")
    restore = _restore_location(map_location)
    with opened(f) as reader:
        entries, metadata = reader.header()
        by_name = {entry[0]: entry for entry in entries}
        layout = _layout(reader.label, metadata, entries)
        nodes = _tensor_nodes(reader.label, layout)
        for node in nodes:
            if node["tensor"] not in by_name:
                raise CheckpointError(f"{reader.label}: its structure names the tensor "
                                      f"{node['tensor']!r}, which the file does not hold")
            if not callable(map_location):
                _check_available(reader.label, node.get("device", "cpu"),
                                 restore(node.get("device", "cpu")))
        reader.check_loadable([by_name[node["tensor"]] for node in nodes])

        def tensor_of(node):
            t = reader.tensor(by_name[node["tensor"]])
            t = _place(t, node.get("device", "cpu"), map_location, restore)
            if node.get("requires_grad"):
                t.requires_grad_(True)
            return t

        return _decode(layout, tensor_of)


def _layout(label: str, metadata: dict, entries: list):
    """The structure of the file: ours from the metadata, or a flat dict of its tensors."""
    text = metadata.get(STRUCTURE_KEY)
    if text is None:
        return {"dict": [[entry[0], {"tensor": entry[0]}] for entry in entries]}
    try:
        spec = json.loads(text)
        version, root = spec["version"], spec["root"]
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"{label}: its {STRUCTURE_KEY!r} metadata is not the structure "
                              f"ta.save writes ({type(e).__name__}: {e})") from None
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{label}: written in checkpoint format version {version!r}; "
                              f"this engine reads version {FORMAT_VERSION}")
    return root


_SCALAR = (type(None), bool, int, float, str)


def _tensor_nodes(label: str, root) -> list:
    """The tensor nodes of a layout, after checking that every node is one `save` writes,
    so that decoding it cannot fail on a file edited by hand."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        problem = _node_problem(node)
        if problem:
            raise CheckpointError(f"{label}: its structure metadata is malformed ({problem}: "
                                  f"{json.dumps(node)[:200]})")
        if "tensor" in node:
            out.append(node)
            continue
        (kind, body), = node.items()
        if kind in ("dict", "ordered_dict"):
            stack.extend(value for _, value in reversed(body))
        elif kind in ("list", "tuple"):
            stack.extend(reversed(body))
    return out


def _node_problem(node) -> str | None:
    if not isinstance(node, dict):
        return "a node that is not an object"
    if "tensor" in node:
        if not (isinstance(node["tensor"], str)
                and isinstance(node.get("device", "cpu"), str)
                and isinstance(node.get("requires_grad", False), bool)):
            return "a tensor node with a bad name, device or requires_grad"
        return None
    if len(node) != 1:
        return "a node with other than one kind"
    (kind, body), = node.items()
    if kind in ("dict", "ordered_dict"):
        if not (isinstance(body, list) and all(
                isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
                for item in body)):
            return f"a {kind} node whose items are not [key, node] pairs"
    elif kind in ("list", "tuple"):
        if not isinstance(body, list):
            return f"a {kind} node whose items are not a list"
    elif kind == "value":
        if not isinstance(body, _SCALAR):
            return "a value node that is not a scalar"
    elif kind == "float":
        if body not in ("inf", "-inf", "nan"):
            return "a float node that is not inf, -inf or nan"
    else:
        return f"an unknown node kind {kind!r}"
    return None


def _restore_location(map_location):
    """saved location -> target device, for the map_location forms that name one."""
    if map_location is None or callable(map_location):
        return lambda saved: backend.canonical_device(saved, "the saved device")
    if isinstance(map_location, dict):
        return lambda saved: backend.canonical_device(map_location.get(saved, saved),
                                                      "map_location")
    target = backend.canonical_device(map_location, "map_location")
    return lambda saved: target


def _check_available(label: str, saved: str, target: str) -> None:
    if target == "cpu":
        return
    if not backend.cuda_is_available():
        raise RuntimeError(
            f"ta.load: {label} holds tensors saved on {saved}, to be loaded on {target}, but "
            "CUDA is not available here (no CuPy or no GPU); pass map_location='cpu' to load "
            "them on the CPU")
    index = int(target.split(":")[1])
    if index >= backend.cuda_device_count():
        raise RuntimeError(
            f"ta.load: {label} holds tensors for {target}, but this machine has "
            f"{backend.cuda_device_count()} GPU(s); pass map_location to choose another")


def _place(t: Tensor, saved: str, map_location, restore) -> Tensor:
    if callable(map_location):
        placed = map_location(t, saved)
        if placed is None:
            placed = t if saved == "cpu" else t.to(saved)
        if not isinstance(placed, Tensor):
            raise TypeError(f"ta.load: map_location returned a {type(placed).__name__}; it "
                            "must return a Tensor (or None for the saved device)")
        return placed
    target = restore(saved)
    return t if target == "cpu" else t.to(target)


__all__ = ["save", "load", "save_file", "load_file", "load_metadata", "flatten_state",
           "unflatten_state", "CheckpointError", "CONVERT_STATE_DICT", "STRUCTURE_KEY"]
