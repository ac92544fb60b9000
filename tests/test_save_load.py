"""ta.save / ta.load: whole training checkpoints as one safetensors file, without pickle.

Round trips of nested checkpoints (types, keys and values exact), resuming a run from one,
the refusals (with their key paths, and nothing written), file objects, map_location, and
interchange with torch (its safetensors reader; the conversion of a torch.save file).
"""

import collections
import io
import json
import math
import os
import re
import shlex

import numpy as np
import pytest
from conftest import TINY_GPT

import nn
import tinygrad_attn as ta
from tinygrad_attn.serialization import (
    CONVERT_STATE_DICT,
    STRUCTURE_KEY,
    CheckpointError,
    load,
    save,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "checkpoints.md")


def assert_same(a, b, where="checkpoint"):
    """Equal structure, equal types (tuple is not list, True is not 1), equal tensors."""
    assert type(b) is type(a), f"{where}: {type(a).__name__} became {type(b).__name__}"
    if isinstance(a, ta.Tensor):
        assert (b.dtype, b.shape, b.device) == (a.dtype, a.shape, a.device), where
        assert b.requires_grad == a.requires_grad, where
        np.testing.assert_array_equal(b.detach().cpu().numpy(), a.detach().cpu().numpy(),
                                      err_msg=where)
    elif isinstance(a, dict):
        assert list(b) == list(a), where  # the same keys, of the same types, in order
        for k in a:
            assert type(list(b)[list(a).index(k)]) is type(k), f"{where}[{k!r}] key type"
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(b) == len(a), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert b == a, where
        if isinstance(a, float):
            assert math.copysign(1.0, b) == math.copysign(1.0, a), where  # -0.0 stays


def _gpt():
    return nn.GPT(nn.GPTConfig(**TINY_GPT)).double()


def _batches(n):
    rng = np.random.default_rng(0)
    return [(ta.tensor(rng.integers(0, TINY_GPT["vocab_size"], (2, 8))),
             ta.tensor(rng.integers(0, TINY_GPT["vocab_size"], (2, 8)))) for _ in range(n)]


def _optimizer(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return nn.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                           {"params": other, "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.95))


def _train(model, opt, batches):
    losses = []
    for x, y in batches:
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _checkpoint(model, opt):
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "model_args": dict(TINY_GPT, bias=True, dropout=0.0),
        "iter_num": 5,
        "best_val_loss": 1.23,
        "config": {"lr": 1e-2, "betas": (0.9, 0.95), "decay": True, "warmup": None,
                   "schedule": [1, 2.5, "cosine"], "nested": {"deep": {"x": -0.0}}},
    }


# ----------------------------------------------------------------------------- round trips
def test_a_training_checkpoint_round_trips_exactly(tmp_path):
    model = _gpt()
    opt = _optimizer(model)
    _train(model, opt, _batches(2))
    ckpt = _checkpoint(model, opt)
    path = tmp_path / "ckpt.pt"
    save(ckpt, path)
    back = load(path)
    assert_same(ckpt, back)
    assert type(back["model"]) is collections.OrderedDict  # as state_dict() returns it
    assert sorted(back["optimizer"]["state"]) == list(range(len(list(model.parameters()))))
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    # loaded tensors own their memory: training the loaded copy leaves the file as it was
    with ta.no_grad():
        back["model"]["transformer.wte.weight"].add_(1.0)
    again = load(path)["model"]["transformer.wte.weight"]
    np.testing.assert_array_equal(again.numpy(), model.transformer.wte.weight.detach().numpy())


def test_values_of_every_kind_keep_their_types():
    t = ta.arange(12, dtype=ta.float32).reshape(3, 4)
    obj = {
        "floats": [0.1, -0.0, math.inf, -math.inf, math.nan, 1e-310, 1.7976931348623157e308],
        "ints": [0, -1, 2**63 - 1, 2**80, -(2**70)],
        "bools": (True, False), "none": None, "text": "ü 日本 \"q\" \\n",
        1: "an int key", 0: {2: [3]}, "bool_keys": {True: 1, False: 0}, "": "an empty key",
        "tuple_in_list": [(1,), ()], "empty": {"d": {}, "l": [], "t": ()},
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        "tensors": {"0d": ta.tensor(2.5, dtype=ta.float64), "empty": ta.zeros(0, 3),
                    "view": t[:, 1::2], "transposed": t.T, "expanded": t[:1].expand(4, 4),
                    "grad": ta.randn(2, requires_grad=True)},
        "dtypes": [ta.tensor([1, 0, 1], dtype=dt) for dt in (
            ta.bool, ta.uint8, ta.int8, ta.int16, ta.int32, ta.int64, ta.float16, ta.float32,
            ta.float64)],
    }
    f = io.BytesIO()
    save(obj, f)
    f.seek(0)
    back = load(f)
    assert_same(obj, back)
    assert back["tensors"]["grad"].requires_grad and back["tensors"]["grad"].is_leaf
    assert back["tensors"]["view"].is_contiguous()  # saved as its values
    assert [k for k in back if not isinstance(k, str)] == [1, 0]
    assert [type(k) for k in back["bool_keys"]] == [bool, bool]


def test_a_bare_tensor_a_list_and_a_number_round_trip(tmp_path):
    for obj in (ta.randn(3, 2), [ta.ones(1), ta.zeros(2)], 7, "text", None, (1.5,)):
        save(obj, tmp_path / "x.pt")
        assert_same(obj, load(tmp_path / "x.pt"))


def test_tensor_names_are_the_key_paths(tmp_path):
    model = nn.Linear(3, 2)
    opt = nn.optim.AdamW(model.parameters(), lr=0.1)
    model(ta.randn(4, 3)).sum().backward()
    opt.step()
    path = tmp_path / "ckpt.safetensors"
    save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}, path)
    flat = nn.load(path)  # any safetensors reader sees the tensors by these names
    assert sorted(k for k in flat if k.startswith("model.")) == ["model.bias", "model.weight"]
    assert {"optimizer.state.0.exp_avg", "optimizer.state.0.exp_avg_sq",
            "optimizer.state.1.exp_avg", "optimizer.state.1.exp_avg_sq"} <= set(flat)
    assert all(k.startswith(("model.", "optimizer.state.")) for k in flat)
    np.testing.assert_array_equal(flat["model.weight"].numpy(), model.weight.detach().numpy())
    assert json.loads(nn.load_metadata(path)[STRUCTURE_KEY])["version"] == 1


def test_colliding_and_reserved_names_still_round_trip(tmp_path):
    a, b, c = ta.ones(1), ta.zeros(2), ta.arange(3)
    obj = {"a.b": a, "a": {"b": b}, "__metadata__": c, "x": [a, a]}
    save(obj, tmp_path / "c.pt")
    back = load(tmp_path / "c.pt")
    assert_same(obj, back)
    assert back["x"][0] is not back["x"][1]  # each occurrence is its own tensor
    assert sorted(nn.load(tmp_path / "c.pt")) == ["__metadata__#1", "a.b", "a.b#1", "x.0",
                                                  "x.1"]


# ----------------------------------------------------------------------------- resume
def test_resuming_from_a_checkpoint_equals_training_straight_through(tmp_path):
    batches = _batches(6)
    ta.manual_seed(0)
    straight = _gpt()
    opt = _optimizer(straight)
    losses = _train(straight, opt, batches)

    ta.manual_seed(0)
    first = _gpt()
    first_opt = _optimizer(first)
    first_losses = _train(first, first_opt, batches[:3])
    save({"model": first.state_dict(), "optimizer": first_opt.state_dict(), "iter_num": 3},
         tmp_path / "ckpt.pt")
    del first, first_opt

    ta.manual_seed(1)  # a fresh model with other weights: everything comes from the file
    ckpt = load(tmp_path / "ckpt.pt", map_location="cpu")
    resumed = _gpt()
    resumed.load_state_dict(ckpt["model"])
    resumed_opt = _optimizer(resumed)
    resumed_opt.load_state_dict(ckpt["optimizer"])
    assert ckpt["iter_num"] == 3
    later = _train(resumed, resumed_opt, batches[3:])
    assert first_losses + later == losses
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy(), err_msg=name)


# ----------------------------------------------------------------------------- refusals
# an entry that holds tensors is a function that builds it: made at import, its tensors would
# stay alive through the whole suite (and count in other tests' memory profiles)
REFUSED = [
    ({"config": {"act": lambda x: x}}, r'checkpoint\["config"\]\["act"\] is a function'),
    ({"config": {"act": print}}, r'\["act"\] is a function'),
    ({"w": [1, np.ones(2)]}, r'checkpoint\["w"\]\[1\] is a numpy\.ndarray; wrap it'),
    ({"n": np.int64(3)}, r'checkpoint\["n"\] is a numpy\.int64; store \.item\(\)'),
    ({"ids": {1, 2}}, r'checkpoint\["ids"\] is a set; store it as a list'),
    ({"raw": b"\x00"}, r'checkpoint\["raw"\] is a bytes; store it as a str'),
    ({"obj": object()}, r'checkpoint\["obj"\] is an object'),
    (lambda: {"m": nn.Linear(2, 2)}, r'checkpoint\["m"\] is a nn\.layers\.Linear; store its state'),
    ({"dd": collections.defaultdict(int)}, r"is a collections\.defaultdict; convert it with "
                                           r"dict"),
    ({"dt": ta.float32}, r'checkpoint\["dt"\] is a tinygrad_attn'),
    ({0: {1.5: "x"}}, r"checkpoint\[0\] has the key 1\.5, a float; dict keys must be str or"),
    (lambda: [(1, ta.ones(1), range(3))], r"checkpoint\[0\]\[2\] is a range"),
]


@pytest.mark.parametrize("obj,message", REFUSED)
def test_anything_else_is_refused_at_save_naming_its_key_path(tmp_path, obj, message):
    path = tmp_path / "ckpt.pt"
    save({"old": ta.ones(2)}, path)
    before = path.read_bytes()
    obj = obj() if callable(obj) else obj
    with pytest.raises(TypeError, match=message) as info:
        save(obj, path)
    assert "ta.save stores tensors, numbers, strings, bools, None and dicts/lists/tuples of " \
           "them (no pickle)" in str(info.value)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ckpt.pt"]
    f = io.BytesIO()
    with pytest.raises(TypeError, match=message):
        save(obj, f)
    assert f.getvalue() == b""  # nothing reached the stream either


def test_a_cycle_and_bad_text_are_refused(tmp_path):
    loop = {"a": []}
    loop["a"].append(loop)
    with pytest.raises(ValueError, match=r'checkpoint\["a"\]\[0\] contains itself'):
        save(loop, tmp_path / "x.pt")
    with pytest.raises(ValueError, match=r'the string at checkpoint\["s"\]'):
        save({"s": "\udc80"}, tmp_path / "x.pt")
    with pytest.raises(TypeError, match="f must be a path"):
        save({}, 3)
    assert not os.listdir(tmp_path)


# ----------------------------------------------------------------------------- bad files
def test_truncated_or_corrupt_files_name_the_path(tmp_path):
    save({"w": ta.randn(8, 8), "step": 3}, tmp_path / "good.pt")
    data = (tmp_path / "good.pt").read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 3):
        bad = tmp_path / f"cut{cut}.pt"
        bad.write_bytes(data[:cut])
        with pytest.raises(RuntimeError, match=f"cut{cut}.pt"):  # torch.load's type
            load(bad)
        with pytest.raises(ValueError, match="<BytesIO>"):  # and nn.load's
            load(io.BytesIO(data[:cut]))
    n = int.from_bytes(data[:8], "little")
    broken = data[:8] + data[8:8 + n].replace(b'\\"root\\"', b'\\"rout\\"') + data[8 + n:]
    assert broken != data
    (tmp_path / "meta.pt").write_bytes(broken)
    with pytest.raises(CheckpointError, match="meta.pt.*not the structure ta.save writes"):
        load(tmp_path / "meta.pt")
    edited = data[:8] + data[8:8 + n].replace(b'\\"value\\"', b'\\"vague\\"') + data[8 + n:]
    assert edited != data
    (tmp_path / "kind.pt").write_bytes(edited)
    with pytest.raises(CheckpointError, match="kind.pt.*malformed.*unknown node kind 'vague'"):
        load(tmp_path / "kind.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load(tmp_path / "missing.pt")


def test_a_flat_safetensors_file_loads_as_a_name_to_tensor_dict(tmp_path):
    state = {"b": ta.ones(2), "a": ta.arange(3)}
    nn.save(state, tmp_path / "flat.safetensors", metadata={"step": "4"})
    back = load(tmp_path / "flat.safetensors")
    assert type(back) is dict and sorted(back) == ["a", "b"]
    for k in state:
        assert_same(state[k], back[k])


def test_load_reads_a_stream_from_where_it_stands():
    f = io.BytesIO()
    f.write(b"prefix")
    save({"x": ta.ones(3)}, f)
    save([1, 2], f)  # two checkpoints back to back in one stream
    f.seek(len(b"prefix"))
    with pytest.raises(CheckpointError, match="the tensors take"):
        load(f)  # the first checkpoint's header says nothing follows it
    one = io.BytesIO()
    save({"x": ta.ones(3)}, one)
    one.seek(0)
    assert load(one)["x"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="must be a file path in order to use the mmap"):
        load(io.BytesIO(one.getvalue()), mmap=True)


def test_weights_only_false_still_never_unpickles(tmp_path):
    import pickle

    marker = tmp_path / "ran"
    bad = tmp_path / "ckpt.pt"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad.write_bytes(pickle.dumps({"w": Exploit()}, protocol=2))
    with pytest.raises(RuntimeError, match=r"ckpt.pt.*a pickle, as torch.save writes"):
        load(bad, weights_only=False)
    assert not marker.exists()


# ----------------------------------------------------------------------------- devices
class _Device:
    """An object with torch.device's two attributes (torch.device itself, say)."""

    def __init__(self, type, index=None):
        self.type, self.index = type, index


def test_save_and_load_are_the_packages_names():
    f = io.BytesIO()
    ta.save({"w": ta.ones(2)}, f)
    f.seek(0)
    assert ta.load(f, map_location=ta.device("cpu"))["w"].tolist() == [1.0, 1.0]
    assert ta.save is save and ta.load is load


def test_map_location_forms_on_the_cpu(tmp_path):
    path = tmp_path / "c.pt"
    save({"w": ta.ones(2)}, path)
    seen = []

    def keep(tensor, location):
        seen.append((tensor.device, location))
        return tensor * 2

    for form in (None, "cpu", "cpu:0", ta.device("cpu"), _Device("cpu"), {"cuda:0": "cpu"}):
        assert load(path, map_location=form)["w"].device == "cpu"
    assert load(path, map_location=keep)["w"].tolist() == [2.0, 2.0]
    assert seen == [("cpu", "cpu")]
    assert load(path, map_location=lambda t, loc: None)["w"].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="unknown device 'tpu' for map_location"):
        load(path, map_location="tpu")
    with pytest.raises(TypeError, match="map_location returned a str"):
        load(path, map_location=lambda t, loc: "cpu")


def test_map_location_for_tensors_saved_on_a_gpu(tmp_path, gpu_device):
    dev = ta.backend.canonical_device(gpu_device)
    obj = {"w": ta.randn(2, 3, device=gpu_device), "c": ta.arange(3), "n": 1}
    path = tmp_path / "gpu.pt"
    save(obj, path)
    host = obj["w"].cpu().numpy()
    assert load(path)["w"].device == dev  # None: back where it was saved
    assert load(path)["c"].device == "cpu"
    for form in ("cpu", {dev: "cpu"}, {dev: ta.device("cpu")}, lambda t, loc: t,
                 ta.device("cpu"), _Device("cpu", 0)):
        w = load(path, map_location=form)["w"]
        assert w.device == "cpu", form
        np.testing.assert_array_equal(w.numpy(), host)
    assert load(path, map_location={"cuda:7": "cpu"})["w"].device == dev  # not its location
    assert load(path, map_location=lambda t, loc: None)["w"].device == dev
    assert load(path, map_location=gpu_device)["c"].device == dev
    assert load(path, map_location=ta.device(dev))["c"].device == dev

    previous = ta.backend._install_array_module(None)  # a machine without CUDA
    try:
        with pytest.raises(RuntimeError, match=r"saved on cuda:0.*map_location='cpu'"):
            load(path)
        assert load(path, map_location="cpu")["w"].device == "cpu"
    finally:
        ta.backend._install_array_module(previous)


# ----------------------------------------------------------------------------- torch
def _torch_like(torch, obj):
    """The same nesting with each ta.Tensor as a torch tensor."""
    if isinstance(obj, ta.Tensor):
        return torch.from_numpy(obj.detach().numpy().copy()).requires_grad_(obj.requires_grad)
    if isinstance(obj, dict):
        return type(obj)((k, _torch_like(torch, v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_torch_like(torch, v) for v in obj)
    return obj


def test_the_same_checkpoint_comes_back_as_torch_gives_it_back(tmp_path):
    """torch.save + torch.load and ta.save + ta.load return the same structure and types."""
    torch = pytest.importorskip("torch")
    model = nn.Linear(3, 2)
    opt = nn.optim.AdamW(model.parameters(), lr=0.1)
    model(ta.randn(4, 3)).sum().backward()
    opt.step()
    ckpt = _checkpoint(model, opt)
    ckpt["flags"] = {0: True, 1: 0, 2: math.nan, 3: (None, "x")}
    ckpt["grad"] = ta.randn(2, requires_grad=True)
    torch.save(_torch_like(torch, ckpt), tmp_path / "torch.pt")
    theirs = torch.load(tmp_path / "torch.pt")
    save(ckpt, tmp_path / "ours.pt")
    ours = load(tmp_path / "ours.pt")

    def compare(a, b, where="checkpoint"):
        if isinstance(a, torch.Tensor):
            assert isinstance(b, ta.Tensor), where
            assert (str(a.dtype)[6:], tuple(a.shape), a.requires_grad) == (
                b.dtype.name, b.shape, b.requires_grad), where
            np.testing.assert_array_equal(b.detach().numpy(), a.detach().numpy())
            return
        assert type(b) is type(a), where
        if isinstance(a, dict):
            assert [(k, type(k)) for k in a] == [(k, type(k)) for k in b], where
            for k in a:
                compare(a[k], b[k], f"{where}[{k!r}]")
        elif isinstance(a, (list, tuple)):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                compare(x, y, f"{where}[{i}]")
        else:
            assert a == b or (a != a and b != b), where

    compare(theirs, ours)


def test_a_file_written_here_loads_in_torch_through_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    model = _gpt()
    opt = _optimizer(model)
    _train(model, opt, _batches(1))
    save(_checkpoint(model, opt), tmp_path / "ckpt.safetensors")
    theirs = st_torch.load_file(str(tmp_path / "ckpt.safetensors"))
    ours = nn.load(tmp_path / "ckpt.safetensors")
    assert sorted(theirs) == sorted(ours)
    assert "model.transformer.wte.weight" in theirs and "optimizer.state.0.exp_avg" in theirs
    for name, t in ours.items():
        assert theirs[name].dtype == getattr(torch, t.dtype.name), name
        np.testing.assert_array_equal(theirs[name].numpy(), t.numpy(), err_msg=name)
    sd = {k[len("model."):]: v for k, v in theirs.items() if k.startswith("model.")}
    for name, p in model.state_dict().items():
        np.testing.assert_array_equal(sd[name].numpy(), p.numpy(), err_msg=name)


def _documented_commands():
    """The `python -c` conversions docs/checkpoints.md gives, as argument lists."""
    text = open(DOC, encoding="utf-8").read()
    return [shlex.split(m) for m in re.findall(r"^(python -c .*)$", text, re.MULTILINE)]


def _run_python_c(argv, tmp_path):
    """Run `python -c CODE ARGS` in this process (torch is imported once per test run)."""
    import sys

    assert argv[:2] == ["python", "-c"], argv
    old = sys.argv
    sys.argv = ["-c", *[str(tmp_path / a) for a in argv[3:]]]
    try:
        exec(compile(argv[2], "<python -c>", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = old


def test_a_torch_save_file_is_refused_with_the_documented_conversion(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors.torch")
    commands = _documented_commands()
    assert shlex.split(CONVERT_STATE_DICT) in commands  # the error shows the docs' line

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    ref[2].weight = torch.nn.Parameter(ref[2].weight.detach().T.contiguous().T)  # strided
    torch.save(ref.state_dict(), tmp_path / "model.pt")
    with pytest.raises(RuntimeError, match=r"model.pt' is a zip archive") as info:
        load(tmp_path / "model.pt")
    assert CONVERT_STATE_DICT in str(info.value)

    _run_python_c(shlex.split(CONVERT_STATE_DICT), tmp_path)  # model.pt -> model.safetensors
    ours = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    ours.load_state_dict(load(tmp_path / "model.safetensors"))
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(ours(ta.tensor(x)).detach().numpy(),
                               ref(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    for name, v in ref.state_dict().items():  # the weights themselves are bit for bit
        np.testing.assert_array_equal(ours.state_dict()[name].numpy(), v.numpy(), err_msg=name)


def test_a_whole_torch_training_checkpoint_converts_with_its_structure(tmp_path):
    """The docs' second conversion keeps a nanoGPT-style checkpoint's nesting and types."""
    torch = pytest.importorskip("torch")
    (whole,) = [c for c in _documented_commands() if "ta.save" in c[2]]
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": 1,
            "best_val_loss": 2.5, "model_args": {"n_layer": 2, "bias": True},
            "config": {"betas": (0.9, 0.95), "init_from": "scratch"}}
    torch.save(ckpt, tmp_path / "ckpt.pt")
    _run_python_c(whole, tmp_path)
    back = load(tmp_path / "ckpt.safetensors")
    assert type(back["model"]) is collections.OrderedDict
    assert back["config"] == ckpt["config"] and back["iter_num"] == 1
    assert back["model_args"] == ckpt["model_args"] and back["best_val_loss"] == 2.5
    for k, v in ckpt["model"].items():
        np.testing.assert_array_equal(back["model"][k].numpy(), v.numpy())
    state = back["optimizer"]["state"][0]
    np.testing.assert_array_equal(state["exp_avg"].numpy(),
                                  ckpt["optimizer"]["state"][0]["exp_avg"].numpy())
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    ours = nn.Linear(3, 2)
    ours.load_state_dict(back["model"])
    np.testing.assert_array_equal(ours.weight.detach().numpy(), model.weight.detach().numpy())
