"""The trainer: it learns, it logs memory, and resuming from a checkpoint is exact."""

import gc
import os
import signal
import traceback

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from nn.trainer import CHECKPOINT, DataMismatch, Interrupted, TrainConfig, Trainer

TEXT = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n" for i in range(400))
TINY = nn.GPTConfig(vocab_size=1, block_size=16, n_layer=1, n_head=2, n_embd=16)


def _cfg(tmp_path, steps, **kw):
    base = dict(steps=steps, batch_size=4, eval_every=0, warmup=2, lr=1e-2, min_lr=1e-3,
                progress=False, out=str(tmp_path), dropout_seed=None)
    base.pop("dropout_seed")
    base.update(kw)
    return TrainConfig(**base)


def _params(trainer):
    return {k: v.detach().cpu().numpy().copy() for k, v in trainer.model.state_dict().items()}


def test_resume_is_bit_identical(tmp_path):
    cfg = nn.GPTConfig(**{**TINY.__dict__, "dropout": 0.1})  # dropout draws from the RNG
    straight = Trainer(cfg, _cfg(tmp_path / "a", 6), TEXT, log=lambda *_: None)
    straight.run(memory_report=False)

    first = Trainer(cfg, _cfg(tmp_path / "b", 6), TEXT, log=lambda *_: None)
    first.run(until=3, memory_report=False)
    path = first.save_checkpoint()
    del first
    ta.manual_seed(999)  # whatever happened in between must not matter
    resumed = Trainer.from_checkpoint(path, TEXT, log=lambda *_: None)
    assert resumed.step == 3
    resumed.run(memory_report=False)

    a, b = _params(straight), _params(resumed)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_run_logs_memory_columns_and_learns(tmp_path):
    lines = []
    trainer = Trainer(TINY, _cfg(tmp_path, 40, eval_every=20, eval_iters=2), TEXT,
                      log=lines.append)
    start = trainer.evaluate()
    history = trainer.run()
    assert lines[0].startswith("memory of the first step: peak")
    assert "saved for backward" in lines[0] and "copies:" in lines[0]
    logged = [s for s in lines if s.startswith("step")]
    assert len(logged) == 2 and "peak" in logged[0] and "copied" in logged[0]
    rec = history[-1]
    assert rec["peak_bytes"] > 0 and rec["saved_bytes"] > 0
    assert rec["val_loss"] < start - 0.5  # it learned something
    assert (tmp_path / CHECKPOINT).exists()
    text = trainer.sample("def", max_new_tokens=20)
    assert text.startswith("def") and len(text) == 23


def test_example_cli_runs(tmp_path, capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_gpt.py"
    spec = importlib.util.spec_from_file_location("train_gpt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    mod.main(["--data", str(data), "--steps", "2", "--n-layer", "1", "--n-embd", "16",
              "--n-head", "2", "--block-size", "16", "--batch-size", "2", "--eval-every", "2",
              "--eval-iters", "1", "--sample-tokens", "10", "--no-progress",
              "--out", str(tmp_path / "run")])
    mod.main(["--data", str(data), "--steps", "3", "--eval-every", "3", "--eval-iters", "1",
              "--sample-tokens", "5", "--no-progress", "--out", str(tmp_path / "run"),
              "--resume"])
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 2" in out
    assert "final validation loss" in out and "sample:" in out


def test_trains_on_the_gpu_and_resumes_exactly(tmp_path, gpu_device):
    """The trainer on "cuda" (a real GPU, or the fake CuPy): the memory log reads the
    device's ledger, the checkpoint saved from the device resumes exactly, and its
    parameters load on the CPU."""
    lines = []
    straight = Trainer(TINY, _cfg(tmp_path / "a", 4, device=gpu_device), TEXT,
                       log=lines.append)
    straight.run()
    assert lines[0].startswith("memory of the first step: peak")
    assert straight.model.lm_head.weight.device.startswith("cuda")

    first = Trainer(TINY, _cfg(tmp_path / "b", 4, device=gpu_device), TEXT,
                    log=lambda *_: None)
    first.run(until=2, memory_report=False)
    path = first.save_checkpoint()
    resumed = Trainer.from_checkpoint(path, TEXT, log=lambda *_: None)
    assert resumed.tcfg.device == gpu_device and resumed.step == 2
    resumed.run(memory_report=False)
    a, b = _params(straight), _params(resumed)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)

    on_cpu = nn.load(path)  # tensors saved from the device come back on the CPU
    name = "model.lm_head.weight" if "model.lm_head.weight" in on_cpu else next(
        k for k in on_cpu if k.endswith("lm_head.weight"))
    assert on_cpu[name].device == "cpu"


# ----------------------------------------------------------------------------- failed steps
def _tiny_trainer(tmp_path, **kw):
    cfg = nn.GPTConfig(**{**TINY.__dict__, "n_layer": 2, "dropout": 0.1})
    return Trainer(cfg, _cfg(tmp_path, 4, **kw), TEXT, log=lambda *_: None)


def _grads(trainer):
    return {k: None if p.grad is None else p.grad.numpy().copy()
            for k, p in trainer.model.named_parameters()}


def _oom_mid_backward(make, attempt):
    """A fresh object from make() on which attempt(obj) runs out of memory in the middle of
    backward: the limit is lowered in small steps from a clean step's peak towards what the
    forward pass needs, until the error comes from backward and obj.partial() holds."""
    gc.collect()  # garbage of earlier tests freed in the middle would move the limit
    probe = make()
    x, y = probe.train_batches.sample()
    start = ta.memory.live_bytes()
    ta.memory.reset_peak()
    _, loss = probe.model(x, y)
    forward = ta.memory.live_bytes() - start
    loss.backward()
    peak = ta.memory.max_live_bytes() - start
    del probe, loss
    for extra in range(peak - 1, forward, -max(1, (peak - forward) // 50)):
        obj = make()
        gc.collect()
        base = ta.memory.live_bytes()
        try:
            with ta.memory.limit(base + extra):
                attempt(obj)
        except ta.OutOfMemoryError as e:
            frames = [f.name for f in traceback.extract_tb(e.__traceback__)]
        else:
            continue
        if "backward" in frames and obj.partial():
            gc.collect()
            obj.leftover_bytes = ta.memory.live_bytes() - base  # with the exception gone
            return obj
    raise AssertionError("no memory limit made backward fail after its first gradients")


def test_a_retry_after_out_of_memory_mid_backward_has_a_clean_steps_gradients(tmp_path):
    clean = _tiny_trainer(tmp_path)
    batch = clean.train_batches.sample()
    clean.forward_backward(*batch)
    expected = _grads(clean)
    assert all(g is not None for g in expected.values()) and len(expected) == 28

    def make():
        t = _tiny_trainer(tmp_path)
        t.batch = t.train_batches.sample()
        t.rng = ta.get_rng_state()  # the dropout masks the clean step drew
        t.partial = lambda: 0 < sum(p.grad is not None for p in t.model.parameters()) < 28
        return t

    failed = _oom_mid_backward(make, lambda t: t.forward_backward(*t.batch))
    partial = {k: g for k, g in _grads(failed).items() if g is not None}
    assert 0 < len(partial) < len(expected)  # the OOM left some gradients behind ...
    assert any(g.any() for g in partial.values())  # ... nonzero: adding to them would show
    assert failed.leftover_bytes == sum(g.nbytes for g in partial.values())  # and only them
    ta.set_rng_state(failed.rng)
    failed.forward_backward(*failed.batch)  # the retry, with no limit
    got = _grads(failed)
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k], err_msg=k)


def test_train_step_after_out_of_memory_is_the_step_a_clean_run_takes(tmp_path):
    """The batch, the dropout masks (RNG) and the gradients of a retried train_step are a
    clean run's: the parameters after it equal those after one clean step, bit for bit."""
    clean = _tiny_trainer(tmp_path)
    clean_rec = clean.train_step()

    def make():
        t = _tiny_trainer(tmp_path)
        t.partial = lambda: True  # train_step itself sets the partial gradients to None
        return t

    failed = _oom_mid_backward(make, lambda t: t.train_step())
    assert failed.step == 0 and all(p.grad is None for p in failed.model.parameters())
    rec = failed.train_step()
    assert failed.step == 1 and rec["loss"] == clean_rec["loss"]
    a, b = _params(clean), _params(failed)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert failed.train_batches.state_dict() == clean.train_batches.state_dict()


# ----------------------------------------------------------------------------- signals, data
def _signal_after_first_step(times):
    """A log that sends this process SIGINT `times` times when the first step is logged."""
    def log(line):
        if line.startswith("memory of the first step"):
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)

    return log


def test_a_signal_finishes_the_step_saves_and_raises_interrupted(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    trainer = Trainer(TINY, _cfg(tmp_path, 50), TEXT, log=_signal_after_first_step(1))
    with pytest.raises(Interrupted) as info:
        trainer.run()
    e = info.value
    assert isinstance(e, KeyboardInterrupt)  # code that stops on Ctrl-C stops here too
    assert (e.signum, e.step, e.exit_status) == (signal.SIGINT, 1, 130)
    assert e.path == str(tmp_path / CHECKPOINT) and trainer.step == 1
    assert nn.load_metadata(e.path)["step"] == "1"
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back
    resumed = Trainer.from_checkpoint(e.path, TEXT, log=lambda *_: None)
    assert resumed.step == 1

    # a second signal: at once, nothing saved (no out here either way)
    trainer = Trainer(TINY, _cfg(tmp_path / "b", 50), TEXT, log=_signal_after_first_step(2))
    with pytest.raises(Interrupted) as info:
        trainer.run()
    assert info.value.path is None and not (tmp_path / "b").exists()
    assert signal.getsignal(signal.SIGINT) is before


def test_resuming_on_another_text_is_refused_naming_the_change(tmp_path):
    trainer = Trainer(TINY, _cfg(tmp_path, 2), TEXT, log=lambda *_: None)
    trainer.run(memory_report=False)
    path = str(tmp_path / CHECKPOINT)
    with pytest.raises(DataMismatch, match="characters added: 'Z'") as info:
        Trainer.from_checkpoint(path, TEXT + "Z", log=lambda *_: None)
    assert info.value.changes[0] == f"size {len(TEXT):,} -> {len(TEXT) + 1:,} bytes"
    with pytest.raises(DataMismatch, match="the same characters in a different text"):
        Trainer.from_checkpoint(path, TEXT[::-1], log=lambda *_: None)
    assert Trainer.from_checkpoint(path, TEXT, log=lambda *_: None).step == 2
