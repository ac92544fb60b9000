"""nn.serialization: safetensors checkpoints, interchange with torch, bad files, atomic saves."""

import json
import os
import pickle

import numpy as np
import pytest

import nn
import nn.optim as optim
import tinygrad_attn as ta
from nn.serialization import flatten_state, load, load_metadata, save, unflatten_state

pytest.importorskip("safetensors")


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
    import safetensors.numpy

    path = tmp_path / "ckpt.safetensors"
    old = {"w": ta.ones(3, 3)}
    save(old, path, metadata={"step": "1"})
    before = path.read_bytes()

    real_save_file = safetensors.numpy.save_file

    def crash_midway(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:  # half the bytes are out when the power goes
            f.truncate(os.path.getsize(filename) // 2)
        raise OSError("simulated crash while writing")

    monkeypatch.setattr(safetensors.numpy, "save_file", crash_midway)
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
    assert sorted(tensors) == ["optim.state.0.exp_avg", "optim.state.0.exp_avg_sq",
                               "optim.state.1.exp_avg", "optim.state.1.exp_avg_sq"]
    model = {f"p{i}": p for i, p in enumerate(params)}
    save({**model, **tensors}, tmp_path / "ckpt.safetensors", metadata={"optim": layout})

    loaded = load(tmp_path / "ckpt.safetensors")
    copies = [loaded[f"p{i}"].requires_grad_() for i in range(2)]
    resumed = optim.AdamW([{"params": copies[:1]}, {"params": copies[1:]}])
    restored = unflatten_state(loaded, load_metadata(tmp_path / "ckpt.safetensors")["optim"])
    assert restored["param_groups"][0]["betas"] == (0.9, 0.95)
    assert sorted(restored["state"]) == [0, 1] and restored["state"][0]["step"] == 2
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

    config = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)
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
