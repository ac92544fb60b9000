"""Every example as a new user first runs it: `--help` prints the flags and does nothing
else, an output folder that does not exist yet is created, and a size this machine cannot
hold ends in one line naming the memory it would need and what to lower (exit status 2),
before anything is allocated; a MemoryError past that estimate is one line too."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))
TOO_BIG = {  # far past any machine's memory, so the refusal does not depend on this one
    "train_gpt": ["--block-size", "1000000"],
    "attention_memory": ["--batch", "10000000"],
    "gpt_options_memory": ["--batch", "10000000"],
}


def _run(args, cwd, timeout=60, code=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TINYGRAD_ATTN_KERNELS": "numpy"}
    command = [sys.executable, *(["-c", code] if code else []), *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_the_examples_are_the_ones_checked_here():
    assert {"autodiff_tour", "memory_viewer", "train_gpt", "sample"} <= set(EXAMPLES)
    assert set(TOO_BIG) <= set(EXAMPLES)


def test_every_example_takes_help_and_does_nothing_else(tmp_path):
    procs = {name: subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), "--help"], cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for name in EXAMPLES}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (name, err)
        assert out.startswith("usage:") and "--help" in out, (name, out)
    assert list(tmp_path.iterdir()) == []  # the tour used to run, then write --help/graph.svg


def test_the_tour_creates_its_output_folder(tmp_path):
    run = _run([ROOT / "examples" / "autodiff_tour.py", "--out", "new/dir"], tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "new" / "dir" / "graph.svg").stat().st_size > 1000
    run = _run([ROOT / "examples" / "autodiff_tour.py", "older"], tmp_path)  # the old form
    assert run.returncode == 0 and (tmp_path / "older" / "graph.svg").exists(), run.stderr


def test_the_tour_names_an_output_folder_it_cannot_create(tmp_path):
    (tmp_path / "a_file").write_text("")
    run = _run([ROOT / "examples" / "autodiff_tour.py", "--out", "a_file/sub"], tmp_path)
    assert run.returncode == 2 and "a_file/sub" in _one_line(run.stderr)
    assert "==" not in run.stdout  # refused before the tour ran


def test_the_memory_viewer_creates_its_output_folder(tmp_path):
    run = _run([ROOT / "examples" / "memory_viewer.py", "--out", "not/yet"], tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "not" / "yet" / "memory.html").stat().st_size > 1000


@pytest.mark.parametrize("name", sorted(TOO_BIG))
def test_an_impossible_size_is_one_line_before_allocating(tmp_path, name):
    run = _run([ROOT / "examples" / f"{name}.py", *TOO_BIG[name], "--out", tmp_path / "o"]
               if name == "train_gpt" else [ROOT / "examples" / f"{name}.py", *TOO_BIG[name]],
               tmp_path)
    assert run.returncode == 2, run.stderr
    line = _one_line(run.stderr)
    assert f"{name}.py: error:" in line and "GiB" in line and "available" in line, line
    assert ("--block-size" if name == "train_gpt" else "--batch") in line
    assert not (tmp_path / "o").exists()  # the run's folder, made for it, is gone again


def test_a_memory_error_past_the_estimate_is_one_line(tmp_path):
    """NumPy's _ArrayMemoryError (a MemoryError) raised inside the trainer: one line with
    its message, exit status 2, and the run's lock and new folder given back."""
    code = (
        "import runpy, sys, nn.trainer\n"
        "class Trainer(nn.trainer.Trainer):\n"
        "    def __init__(self, *a, **k):\n"
        "        raise MemoryError('Unable to allocate 37.3 GiB for an array with shape '\n"
        "                          '(100000, 100000) and data type float32')\n"
        "nn.trainer.Trainer = Trainer\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    run = _run([ROOT / "examples" / "train_gpt.py", "--out", tmp_path / "o", "--steps", "1"],
               tmp_path, code=code)
    assert run.returncode == 2, run.stderr
    line = _one_line(run.stderr)
    assert "out of memory: Unable to allocate 37.3 GiB" in line and "--batch-size" in line
    assert not (tmp_path / "o").exists()
