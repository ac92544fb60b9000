"""nn.serialization: safetensors checkpoints, interchange with torch, bad files, atomic saves."""

import json
import math
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import TINY_GPT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nn
import nn.optim as optim
import tinygrad_attn as ta
from nn.serialization import flatten_state, load, load_metadata, save, unflatten_state
from tinygrad_attn.serialization import safetensors_format as serialization

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state():
    return {
        "transformer.wte.weight": ta.randn(11, 4),
        "transformer.h.0.attn.c_attn.weight": ta.randn(12, 4, dtype=ta.float64),
        "transformer.ln_f.bias": ta.zeros(4, dtype=ta.float16),
        "counts": ta.arange(6, dtype=ta.int32).reshape(2, 3),
        "ids": ta.arange(5),
        "mask": ta.tensor([True, False, True]),
        "bytes": ta.tensor([1, 2, 255], dtype=ta.uint8),
        "scalar": ta.tensor(3.5),
    }


def _assert_same(a: dict, b: dict):
    assert list(a) == list(b) or sorted(a) == sorted(b)
    for name in a:
        assert b[name].dtype == a[name].dtype, name
        assert b[name].shape == a[name].shape, name
        np.testing.assert_array_equal(b[name].numpy(), a[name].detach().numpy())


def test_round_trip_keeps_values_dtypes_and_shapes(tmp_path):
    state = _state()
    path = tmp_path / "ckpt.safetensors"
    save(state, path, metadata={"step": "7", "config": json.dumps({"n_layer": 2})})
    loaded = load(path)
    _assert_same(state, loaded)
    assert load_metadata(path) == {"step": "7", "config": '{"n_layer": 2}'}
    # loaded tensors own writable memory: they can be trained further in place
    with ta.no_grad():
        loaded["transformer.wte.weight"].add_(1.0)
    assert load(path)["transformer.wte.weight"].numpy()[0, 0] == state[
        "transformer.wte.weight"].numpy()[0, 0]
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # no temporary left behind


def test_every_engine_dtype_round_trips_as_itself(tmp_path):
    """Each dtype the engine has is saved under its own safetensors code and loads back as
    itself, bit for bit (int16 raised a bare KeyError at save)."""
    dtypes = [ta.bool, ta.uint8, ta.int8, ta.int16, ta.int32, ta.int64, ta.float16,
              ta.float32, ta.float64]
    state = {dt.name: ta.tensor([1, 0, 1] if dt is ta.bool else [1, 2, 3], dtype=dt)
             for dt in dtypes}
    state["int16_edges"] = ta.tensor([-32768, 32767], dtype=ta.int16)
    path = tmp_path / "dtypes.safetensors"
    save(state, path)
    loaded = load(path)
    for name, t in state.items():
        assert loaded[name].dtype is t.dtype, name
        assert loaded[name].tolist() == t.tolist(), name
    header = json.loads(path.read_bytes()[8:8 + struct.unpack("<Q", path.read_bytes()[:8])[0]])
    assert header["int16"]["dtype"] == "I16"


def test_views_tied_tensors_and_parameters_save_by_name(tmp_path):
    base = ta.randn(6, 4, requires_grad=True)
    state = {
        "wte.weight": base,
        "lm_head.weight": base,  # tied: the same tensor under two names
        "column": base.detach()[:, 1],  # a strided view into base's storage
        "transposed": base.detach().T,
    }
    save(state, tmp_path / "t.safetensors")
    loaded = load(tmp_path / "t.safetensors")
    expected = base.detach().numpy()
    np.testing.assert_array_equal(loaded["wte.weight"].numpy(), expected)
    np.testing.assert_array_equal(loaded["lm_head.weight"].numpy(), expected)
    np.testing.assert_array_equal(loaded["column"].numpy(), expected[:, 1])
    np.testing.assert_array_equal(loaded["transposed"].numpy(), expected.T)
    assert not loaded["wte.weight"].shares_storage(loaded["lm_head.weight"])  # one per name


def test_a_checkpoint_written_here_loads_into_torch_and_back(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    state = _state()
    save(state, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    theirs = st_torch.load_file(str(tmp_path / "ours.safetensors"))
    assert sorted(theirs) == sorted(state)
    for name, t in state.items():
        assert str(theirs[name].dtype) == "torch." + t.dtype.name, name
        np.testing.assert_array_equal(theirs[name].numpy(), t.numpy())

    # a torch nanoGPT-shaped Linear writes its (out, in) weight; we read it by name
    layer = torch.nn.Linear(4, 12)
    st_torch.save_file({k: v.detach().contiguous() for k, v in layer.state_dict().items()},
                       str(tmp_path / "torch.safetensors"))
    back = load(tmp_path / "torch.safetensors")
    assert back["weight"].shape == (12, 4) and back["weight"].dtype == ta.float32
    np.testing.assert_array_equal(back["weight"].numpy(), layer.weight.detach().numpy())
    np.testing.assert_array_equal(back["bias"].numpy(), layer.bias.detach().numpy())


def test_load_to_device(tmp_path, device):
    state = _state()
    save(state, tmp_path / "c.safetensors")
    loaded = load(tmp_path / "c.safetensors", device=device)
    for name, t in loaded.items():
        assert t.device == ta.tensor(0.0, device=device).device
        np.testing.assert_array_equal(t.cpu().numpy(), state[name].numpy())


def _written(tmp_path):
    path = tmp_path / "good.safetensors"
    save(_state(), path)
    return path, path.read_bytes()


def test_truncated_file_is_a_clear_error(tmp_path):
    path, data = _written(tmp_path)
    for cut in (len(data) - 3, len(data) // 2, 20, 5, 0):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="cut" + str(cut)):
            load(bad)


def test_corrupted_header_is_a_clear_error(tmp_path):
    path, data = _written(tmp_path)
    header_len = int.from_bytes(data[:8], "little")
    corruptions = {
        "json": data[:8] + b"#" + data[9:],  # the header's first '{' replaced
        "length": (len(data) * 4).to_bytes(8, "little") + data[8:],  # past the end
        "offsets": data.replace(b'"data_offsets":[0,', b'"data_offsets":[9,', 1),
        "dtype": data[: 8 + header_len].replace(b'"F32"', b'"X32"', 1) + data[8 + header_len:],
    }
    for what, bad_bytes in corruptions.items():
        assert bad_bytes != data, what
        bad = tmp_path / f"{what}.safetensors"
        bad.write_bytes(bad_bytes)
        with pytest.raises(ValueError, match=what) as info:
            load(bad)
        assert "safetensors" in str(info.value)
        with pytest.raises(ValueError, match=what):
            load_metadata(bad)


class _Exploit:
    """Unpickling this would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "model.pt"
    with open(bad, "wb") as f:
        pickle.dump({"weight": _Exploit(str(marker))}, f)
    with pytest.raises(ValueError, match="model.pt"):
        load(bad)
    with pytest.raises(ValueError, match="model.pt"):
        load_metadata(bad)
    assert not marker.exists()
    # the exploit is real: unpickling it does create the file
    with open(bad, "rb") as f:
        pickle.load(f)["weight"].close()
    assert marker.exists()


def test_text_file_and_missing_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("just some text, long enough to have a fake header length\n" * 3)
    with pytest.raises(ValueError, match="notes.txt"):
        load(text)
    with pytest.raises(FileNotFoundError, match="missing"):
        load(tmp_path / "missing.safetensors")


def test_a_crash_mid_save_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    old = {"w": ta.ones(3, 3)}
    save(old, path, metadata={"step": "1"})
    before = path.read_bytes()

    real_write = serialization._write_file

    def crash_midway(f, header, arrays):
        real_write(f, header, arrays)
        f.flush()
        f.truncate(f.tell() // 2)  # half the bytes are out when the power goes
        raise OSError("simulated crash while writing")

    monkeypatch.setattr(serialization, "_write_file", crash_midway)
    with pytest.raises(OSError, match="simulated crash"):
        save({"w": ta.zeros(3, 3), "extra": ta.randn(100)}, path, metadata={"step": "2"})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # the partial temp file is gone
    np.testing.assert_array_equal(load(path)["w"].numpy(), np.ones((3, 3), np.float32))
    assert load_metadata(path) == {"step": "1"}

    monkeypatch.undo()
    save({"w": ta.zeros(3, 3)}, path)  # and a save that completes replaces it
    np.testing.assert_array_equal(load(path)["w"].numpy(), np.zeros((3, 3), np.float32))


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="not a Tensor"):
        save({"w": [1.0, 2.0]}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="metadata"):
        save({"w": ta.ones(2)}, tmp_path / "x.safetensors", metadata={"step": 3})
    assert not os.listdir(tmp_path)


def test_optimizer_state_round_trips_through_a_checkpoint(tmp_path):
    params = [ta.randn(4, 3, dtype=ta.float64, requires_grad=True),
              ta.randn(3, dtype=ta.float64, requires_grad=True)]
    opt = optim.AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}],
                      lr=1e-2, betas=(0.9, 0.95))
    grads = [[ta.randn(*p.shape, dtype=ta.float64) for p in params] for _ in range(4)]

    def step(ps, o, gs):
        for p, g in zip(ps, gs):
            p.grad = g
        o.step()

    step(params, opt, grads[0])
    step(params, opt, grads[1])
    tensors, layout = flatten_state(opt.state_dict(), prefix="optim.")
    # the step may be a 0-d tensor (as torch's) or a number: either is stored
    assert sorted(n for n in tensors if not n.endswith(".step")) == [
        "optim.state.0.exp_avg", "optim.state.0.exp_avg_sq",
        "optim.state.1.exp_avg", "optim.state.1.exp_avg_sq"]
    model = {f"p{i}": p for i, p in enumerate(params)}
    save({**model, **tensors}, tmp_path / "ckpt.safetensors", metadata={"optim": layout})

    loaded = load(tmp_path / "ckpt.safetensors")
    copies = [loaded[f"p{i}"].requires_grad_() for i in range(2)]
    resumed = optim.AdamW([{"params": copies[:1]}, {"params": copies[1:]}])
    restored = unflatten_state(loaded, load_metadata(tmp_path / "ckpt.safetensors")["optim"])
    assert restored["param_groups"][0]["betas"] == (0.9, 0.95)
    assert sorted(restored["state"]) == [0, 1] and float(restored["state"][0]["step"]) == 2
    resumed.load_state_dict(restored)
    assert resumed.param_groups[1]["weight_decay"] == 0.0
    for gs in grads[2:]:
        step(params, opt, gs)
        step(copies, resumed, gs)
    for a, b in zip(params, copies):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_flatten_state_keeps_structure():
    t = ta.ones(2)
    state = {"a": [1, 2.5, None, "x", (3, 4)], 5: {"t": t, "nested": [t]}, "flag": True}
    tensors, layout = flatten_state(state)
    assert set(tensors) == {"5.t", "5.nested.0"}
    back = unflatten_state(tensors, layout)
    assert back == {**state, 5: back[5]} and back[5]["t"] is t and back[5]["nested"][0] is t
    assert isinstance(back["a"][4], tuple)
    with pytest.raises(TypeError, match="set"):
        flatten_state({"bad": {1, 2}})
    with pytest.raises(ValueError, match="'a.b'"):
        flatten_state({"a.b": t, "a": {"b": t}})


def test_saved_file_has_ordinary_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    save({"w": ta.ones(2)}, tmp_path / "p.safetensors")
    assert (tmp_path / "p.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_gpt_checkpoint_file_interchanges_with_torch_nanogpt(tmp_path):
    """Ours -> .safetensors -> torch nanoGPT (strict, by name) gives the same logits, and a
    file torch writes loads back into our GPT."""
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    import torch_nanogpt

    config = TINY_GPT
    model = nn.GPT(nn.GPTConfig(**config)).double()
    path = tmp_path / "gpt.safetensors"
    save(model.state_dict(), path)

    ref = torch_nanogpt.GPT(torch_nanogpt.GPTConfig(**config, flash=True)).double()
    missing, unexpected = ref.load_state_dict(st_torch.load_file(str(path)), strict=True)
    assert not missing and not unexpected
    idx = np.random.default_rng(0).integers(0, 13, (2, 8))
    logits, _ = model(ta.tensor(idx), ta.tensor(idx))
    t_logits, _ = ref(torch.from_numpy(idx), torch.from_numpy(idx))
    np.testing.assert_allclose(logits.detach().numpy(), t_logits.detach().numpy(),
                               rtol=1e-10, atol=1e-12)

    # torch -> file -> ours: tied tensors share memory, which safetensors.torch refuses, so
    # each name is saved as its own copy (as our save does)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(1.5)
    st_torch.save_file({k: v.clone() for k, v in ref.state_dict().items()},
                       str(tmp_path / "torch.safetensors"))
    fresh = nn.GPT(nn.GPTConfig(**config)).double()
    fresh.load_state_dict(load(tmp_path / "torch.safetensors"))
    assert fresh.transformer.wte.weight is fresh.lm_head.weight
    logits, _ = fresh(ta.tensor(idx), ta.tensor(idx))
    t_logits, _ = ref(torch.from_numpy(idx), torch.from_numpy(idx))
    np.testing.assert_allclose(logits.detach().numpy(), t_logits.detach().numpy(),
                               rtol=1e-10, atol=1e-12)


def test_save_from_device_loads_on_cpu_and_back(tmp_path, device):
    """A state on the device (with a transposed view and a tied tensor) saves, loads to
    the CPU with the same values, and loads back onto the device."""
    cpu = _state()
    on_dev = {k: v.to(device) for k, v in cpu.items()}
    on_dev["transposed"] = on_dev["transformer.wte.weight"].T
    cpu["transposed"] = cpu["transformer.wte.weight"].T
    model = nn.Linear(4, 3).to(device)
    save({**on_dev, **{f"m.{k}": v for k, v in model.state_dict().items()}},
         tmp_path / "d.safetensors")
    back = load(tmp_path / "d.safetensors")
    _assert_same(cpu, {k: v for k, v in back.items() if not k.startswith("m.")})
    np.testing.assert_array_equal(back["m.weight"].numpy(), model.weight.detach().cpu().numpy())
    again = load(tmp_path / "d.safetensors", device=device)
    dev = ta.backend.canonical_device(device)
    for k, t in again.items():
        assert t.device == dev, k
        np.testing.assert_array_equal(t.cpu().numpy(), back[k].numpy())
    opt = optim.AdamW(model.parameters(), lr=0.1)
    model(ta.randn(2, 4, device=device)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    other = nn.Linear(4, 3).to(device)
    loaded = optim.AdamW(other.parameters(), lr=0.1)
    loaded.load_state_dict(sd)
    for p_old, p_new in zip(model.parameters(), other.parameters()):
        s_old, s_new = opt.state[p_old], loaded.state[p_new]
        assert s_new["step"] == s_old["step"] == 1
        for name in ("exp_avg", "exp_avg_sq"):
            assert s_new[name].device == dev
            assert not s_new[name].shares_storage(s_old[name])  # copied, not aliased
            np.testing.assert_array_equal(s_new[name].cpu().numpy(),
                                          s_old[name].cpu().numpy())
            assert s_old[name].cpu().numpy().any()  # one real step: not all zeros


# ----------------------------------------------------------------------------- names
def test_unloadable_names_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    save({"w": ta.ones(2)}, path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="'__metadata__' is reserved"):
        save({"w": ta.ones(2), "__metadata__": ta.zeros(1)}, path)
    with pytest.raises(ValueError, match=r"tensor name 'bad\\udc80' is not valid UTF-8"):
        save({"bad\udc80": ta.ones(1)}, path)
    with pytest.raises(ValueError, match=r"metadata key 'k\\ud800'"):
        save({"w": ta.ones(1)}, path, metadata={"k\ud800": "v"})
    with pytest.raises(ValueError, match="metadata value of 'note'"):
        save({"w": ta.ones(1)}, path, metadata={"note": "\udfff"})
    monkeypatch.setattr(serialization, "MAX_HEADER_BYTES", 4096)
    with pytest.raises(ValueError, match=r"over the 4,096 .* largest metadata entry is 'big'"):
        save({"w": ta.ones(1)}, path, metadata={"big": "x" * 5000, "small": "y"})
    assert os.listdir(tmp_path) == ["c.safetensors"] and path.read_bytes() == before
    # names that are odd but valid round-trip, and torch's reader sees the same file
    odd = {"": ta.ones(1), "ü.ñ/日本": ta.arange(3), '"quoted"\\n': ta.zeros(2, 0)}
    save(odd, path, metadata={"ключ": "значение"})
    _assert_same(odd, load(path))
    assert load_metadata(path) == {"ключ": "значение"}


# ----------------------------------------------------------------------------- dtypes
def _raw_file(path, tensors: dict, metadata=None):
    """A safetensors file written by hand: name -> (dtype code, shape, raw bytes)."""
    header, data, offset = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (code, shape, raw) in tensors.items():
        header[name] = {"dtype": code, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def test_dtypes_the_engine_lacks_load_widened_exactly(tmp_path):
    """Written byte by byte, no torch: each value is exact in the wider engine dtype (and
    int16, the engine's own, as it is)."""
    nan = math.nan
    path = _raw_file(tmp_path / "w.safetensors", {
        "i16": ("I16", (4,), struct.pack("<4h", -32768, -1, 0, 32767)),
        "u16": ("U16", (3,), struct.pack("<3H", 0, 1, 65535)),
        "u32": ("U32", (2,), struct.pack("<2I", 0, 2**32 - 1)),
        # 1.0, -2.0, inf, the smallest subnormal 2**-133, a nan
        "bf16": ("BF16", (5,), struct.pack("<5H", 0x3F80, 0xC000, 0x7F80, 0x0001, 0x7FC0)),
        # 1.0, 448 (max), 2**-9 (smallest subnormal), -0.0, nan
        "e4m3": ("F8_E4M3", (5,), bytes([0x38, 0x7E, 0x01, 0x80, 0x7F])),
        # 1.0, 57344 (max), 2**-16, -inf, nan
        "e5m2": ("F8_E5M2", (5,), bytes([0x3C, 0x7B, 0x01, 0xFC, 0x7F])),
        # fnuz: bias one more, 0x80 the only nan, no negative zero
        "e4m3fnuz": ("F8_E4M3FNUZ", (3,), bytes([0x40, 0x80, 0xFF])),
        "e5m2fnuz": ("F8_E5M2FNUZ", (3,), bytes([0x40, 0x80, 0xFF])),
        "e8m0": ("F8_E8M0", (4,), bytes([127, 0, 254, 255])),
        "flags": ("BOOL", (3,), bytes([0, 1, 7])),
    })
    got = load(path)
    expect = {
        "i16": (ta.int16, [-32768, -1, 0, 32767]),  # an engine dtype since int16 came
        "u16": (ta.int32, [0, 1, 65535]),
        "u32": (ta.int64, [0, 2**32 - 1]),
        "bf16": (ta.float32, [1.0, -2.0, math.inf, 2.0**-133, nan]),
        "e4m3": (ta.float16, [1.0, 448.0, 2.0**-9, -0.0, nan]),
        "e5m2": (ta.float16, [1.0, 57344.0, 2.0**-16, -math.inf, nan]),
        "e4m3fnuz": (ta.float16, [1.0, nan, -240.0]),
        "e5m2fnuz": (ta.float16, [1.0, nan, -57344.0]),
        "e8m0": (ta.float32, [1.0, 2.0**-127, 2.0**127, nan]),
        "flags": (ta.bool, [False, True, True]),
    }
    for name, (dtype, values) in expect.items():
        assert got[name].dtype == dtype, name
        np.testing.assert_array_equal(got[name].numpy(), np.array(values), err_msg=name)
    assert np.signbit(got["e4m3"].numpy()[3])  # -0.0 stays negative
    assert got["flags"].numpy().view(np.uint8).tolist() == [0, 1, 1]  # canonical bools


@pytest.mark.parametrize("code,why,nbytes", [("U64", "uint64", 32), ("C64", "complex", 32),
                                             ("F4", "4-bit", 2), ("F6_E3M2", "6-bit", 3)])
def test_dtypes_without_an_exact_engine_dtype_are_refused(tmp_path, code, why, nbytes):
    path = _raw_file(tmp_path / f"{code}.safetensors",  # 4 elements of `code`
                     {"ok": ("F32", (1,), b"\0" * 4), "layer.w": (code, (4,), b"\0" * nbytes)})
    with pytest.raises(ValueError, match=rf"{code}.safetensors.*'layer.w'.*{code}.*{why}"):
        load(path)
    assert load_metadata(path) == {}  # the header alone is readable


def test_every_torch_dtype_loads_as_torch_reads_it(tmp_path):
    """All bit patterns of each 8- and 16-bit dtype, and edge values of the wider ones,
    written by safetensors.torch: our values equal torch's own conversion."""
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    every8 = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    every16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    tensors = {
        "i16": every16, "u16": every16.view(torch.uint16), "bf16": every16.view(torch.bfloat16),
        "u32": torch.tensor([0, 1, 2**31, 2**32 - 1], dtype=torch.int64).to(torch.uint32),
        "i8": every8.view(torch.int8), "u8": every8, "f16": every16.view(torch.float16),
        "f32": torch.tensor([1.5, -0.0, math.inf, 1e-45]), "f64": torch.tensor([2.0**-1074]),
        "i32": torch.tensor([-2**31, 2**31 - 1], dtype=torch.int32),
        "i64": torch.tensor([-2**63, 2**63 - 1]), "bool": torch.tensor([True, False]),
    }
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu"):
        tensors[name] = every8.view(getattr(torch, name))
    tensors = {k: v.clone() for k, v in tensors.items()}  # views of one buffer: own copies
    st_torch.save_file(tensors, str(tmp_path / "all.safetensors"))
    ours = load(tmp_path / "all.safetensors")
    assert sorted(ours) == sorted(tensors)
    for name, t in tensors.items():
        floating = t.is_floating_point()
        wide = t.to(torch.float64 if floating else torch.int64).numpy()
        with np.errstate(invalid="ignore"):  # casting a signalling nan raises the flag
            got = ours[name].numpy().astype(wide.dtype)
        np.testing.assert_array_equal(got, wide, err_msg=name)
        if floating:  # the sign of zero too (a nan's sign bit means nothing)
            np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]),
                                          np.signbit(wide[~np.isnan(wide)]), err_msg=name)
        assert got.itemsize >= t.element_size(), name
    for dtype in (torch.uint64, torch.complex64):
        path = tmp_path / f"{str(dtype)[6:]}.safetensors"
        st_torch.save_file({"x": torch.zeros(2, dtype=dtype)}, str(path))
        with pytest.raises(ValueError, match=f"{path.name}.*'x'"):
            load(path)


# ----------------------------------------------------------------------------- fuzzing
def _fuzz_base(path):
    save({"a": ta.randn(3, 2), "b": ta.arange(4, dtype=ta.int32), "c": ta.tensor([True, False]),
          "d": ta.zeros(0, 5, dtype=ta.float16), "e": ta.tensor(2.5, dtype=ta.float64)},
         path, metadata={"step": "3", "note": "x"})
    return path.read_bytes()


def _check_loads_or_names_the_file(path):
    """load and load_metadata either succeed, giving exactly the bytes the header
    describes, or raise ValueError naming the file: never another exception."""
    try:
        meta = load_metadata(path)
    except ValueError as e:
        assert str(path) in str(e)
        meta = None
    try:
        tensors = load(path)
    except ValueError as e:
        assert str(path) in str(e)
        return
    assert meta is not None  # a file that loads has a readable header
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    assert sorted(tensors) == sorted(header)
    for name, t in tensors.items():
        begin, end = header[name]["data_offsets"]
        assert list(t.shape) == header[name]["shape"]
        raw = data[8 + n + begin:8 + n + end]
        arr = t.numpy()
        if header[name]["dtype"] == "BOOL":
            assert arr.tolist() == [b != 0 for b in raw] or arr.size == 0 or arr.ndim != 1
        else:
            assert arr.tobytes() == raw, name


FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                  max_size=3),
    max_leaves=6)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=4),
       cut=st.none() | st.integers(0, 10**6))
def test_fuzz_byte_flips_and_truncations(tmp_path, flips, cut):
    data = bytearray(_fuzz_base(tmp_path / "base.safetensors"))
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    if cut is not None:
        data = data[:cut % (len(data) + 1)]
    path = tmp_path / "fuzzed.safetensors"
    path.write_bytes(bytes(data))
    _check_loads_or_names_the_file(path)


@FUZZ
@given(name=st.sampled_from(["a", "b", "c", "d", "e", "__metadata__", "new"]),
       field=st.sampled_from(["dtype", "shape", "data_offsets", None, "extra"]),
       value=JSON_VALUES | st.sampled_from(["F32", "F16", "I64", "BOOL", "U64", "BF16", "X"])
       | st.lists(st.integers(-3, 40), max_size=3),
       length_delta=st.sampled_from([0, 0, 0, 1, -1, 8, -8]))
def test_fuzz_header_edits(tmp_path, name, field, value, length_delta):
    data = _fuzz_base(tmp_path / "base.safetensors")
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    if field is None:
        header[name] = value  # replace or add a whole entry
    elif isinstance(header.get(name), dict):
        header[name][field] = value
    else:
        header.pop(name, None)
    text = json.dumps(header).encode()
    path = tmp_path / "fuzzed.safetensors"
    path.write_bytes(max(0, len(text) + length_delta).to_bytes(8, "little") + text
                     + data[8 + n:])
    _check_loads_or_names_the_file(path)


# ----------------------------------------------------------------------------- kill -9
CHILD = """
import sys
import tinygrad_attn as ta
from nn.serialization import save
path, v = sys.argv[1], int(sys.argv[2])
while True:
    v += 1
    save({"w": ta.full((512, 512), float(v)), "v": ta.tensor([v])}, path,
         metadata={"version": str(v)})
    print(v, flush=True)
"""


def _temporaries(directory, target):
    return [n for n in os.listdir(directory) if n.startswith(f".{target}.")]


def test_kill_9_mid_save_leaves_an_old_or_new_version_and_the_next_save_cleans_up(tmp_path):
    """A child saves 1 MiB versions back to back and is SIGKILLed at random moments: the
    target is always one whole version, and a later save deletes the dead writers'
    temporaries."""
    path = tmp_path / "ckpt.safetensors"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rng = random.Random(0)
    version, stale_seen = 0, 0
    for _ in range(4):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(version)],
                                 stdout=subprocess.PIPE, env=env)
        first = child.stdout.readline()
        assert first, "the saving child died before its first save"
        time.sleep(rng.uniform(0.0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        meta = load_metadata(path)
        state = load(path)
        v = int(meta["version"])
        assert v > version and state["v"].item() == v
        assert state["w"].shape == (512, 512) and (state["w"].numpy() == v).all()
        version = v
        stale_seen += len(_temporaries(tmp_path, path.name))
    save({"w": ta.zeros(1)}, path)  # every writer is dead: their temporaries go
    assert _temporaries(tmp_path, path.name) == []
    assert load(path)["w"].numpy().tolist() == [0.0]
    print(f"stale temporaries seen after kills: {stale_seen}")


def test_a_save_removes_only_dead_writers_temporaries_of_its_own_target(tmp_path):
    host = serialization._HOST
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        names = {
            "dead": f".ckpt.safetensors.{host}.{dead.pid}.0123456789ab.tmp",
            "live": f".ckpt.safetensors.{host}.{sleeper.pid}.0123456789ab.tmp",
            "other target": f".other.safetensors.{host}.{dead.pid}.0123456789ab.tmp",
            "other host": f".ckpt.safetensors.{host}x.{dead.pid}.0123456789ab.tmp",
            "old style": ".ckpt.safetensors.0123456789ab.tmp",
        }
        for n in names.values():
            (tmp_path / n).write_bytes(b"partial")
        save({"w": ta.ones(1)}, tmp_path / "ckpt.safetensors")
        left = set(os.listdir(tmp_path))
        assert names["dead"] not in left
        assert {names[k] for k in ("live", "other target", "other host", "old style")} <= left
    finally:
        sleeper.kill()
        sleeper.wait()
