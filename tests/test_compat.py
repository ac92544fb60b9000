"""`python -m tinygrad_attn.compat SCRIPT`: torch names resolved to the engine (never the
real torch, installed or not), a missing torch.X refused at its import in one line, the
script's exit status passed through, and the memory ledger's report and viewer of the run."""

import importlib
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import nn
import tinygrad_attn as ta
from tinygrad_attn import compat

ROOT = Path(__file__).resolve().parents[1]


def run(tmp_path: Path, source: str, *args: str, runner_args=(), name="script.py"):
    """Write `source` as tmp_path/name and run it under the compat runner."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    return run_file(tmp_path, script, *args, runner_args=runner_args)


def run_file(cwd: Path, script: Path, *args: str, runner_args=()):
    """Run `script` under the compat runner in a child process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "tinygrad_attn.compat", *runner_args, str(script), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def run_here(tmp_path: Path, source: str, *runner_args: str) -> int:
    """Write `source` as tmp_path/script.py and run it under the runner in this process."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    return compat.main([*runner_args, str(script)])


def test_resolve_ignores_the_real_torch_already_imported():
    """A process that imported the real torch (a test suite, a notebook) still resolves torch
    names to the engine: sys.modules' real torch.nn.modules is never the parent looked in."""
    pytest.importorskip("torch.nn.modules.linear")
    assert compat.resolve("torch.nn.modules.linear") is importlib.import_module(
        "nn.modules.linear")


def test_the_table_resolves_torch_names_to_engine_modules():
    assert compat.resolve("torch") is ta
    assert compat.resolve("torch.nn") is nn
    assert compat.resolve("torch.nn.functional") is nn.functional
    assert compat.resolve("torch.autograd") is ta.autograd
    # not in the table: found through the nearest listed parent
    linear = importlib.import_module("nn.modules.linear")
    assert compat.resolve("torch.nn.modules.linear") is linear
    with pytest.raises(ModuleNotFoundError, match=r"torch\.nn\.no_such_module is not provided"):
        compat.resolve("torch.nn.no_such_module")
    with pytest.raises(ModuleNotFoundError, match=r"docs/differences\.md"):
        compat.resolve("torch.no_such_package.sub")


def test_torch_aliased_maps_imports_in_process_and_restores_sys_modules():
    before = {k: v for k, v in sys.modules.items() if k == "torch" or k.startswith("torch.")}
    with compat.torch_aliased():
        import torch
        import torch.nn.functional as F
        assert torch is ta and F is nn.functional and torch.nn is nn
        assert sys.modules["torch.nn"] is nn
    after = {k: v for k, v in sys.modules.items() if k == "torch" or k.startswith("torch.")}
    assert after == before
    assert ta.__spec__.name == "tinygrad_attn"  # the engine keeps its own spec


def test_script_runs_as_main_with_torch_mapped_never_the_real_one(tmp_path):
    (tmp_path / "helper_mod.py").write_text("VALUE = 41\n")
    proc = run(tmp_path, """
        import importlib.util
        import sys
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from torch import autograd
        from helper_mod import VALUE  # the script's own folder is sys.path[0]
        assert __name__ == "__main__"
        print("names", torch.__name__, nn.__name__, F.__name__, autograd.__name__)
        print("same", torch.nn is nn, sys.modules["torch.nn.functional"] is F)
        print("argv", sys.argv[1:], sys.path[0] == __import__("os").path.dirname(__file__))
        x = torch.ones(2, 3, requires_grad=True)
        (x * 2).sum().backward()
        print("grad", x.grad.tolist(), VALUE + 1)
        # the real torch is installed beside the engine, and not one of its modules is loaded
        real = [k for k, m in sys.modules.items() if "site-packages/torch" in
                (getattr(m, "__file__", None) or "").replace("\\\\", "/")]
        print("real", real, importlib.util.find_spec("torch").origin == torch.__file__)
    """, "--steps", "3", "-x")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "names tinygrad_attn nn nn.functional tinygrad_attn.autograd"
    assert out[1] == "same True True"
    assert out[2] == "argv ['--steps', '3', '-x'] True"
    assert out[3] == "grad [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]] 42"
    assert out[4] == "real [] True"


def test_a_missing_torch_name_fails_at_its_import_in_one_line(tmp_path):
    proc = run(tmp_path, "import os\nfrom torch.nn.parallel import NoSuchWrapper\nprint(1)\n")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        "script.py:2: torch.nn.parallel.NoSuchWrapper is not provided by tinygrad_attn "
        "(what is missing and why: docs/differences.md)"]


@pytest.mark.parametrize("line, missing", [
    ("import torch.onnx", "torch.onnx"),
    ("from torch.no_such_module import thing", "torch.no_such_module"),
    ("from torch import no_such_name", "torch.no_such_name"),
    ("from torch.nn.functional import no_such_function", "torch.nn.functional.no_such_function"),
])
def test_each_form_of_a_missing_import_gives_the_line(tmp_path, capsys, line, missing):
    assert run_here(tmp_path, f"import os\n{line}\nprint('not reached')\n") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"script.py:2: {missing} is not provided by tinygrad_attn "
                   "(what is missing and why: docs/differences.md)\n")


def test_the_script_can_catch_a_missing_name_as_torch_raises_it(tmp_path, capsys):
    assert run_here(tmp_path, """
        try:
            import torch.onnx
        except ModuleNotFoundError as e:
            print(type(e).__name__, e.name)
    """) == 0
    assert capsys.readouterr().out == "MissingTorchName torch.onnx\n"


@pytest.mark.parametrize("tail, code, stderr", [
    ("sys.exit(3)", 3, ""),
    ("sys.exit(0)", 0, ""),
    ("sys.exit('stopped by the script')", 1, "stopped by the script\n"),
    ("pass", 0, ""),
])
def test_the_exit_status_passes_through(tmp_path, capsys, tail, code, stderr):
    assert run_here(tmp_path, f"import sys\nimport torch\nprint('ran')\n{tail}\n") == code
    assert capsys.readouterr() == ("ran\n", stderr)


def test_a_child_process_gets_the_scripts_exit_status(tmp_path):
    proc = run(tmp_path, "import sys\nimport torch\nsys.exit(int(sys.argv[1]))\n", "7")
    assert (proc.returncode, proc.stderr) == (7, "")


def test_an_exception_prints_the_scripts_traceback_without_the_runners_frames(tmp_path, capsys):
    code = run_here(tmp_path, """
        import torch
        def f():
            raise ValueError("bad value " + str(torch.tensor([1, 2]).sum().item()))
        f()
    """)
    err = capsys.readouterr().err
    assert code == 1
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad value 3"
    assert "script.py" in lines[1] and "compat.py" not in err


def test_memory_report_and_html_of_the_run_also_when_the_script_exits(tmp_path):
    html = tmp_path / "views" / "memory.html"
    proc = run(tmp_path, """
        import sys
        import torch
        import torch.nn as nn
        model = nn.Linear(16, 8)
        x = torch.randn(4, 16)
        model(x).pow(2).sum().backward()
        print("trained")
        sys.exit(5)
    """, runner_args=("--memory-report", "--memory-html", str(html)))
    assert proc.returncode == 5, proc.stderr
    out = proc.stdout
    assert out.startswith("trained\n")
    assert "=== memory ledger of script.py (tinygrad_attn.compat) ===" in out
    assert "Memory profile on cpu:" in out
    # the parameter of the user's Linear: float32[8, 16] = 512 B, charged to the script's line
    assert "512 B  parameter        float32[8, 16]" in out and "script.py:5" in out
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "script.py under tinygrad_attn.compat" in page
    assert f"wrote {html}" in proc.stderr


def test_memory_report_after_an_exception(tmp_path, capsys):
    code = run_here(tmp_path, """
        import torch
        y = torch.ones(32, 32) * 3
        raise RuntimeError("late failure")
    """, "--memory-report")
    out, err = capsys.readouterr()
    assert code == 1
    assert err.splitlines()[-1] == "RuntimeError: late failure"
    assert "=== memory ledger of script.py" in out
    assert "4.00 KiB  activation       float32[32, 32] from Mul at script.py:3" in out


def test_the_runner_refuses_a_missing_script(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        compat.main([str(tmp_path / "nope.py")])
    assert e.value.code == 2
    assert "no such script: " in capsys.readouterr().err


def test_the_readme_example_runs_under_the_runner_with_its_memory_report(capsys):
    example = ROOT / "examples" / "pytorch_gpt.py"
    code = compat.main(["--memory-report", str(example), "--steps", "2", "--n-layer", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "step   0  loss" in out and "step   1  loss" in out
    assert "=== memory ledger of pytorch_gpt.py (tinygrad_attn.compat) ===" in out
    # saved tensors are charged to the example's own lines and its modules' names
    assert "saved            float32[8, 32, 256] from Gelu in blocks.0.mlp.1 at " \
           "pytorch_gpt.py:51" in out


PROGRAM_SMOKE = {  # each program as a user runs it: random batches, dropout, sampling
    "char_gpt.py": ["--steps", "3", "--eval-every", "2", "--eval-iters", "1",
                    "--generate", "20"],
    "gpt_trainer.py": ["--max-iters", "3", "--dropout", "0.1", "--compile", "--out-dir", "o"],
    "char_mlp.py": ["--max-steps", "3", "--epochs", "1"],
    "mnist_cnn.py": ["--max-steps", "3", "--save-model"],
}


def test_every_program_runs_under_the_runner_as_a_user_runs_it(tmp_path):
    """No torch needed: tests/programs/ in their default modes (the random batches, dropout,
    shuffling and sampling that test_programs_vs_torch turns off to compare with torch)."""
    def smoke(name):
        cwd = tmp_path / name.removesuffix(".py")
        cwd.mkdir()
        script = ROOT / "tests" / "programs" / name
        proc = run_file(cwd, script, *PROGRAM_SMOKE[name])
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert " loss " in proc.stdout, (name, proc.stdout[-1000:])
        return proc

    with ThreadPoolExecutor(2) as pool:
        procs = dict(zip(PROGRAM_SMOKE, pool.map(smoke, PROGRAM_SMOKE)))
    sampled = [line for line in procs["char_gpt.py"].stdout.splitlines()
               if line.startswith("tokens ")]
    assert len(sampled[0].split()) == 1 + 21  # the prompt and 20 sampled by multinomial
    assert (tmp_path / "gpt_trainer" / "o" / "ckpt.pt").stat().st_size > 10_000
    assert "compile" in procs["gpt_trainer.py"].stderr  # torch.compile says it does nothing
    assert "Test set: Average loss:" in procs["mnist_cnn.py"].stdout
    assert (tmp_path / "mnist_cnn" / "mnist_cnn.pt").stat().st_size > 10_000
