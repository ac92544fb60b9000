"""examples/train_gpt.py keeps the run: a checkpoint by default, saved on SIGINT / SIGTERM
with the command that resumes, an out directory checked and locked before training, a
full disk named, and no run silently replacing another's checkpoint.

The signal tests run the trainer in a subprocess with a tiny model; a launcher (test code
only) makes each step sleep a little after its backward, so a signal reliably lands inside a
step, and a second one inside the same step.
"""

import errno
import json
import os
import pathlib
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import load_example

import nn
from nn.trainer import CHECKPOINT, LOCK, RunLock, RunLocked

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_gpt.py"
TEXT = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n" for i in range(400))

# the trainer with each step sleeping STEP_SLEEP seconds after its backward
LAUNCHER = """
import os, runpy, sys, time
import nn.trainer
delay = float(os.environ.get("STEP_SLEEP", "0"))
forward_backward = nn.trainer.Trainer.forward_backward
def slow(self, *args, **kwargs):
    loss = forward_backward(self, *args, **kwargs)
    print(f"(test: step {self.step + 1} sleeps)", flush=True)
    time.sleep(delay)
    return loss
nn.trainer.Trainer.forward_backward = slow
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


train_gpt = load_example("train_gpt")


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text(TEXT)
    return str(path)


def _tiny(data, *extra):
    return ["--data", data, "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
            "--block-size", "16", "--batch-size", "4", "--eval-every", "0", "--eval-iters", "1",
            "--sample-tokens", "0", "--warmup", "2", "--lr", "1e-2", "--min-lr", "1e-3",
            "--no-progress", *extra]


def _env(**extra):
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra}


class _Trainer:
    """train_gpt.py in a subprocess, its output (stdout and stderr) read line by line."""

    def __init__(self, args, cwd, step_sleep=0.2):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(SCRIPT), *args], cwd=cwd, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=_env(STEP_SLEEP=str(step_sleep)))
        self.lines: list[str] = []
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.queue.put(line)
        self.queue.put(None)

    def wait_for(self, text, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no {text!r} in {timeout} s:\n{self.output}") from None
            if line is None:
                raise AssertionError(f"exited before {text!r}:\n{self.output}")
            self.lines.append(line)
            if text in line:
                return line

    def finish(self, timeout=60):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        while (line := self.queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return rc

    @property
    def output(self):
        return "".join(self.lines)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _weights(out):
    return {k: v.numpy() for k, v in nn.load(os.path.join(out, CHECKPOINT)).items()
            if k.startswith("model.")}


def _exit(capsys, argv, status=2):
    with pytest.raises(SystemExit) as info:
        train_gpt.main(argv)
    assert info.value.code == status
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out, captured.err


# ----------------------------------------------------------------------------- signals
def test_sigint_saves_says_how_to_resume_and_the_resume_is_exact(tmp_path, data):
    """Ctrl-C mid-run: the step finishes, the checkpoint is saved and named with the command
    that resumes; that command, run as printed, continues the run bit for bit."""
    args = _tiny(data, "--steps", "1000", "--lr-decay-steps", "1000")
    with _Trainer([*args, "--out", "run"], cwd=tmp_path) as trainer:
        trainer.wait_for("memory of the first step")
        trainer.wait_for("(test: step 2 sleeps)")
        trainer.proc.send_signal(signal.SIGINT)
        assert trainer.finish() == 130
    out = trainer.output
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    assert "checkpoint: run/ckpt.safetensors (at the end, and on Ctrl-C or SIGTERM)" in out
    m = re.search(r"SIGINT: finishing step (\d+), then saving the checkpoint to "
                  r"run/ckpt.safetensors; Ctrl-C again stops at once, without saving", out)
    assert m, out
    step = int(m.group(1))
    assert f"checkpoint: step {step} saved to run/ckpt.safetensors" in out
    assert (f"train_gpt.py: SIGINT: stopped at step {step} of 1000; checkpoint saved to "
            f"run/ckpt.safetensors") in out
    assert nn.load_metadata(tmp_path / "run" / CHECKPOINT)["step"] == str(step)
    assert not (tmp_path / "run" / LOCK).exists()  # released at exit

    command = shlex.split(out.split("resume with: ")[1].splitlines()[0])
    assert command[-3:] == ["--out", "run", "--resume"]
    command[0] = sys.executable  # "python" where that is this interpreter
    resumed = subprocess.run([*command, "--steps", str(step + 2)], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from run/ckpt.safetensors at step {step}" in resumed.stdout
    straight = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--steps", str(step + 2), "--out", "straight"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert straight.returncode == 0, straight.stderr
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "run")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_sigterm_saves_and_exits_143_and_the_lock_keeps_a_second_trainer_out(
        tmp_path, data, capsys):
    with _Trainer([*_tiny(data, "--steps", "1000"), "--out", "run"], cwd=tmp_path) as first:
        first.wait_for("(test: step 2 sleeps)")
        lock = json.loads((tmp_path / "run" / LOCK).read_text())
        assert lock["pid"] == first.proc.pid and lock["host"] == socket.gethostname()
        _, err = _exit(capsys, [*_tiny(data, "--steps", "2"), "--out", str(tmp_path / "run")])
        assert f"{tmp_path / 'run'} is in use by another trainer (pid {first.proc.pid} on " \
               f"host {socket.gethostname()} holds {tmp_path / 'run' / LOCK} since" in err
        first.proc.send_signal(signal.SIGTERM)
        assert first.finish() == 143
    out = first.output
    step = int(re.search(r"SIGTERM: finishing step (\d+)", out).group(1))
    assert "a second signal stops at once, without saving" in out
    assert f"SIGTERM: stopped at step {step} of 1000; checkpoint saved to run/" in out
    assert "resume with: " in out and "Traceback" not in out
    assert nn.load_metadata(tmp_path / "run" / CHECKPOINT)["step"] == str(step)
    assert not (tmp_path / "run" / LOCK).exists()


def test_a_second_sigint_exits_at_once_without_saving(tmp_path, data):
    with _Trainer([*_tiny(data, "--steps", "1000"), "--out", "run"], cwd=tmp_path,
                  step_sleep=1.0) as trainer:
        trainer.wait_for("(test: step 2 sleeps)")
        trainer.proc.send_signal(signal.SIGINT)
        trainer.wait_for("SIGINT: finishing step 2")
        sent = time.monotonic()
        trainer.proc.send_signal(signal.SIGINT)
        assert trainer.finish(timeout=30) == 130
        assert time.monotonic() - sent < 0.9  # not after the step's second of sleep
    out = trainer.output
    assert "train_gpt.py: SIGINT: stopped at once; nothing was saved" in out
    assert "saved to" not in out and "Traceback" not in out
    assert not (tmp_path / "run").exists()  # made by the run, left empty: removed


# ----------------------------------------------------------------------------- the out directory
def test_the_default_run_saves_in_a_new_runs_directory(tmp_path, data, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train_gpt.main(_tiny(data, "--steps", "2"))
    train_gpt.main(_tiny(data, "--steps", "2"))
    out = capsys.readouterr().out
    dirs = re.findall(r"checkpoint: (runs/\d{8}-\d{6}(?:-\d+)?)/ckpt.safetensors \(at the end",
                      out)
    assert len(dirs) == 2 and dirs[0] != dirs[1], out
    for d in dirs:
        assert f"checkpoint: step 2 saved to {d}/ckpt.safetensors" in out
        assert f"sample.py --ckpt {d}" in out
        assert nn.load_metadata(tmp_path / d / CHECKPOINT)["step"] == "2"
    assert (tmp_path / "runs" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_a_fresh_run_into_a_directory_with_a_checkpoint(tmp_path, data, capsys):
    run = tmp_path / "run"
    train_gpt.main([*_tiny(data, "--steps", "3"), "--out", str(run)])
    before = (run / CHECKPOINT).read_bytes()
    _, err = _exit(capsys, [*_tiny(data, "--steps", "2", "--seed", "7"), "--out", str(run)])
    assert f"--out {run} already holds a checkpoint ({run / CHECKPOINT}, at step 3): " \
           "--resume continues that run, --overwrite replaces it" in err
    assert (run / CHECKPOINT).read_bytes() == before and not (run / LOCK).exists()
    new = train_gpt.main([*_tiny(data, "--steps", "2", "--seed", "7"), "--out", str(run),
                          "--overwrite"])
    assert new.step == 2 and nn.load_metadata(run / CHECKPOINT)["step"] == "2"
    _, err = _exit(capsys, ["--resume", "--overwrite", "--out", str(run)])
    assert "give one of them" in err


def test_an_unwritable_out_is_refused_before_training(tmp_path, data, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    out, err = _exit(capsys, [*_tiny(data, "--steps", "2"), "--out", str(afile / "run")])
    assert f"--out {afile / 'run'}: cannot write there (Not a directory); checked before " \
           "training" in err
    assert "memory of the first step" not in out and "corpus:" not in out
    assert f"--out {afile}: not a directory" in _exit(
        capsys, [*_tiny(data, "--steps", "2"), "--out", str(afile)])[1]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into a read-only directory")
def test_a_read_only_out_is_refused_before_training(tmp_path, data, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        out, err = _exit(capsys, [*_tiny(data, "--steps", "2"), "--out", str(ro)])
    finally:
        ro.chmod(0o755)
    assert f"--out {ro}: cannot write there (Permission denied)" in err
    assert "corpus:" not in out


def test_lock_file_stale_owner_removed_live_or_foreign_owner_refused(tmp_path, data, capsys):
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                        "started": "then"}))
    train_gpt.main([*_tiny(data, "--steps", "2"), "--out", str(run)])  # a dead owner's lock
    assert not (run / LOCK).exists()
    resume = ["--resume", "--out", str(run), "--steps", "3", "--no-progress"]
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as alive:
        try:
            (run / LOCK).write_text(json.dumps({"pid": alive.pid, "host": socket.gethostname(),
                                                "started": "now"}))
            _, err = _exit(capsys, resume)
            assert f"(pid {alive.pid} on host {socket.gethostname()} holds" in err
        finally:
            alive.kill()
    (run / LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "now"}))
    _, err = _exit(capsys, resume)  # another host's pid cannot be judged from here
    assert "(pid 1 on host elsewhere holds" in err and "delete the lock file" in err
    (run / LOCK).unlink()
    assert train_gpt.main(resume).step == 3

    first = RunLock(str(run)).acquire()  # O_EXCL: the second of one process is refused too
    with pytest.raises(RunLocked, match="is in use by another trainer"):
        RunLock(str(run)).acquire()
    first.release()
    with RunLock(str(run)):
        assert (run / LOCK).exists()
    assert not (run / LOCK).exists()


def test_of_trainers_racing_for_a_stale_lock_exactly_one_gets_it(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    race = ("import sys, time\n"
            "from nn.trainer import RunLock, RunLocked\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"  # all start together
            "try:\n"
            "    RunLock(sys.argv[1]).acquire()\n"
            "    print('got', flush=True)\n"
            "    time.sleep(1)\n"  # held while the others try
            "except RunLocked:\n"
            "    print('refused')\n")
    procs = [subprocess.Popen([sys.executable, "-c", race, str(tmp_path)], env=_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        assert p.stdout.readline() == "ready\n"  # imported, waiting on stdin
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert results == ["got", "refused", "refused"]


# ----------------------------------------------------------------------------- a full disk
def _no_space(monkeypatch):
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)  # where save() learns its bytes did not fit


def test_a_full_disk_names_the_file_and_keeps_the_previous_checkpoint(
        tmp_path, data, capsys, monkeypatch):
    run = tmp_path / "run"
    train_gpt.main([*_tiny(data, "--steps", "2"), "--out", str(run)])
    before = (run / CHECKPOINT).read_bytes()
    capsys.readouterr()
    _no_space(monkeypatch)
    _, err = _exit(capsys, ["--resume", "--out", str(run), "--steps", "4", "--no-progress"],
                   status=1)
    assert (f"train_gpt.py: error: cannot save the checkpoint of step 4 to {run / CHECKPOINT}: "
            "No space left on device; the previous checkpoint there (step 2) is whole; once "
            "there is room, resume with: ") in err
    assert (run / CHECKPOINT).read_bytes() == before
    assert sorted(os.listdir(run)) == [CHECKPOINT]  # no temporary, no lock left

    _, err = _exit(capsys, [*_tiny(data, "--steps", "2"), "--out", str(tmp_path / "new")],
                   status=1)
    assert f"to {tmp_path / 'new' / CHECKPOINT}: No space left on device; no checkpoint " \
           "was written" in err


def _tmpfs(path, size):
    path.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(path)], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode:
        pytest.skip("cannot mount a tmpfs here")


def test_a_real_full_disk_on_a_small_tmpfs(tmp_path, data, capsys):
    """A filesystem 1.5 times the size of the tiny model's checkpoint holds one of them,
    but not the temporary of the next save beside it."""
    train_gpt.main([*_tiny(data, "--steps", "1"), "--out", str(tmp_path / "probe")])
    size = (tmp_path / "probe" / CHECKPOINT).stat().st_size
    disk = tmp_path / "disk"
    _tmpfs(disk, f"{size * 3 // 2 // 1024 + 8}k")  # + a page for the lock, rounding
    try:
        _, err = _exit(capsys, [*_tiny(data, "--steps", "3", "--save-every", "1"),
                                "--out", str(disk / "run")], status=1)
        assert (f"cannot save the checkpoint of step 2 to {disk / 'run' / CHECKPOINT}: No "
                "space left on device; the previous checkpoint there (step 1) is whole") in err
        assert nn.load_metadata(disk / "run" / CHECKPOINT)["step"] == "1"
        assert sorted(os.listdir(disk / "run")) == [CHECKPOINT]
    finally:
        subprocess.run(["umount", str(disk)], timeout=30)


def test_too_little_space_for_a_checkpoint_is_refused_before_training(tmp_path, data, capsys):
    disk = tmp_path / "disk"
    _tmpfs(disk, "16k")
    try:
        out, err = _exit(capsys, [*_tiny(data, "--steps", "3"), "--out", str(disk / "run")])
        assert re.search(rf"--out {re.escape(str(disk / 'run'))}: 1[0-9].\d KiB free on its "
                         r"filesystem, and a checkpoint of this model needs about 4\d.\d KiB",
                         err), err
        assert "memory of the first step" not in out
    finally:
        subprocess.run(["umount", str(disk)], timeout=30)
