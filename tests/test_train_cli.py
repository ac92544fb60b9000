"""examples/train_gpt.py and examples/sample.py as a user runs them: flags checked with a
message and exit status 2, resume semantics, config files, sampling a checkpoint."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import load_example

import nn
import tinygrad_attn as ta
from nn.trainer import CHECKPOINT, TrainConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n" for i in range(400))


train_gpt = load_example("train_gpt")
sample = load_example("sample")


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text(TEXT)
    return str(path)


def _tiny(data, out, *extra):
    return ["--data", data, "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
            "--block-size", "16", "--batch-size", "4", "--eval-every", "0", "--eval-iters", "1",
            "--sample-tokens", "0", "--warmup", "2", "--lr", "1e-2", "--min-lr", "1e-3",
            "--no-progress", "--out", str(out), *extra]


def _exit_2(capsys, argv, main=None):
    """Run the CLI expecting exit status 2; its stderr."""
    with pytest.raises(SystemExit) as info:
        (main or train_gpt.main)(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _weights(out):
    return {k: v.numpy() for k, v in nn.load(os.path.join(out, CHECKPOINT)).items()
            if k.startswith("model.")}


# ----------------------------------------------------------------------------- flags
def test_every_config_field_has_a_flag_with_help_and_the_help_shows_defaults(capsys):
    gpt_fields = {f.name for f in dataclasses.fields(nn.GPTConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(train_gpt.MODEL_FLAGS) == gpt_fields - {"vocab_size"}
    assert set(train_gpt.TRAIN_FLAGS) == train_fields - {"out", "progress"}
    parser = train_gpt.build_parser()
    for action in parser._actions:
        assert action.help, action.dest
    with pytest.raises(SystemExit) as info:
        train_gpt.main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    text = text[text.index("options:"):]  # past the usage line
    assert "--attn {naive,views,flash}" in text
    for flag, default in [("--block-size", 64), ("--n-embd", 128), ("--steps", 600),
                          ("--lr", 0.003), ("--device", "cpu"), ("--lr-decay-steps", 0),
                          ("--attn", "views"), ("--bias", True)]:
        after = text[text.index(f"{flag} "):]
        assert f"(default: {default})" in after[:400], flag


@pytest.mark.parametrize("argv,message", [
    (["--steps", "-3"], "argument --steps: must be an integer >= 1, got -3"),
    (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
    (["--block-size", "0"], "argument --block-size: must be an integer >= 1, got 0"),
    (["--eval-iters", "0"], "argument --eval-iters: must be an integer >= 1, got 0"),
    (["--n-layer", "two"], "argument --n-layer: not an integer: 'two'"),
    (["--device", "tpu"], "invalid device 'tpu': use cpu, cuda, or cuda:N"),
    (["--device", "cuda:x"], "invalid device 'cuda:x'"),
    (["--lr", "-0.001"], "argument --lr: must be a finite number >= 0.0, got -0.001"),
    (["--lr=-1e-3"], "argument --lr: must be a finite number >= 0.0, got -1e-3"),
    (["--lr", "inf"], "argument --lr: must be a finite number >= 0.0, got inf"),
    (["--weight-decay", "-0.1"], "argument --weight-decay: must be a finite number >= 0.0"),
    (["--dropout", "1.0"], "argument --dropout: must be a finite number in [0.0, 1.0)"),
    (["--warmup", "-1"], "argument --warmup: must be an integer >= 0, got -1"),
    (["--seed", "-5"], "argument --seed: must be an integer in [0, 4294967295]"),
    (["--attn", "fast"], "argument --attn: invalid choice: 'fast'"),
    (["--bias", "maybe"], "argument --bias: not a boolean"),
    (["--n-embd", "30", "--n-head", "4"], "--n-embd (30) must be a multiple of --n-head (4)"),
    (["--attn", "flash", "--dropout", "0.1"], "--attn flash has no attention dropout"),
])
def test_bad_flags_exit_2_with_a_message(capsys, argv, message):
    assert message in _exit_2(capsys, argv)


def test_a_bad_flag_from_the_shell_is_one_line_and_status_2():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--steps",
                          "-3"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().endswith("argument --steps: must be an integer >= 1, got -3")


# ----------------------------------------------------------------------------- resume
def test_40_steps_then_resume_to_80_equals_80_straight(tmp_path, data, capsys):
    """--steps is the total on --resume and the schedule continues: bit-identical weights."""
    straight = train_gpt.main(_tiny(data, tmp_path / "a", "--steps", "80"))
    train_gpt.main(_tiny(data, tmp_path / "b", "--steps", "40", "--lr-decay-steps", "80"))
    resumed = train_gpt.main(["--resume", "--out", str(tmp_path / "b"), "--steps", "80",
                              "--no-progress"])
    assert "resumed from" in capsys.readouterr().out
    assert resumed.step == 80 and len(resumed.history) == 40
    assert [r["lr"] for r in resumed.history] == [r["lr"] for r in straight.history[40:]]
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_resume_keeps_the_runs_schedule_and_defaults_to_its_total(tmp_path, data, capsys):
    first = train_gpt.main(_tiny(data, tmp_path, "--steps", "6", "--save-every", "3"))
    assert first.tcfg.lr_decay_steps == 6  # 0 means --steps, fixed when the run starts
    meta = nn.load_metadata(tmp_path / CHECKPOINT)
    assert json.loads(meta["train_config"])["lr_decay_steps"] == 6
    assert meta["data"] == os.path.abspath(data)  # where the resumed run reads its text
    on = train_gpt.main(["--resume", "--out", str(tmp_path), "--steps", "9", "--no-progress"])
    assert [r["lr"] for r in on.history] == [1e-3] * 3  # past the schedule: --min-lr
    # no --steps: the checkpoint's own total; here reached already
    err = _exit_2(capsys, ["--resume", "--out", str(tmp_path)])
    assert "nothing to train" in err and "at step 9 and --steps 9" in err


def test_resume_refusals(tmp_path, data, capsys):
    run = tmp_path / "run"
    train_gpt.main(_tiny(data, run, "--steps", "3"))
    ckpt = run / CHECKPOINT
    before = ckpt.read_bytes()
    err = _exit_2(capsys, ["--resume", "--out", str(run), "--steps", "3"])
    assert f"nothing to train: {ckpt} is at step 3 and --steps 3" in err
    assert "pass --steps greater than 3" in err
    assert "at step 3" in _exit_2(capsys, ["--resume", "--out", str(run), "--steps", "2"])

    err = _exit_2(capsys, ["--resume", "--out", str(run), "--steps", "5", "--n-layer", "2",
                           "--lr", "0.5", "--batch-size", "4", "--attn", "naive"])
    assert "--n-layer: given 2, checkpoint 1" in err
    assert "--lr: given 0.5, checkpoint 0.01" in err
    assert "--attn: given 'naive', checkpoint 'views'" in err
    assert "--batch-size" not in err  # the same value as the checkpoint's: no conflict

    other = tmp_path / "other.txt"
    other.write_text(TEXT[::-1])
    err = _exit_2(capsys, ["--resume", "--out", str(run), "--steps", "5", "--data", str(other)])
    assert "trained on" in err and str(data) in err

    weights_only = tmp_path / "weights"
    weights_only.mkdir()
    nn.save({"w": ta.ones(2)}, weights_only / CHECKPOINT)
    err = _exit_2(capsys, ["--resume", "--out", str(weights_only), "--steps", "5"])
    assert "has no trainer state" in err and "gpt_config" in err and "KeyError" not in err
    assert "no checkpoint file" in _exit_2(capsys, ["--resume", "--out", str(tmp_path / "x")])
    assert "--resume needs --out" in _exit_2(capsys, ["--resume"])
    assert ckpt.read_bytes() == before  # nothing was trained or saved


# ----------------------------------------------------------------------------- config file
def test_config_file_is_read_overridden_by_flags_and_saved(tmp_path, data, capsys):
    config = tmp_path / "run.toml"
    config.write_text(f'n_layer = 2\nn-embd = 24\nn_head = 3\nlr = 0.02\nsteps = 2\n'
                      f'batch_size = 2\neval_every = 0\nsample_tokens = 0\n'
                      f'data = "{data}"\nno_progress = true\nbias = false\n')
    trainer = train_gpt.main(["--config", str(config), "--lr", "0.005", "--out",
                              str(tmp_path / "run")])
    g, t = trainer.gcfg, trainer.tcfg
    assert (g.n_layer, g.n_embd, g.n_head, g.bias) == (2, 24, 3, False)
    assert (t.lr, t.steps, t.batch_size, t.progress) == (0.005, 2, 2, False)  # flag wins
    meta = nn.load_metadata(tmp_path / "run" / CHECKPOINT)
    saved = json.loads(meta["config_file"])
    assert saved["text"] == config.read_text() and saved["path"] == str(config)
    # on resume its settings count as given: a contradiction is listed
    config.write_text("n_layer = 3\n")
    err = _exit_2(capsys, ["--resume", "--out", str(tmp_path / "run"), "--steps", "4",
                           "--config", str(config)])
    assert "--n-layer: given 3, checkpoint 2" in err


@pytest.mark.parametrize("text,message", [
    ("n_layers = 2\n", "unknown setting 'n_layers'"),
    ("n_layer = 2.5\n", "n_layer must be a TOML int, got 2.5"),
    ("lr = -1.0\n", "lr: must be a finite number >= 0.0"),
    ("attn = 'fast'\n", "attn must be one of naive, views, flash"),
    ("bias = 'no'\n", "bias must be a TOML bool"),
    ("resume = true\n", "unknown setting 'resume'"),
    ("steps = \n", "not valid TOML"),
])
def test_bad_config_files_exit_2(tmp_path, capsys, text, message):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    assert message in _exit_2(capsys, ["--config", str(config)])
    assert "No such file" in _exit_2(capsys, ["--config", str(tmp_path / "none.toml")])


# ----------------------------------------------------------------------------- sampling
def test_sample_from_a_checkpoint(tmp_path, data, capsys):
    train_gpt.main(_tiny(data, tmp_path / "run", "--steps", "3"))
    capsys.readouterr()
    args = ["--ckpt", str(tmp_path / "run"), "--start", "def f", "--tokens", "25",
            "--temperature", "0.7", "--top-k", "5", "--seed", "3"]
    text = sample.main(args)
    assert text.startswith("def f") and len(text) == 5 + 25
    assert set(text) <= set(TEXT)
    assert capsys.readouterr().out == text + "\n"
    assert sample.main(args) == text  # the same seed, the same text
    by_file = sample.main(["--ckpt", str(tmp_path / "run" / CHECKPOINT), "--start", "def f",
                           "--tokens", "25", "--temperature", "0.7", "--top-k", "5",
                           "--seed", "3"])
    assert by_file == text
    assert len(sample.main(["--ckpt", str(tmp_path / "run"), "--tokens", "0"])) == 1

    err = _exit_2(capsys, ["--ckpt", str(tmp_path / "run"), "--start", "Z"], sample.main)
    assert "lacks: ['Z']" in err
    assert "must be a finite number > 0" in _exit_2(
        capsys, ["--ckpt", str(tmp_path / "run"), "--temperature", "0"], sample.main)
    nn.save({"w": ta.ones(1)}, tmp_path / "w.safetensors")
    assert "has no gpt_config" in _exit_2(
        capsys, ["--ckpt", str(tmp_path / "w.safetensors")], sample.main)


# ----------------------------------------------------------------------------- resume by content
def _run(data, out, steps, *extra):
    return _tiny(data, out, "--steps", str(steps), "--lr-decay-steps", "8", *extra)


def test_a_moved_data_file_resumes_exactly(tmp_path, data, capsys):
    """The checkpoint records the text's hash, size and characters: the same text at a new
    path resumes bit-identically; the old path gone is named, with what to pass."""
    straight = train_gpt.main(_run(data, tmp_path / "a", 8))
    train_gpt.main(_run(data, tmp_path / "b", 4))
    meta = nn.load_metadata(tmp_path / "b" / CHECKPOINT)
    identity = json.loads(meta["data_identity"])
    assert identity["bytes"] == len(TEXT.encode()) and identity["characters"] == len(TEXT)
    assert identity["vocabulary"] == "".join(sorted(set(TEXT)))
    moved = tmp_path / "moved.txt"
    os.rename(data, moved)
    err = _exit_2(capsys, ["--resume", "--out", str(tmp_path / "b"), "--no-progress"])
    assert f"its run's data file {data} cannot be read (No such file or directory)" in err
    assert "pass --data FILE, its new path" in err and f"{len(TEXT):,} bytes" in err
    assert "--data " + data not in err  # no flag the user never gave
    resumed = train_gpt.main(["--resume", "--out", str(tmp_path / "b"), "--data", str(moved),
                              "--steps", "8", "--no-progress"])
    out = capsys.readouterr().out
    assert f"data: {moved} (the run's text, moved from {data})" in out
    assert [r["lr"] for r in resumed.history] == [r["lr"] for r in straight.history[4:]]
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # the checkpoint now points at the new path: the next resume needs no --data
    assert nn.load_metadata(tmp_path / "b" / CHECKPOINT)["data"] == str(moved)


def test_changed_data_is_refused_saying_what_changed(tmp_path, data, capsys):
    run = tmp_path / "run"
    train_gpt.main(_run(data, run, 2))
    resume = ["--resume", "--out", str(run), "--steps", "4", "--no-progress"]
    lines = TEXT.splitlines(keepends=True)
    pathlib.Path(data).write_text("".join(lines[::-1]))  # the same characters, reordered
    err = _exit_2(capsys, resume)
    assert f"cannot resume {run / CHECKPOINT}: {data}, the file its run trained on, has " \
           "changed: same size" in err
    assert "the same characters in a different text" in err and "sha256 " in err
    pathlib.Path(data).write_text(TEXT + "Z~")
    err = _exit_2(capsys, resume)
    assert f"size {len(TEXT):,} -> {len(TEXT) + 2:,} bytes" in err
    assert "characters added: 'Z', '~'" in err and "vocabulary" not in err.split(":")[0]
    other = tmp_path / "other.txt"
    other.write_text(TEXT.replace("x", ""))
    err = _exit_2(capsys, [*resume, "--data", str(other)])
    assert f"with --data {other}: it is not the text the run trained on ({data})" in err
    assert "characters removed: 'x'" in err
    pathlib.Path(data).write_text(TEXT)  # back as it was: it resumes
    assert train_gpt.main(resume).step == 4


def test_a_checkpoint_without_the_datas_identity_resumes_by_path(tmp_path, data, capsys):
    """Checkpoints written before the identity was recorded resume as they always did."""
    run = tmp_path / "run"
    train_gpt.main(_run(data, run, 2))
    path = run / CHECKPOINT
    meta = nn.load_metadata(path)
    del meta["data_identity"]
    nn.save(nn.load(path), path, metadata=meta)
    assert train_gpt.main(["--resume", "--out", str(run), "--steps", "3",
                           "--no-progress"]).step == 3
    meta = nn.load_metadata(path)
    del meta["data_identity"]
    nn.save(nn.load(path), path, metadata=meta)
    pathlib.Path(data).write_text(TEXT + "Q")  # the tokenizer's complaint names the file now
    err = _exit_2(capsys, ["--resume", "--out", str(run), "--steps", "4"])
    assert f"cannot resume {path} on {data}: the text has characters that the vocabulary" in err
    assert "lacks: 'Q'" in err


def test_a_config_that_disagrees_with_the_tensors_is_one_line(tmp_path, data, capsys):
    run = tmp_path / "run"
    train_gpt.main(_run(data, run, 2))
    path = run / CHECKPOINT
    meta = nn.load_metadata(path)
    config = json.loads(meta["gpt_config"])
    config["n_embd"] = 32  # hand-edited
    meta["gpt_config"] = json.dumps(config)
    nn.save(nn.load(path), path, metadata=meta)
    err = _exit_2(capsys, ["--resume", "--out", str(run), "--steps", "4"])
    assert err.count("\n") == 1  # one line
    assert "its tensors do not match its recorded gpt_config (vocab_size=" in err
    assert "n_embd=32" in err and "load_state_dict" not in err
    assert "model.transformer.wte.weight is (25, 16) in the file but (25, 32) for the config" \
        in err
    assert "(and " in err  # more tensors than the three named
    err = _exit_2(capsys, ["--ckpt", str(run)], sample.main)
    assert "its tensors do not match its recorded gpt_config" in err


def test_resuming_past_the_schedules_end_says_so(tmp_path, data, capsys):
    train_gpt.main(_tiny(data, tmp_path, "--steps", "3"))
    assert "note:" not in capsys.readouterr().out
    train_gpt.main(["--resume", "--out", str(tmp_path), "--steps", "5", "--no-progress"])
    out = capsys.readouterr().out
    assert ("note: this run's learning-rate schedule ends at step 3 (lr_decay_steps, fixed "
            "when the run started); steps 4 to 5 train at the minimum rate 0.001") in out
    train_gpt.main(["--resume", "--out", str(tmp_path), "--steps", "6", "--no-progress"])
    assert "; step 6 train at the minimum rate" in capsys.readouterr().out
