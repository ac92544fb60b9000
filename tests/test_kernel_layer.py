"""The kernel layer's choice (backend/kernels/__init__.py): the modes and their checks, the
environment variable, the size threshold of "auto", the operands the compiled path takes,
the `calls` counter, a compiled kernel declining, and numba kept out of every module but
the compiled package (and out of the process until a compiled kernel runs)."""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tinygrad_attn.backend import kernels

ROOT = pathlib.Path(__file__).resolve().parents[1]
NO_NUMBA = "import sys; sys.modules['numba'] = None  # as if numba were not installed\n"


@pytest.fixture
def mode():
    """Restores the kernel mode after the test: straight into the state, since a test may
    have patched numba_available, and set_kernels("numba") would then refuse the mode
    that was valid when it was saved (TINYGRAD_ATTN_KERNELS=numba runs)."""
    before = kernels.get_kernels()
    yield
    kernels._state["mode"] = before


@pytest.fixture
def twin(monkeypatch, mode):
    """A compiled gelu_forward (numba's module loaded) whose calls the test can see."""
    pytest.importorskip("numba")
    compiled = kernels._load_compiled()
    seen = []

    def gelu_forward(x):
        seen.append(x.shape)
        return kernels.reference.gelu_forward(x) + 1  # told apart from the reference
    monkeypatch.setattr(compiled, "gelu_forward", gelu_forward, raising=False)
    return seen


def _run(code: str, no_numba: bool = False, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != kernels.ENV}
    full.update(env, PYTHONPATH=str(ROOT))
    code = (NO_NUMBA if no_numba else "") + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=full, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("bad", ["fast", "NUMBA", "", None, 1])
def test_set_kernels_rejects(bad, mode):
    kernels.set_kernels("numpy")
    with pytest.raises(ValueError, match="set_kernels"):
        kernels.set_kernels(bad)
    assert kernels.get_kernels() == "numpy"


@pytest.mark.parametrize("name", ["auto", "numpy"])
def test_set_kernels_round_trips(name, mode):
    kernels.set_kernels(name)
    assert kernels.get_kernels() == name


def test_set_kernels_numba_without_numba(monkeypatch, mode):
    kernels.set_kernels("numpy")
    monkeypatch.setattr(kernels, "numba_available", lambda: False)
    with pytest.raises(ImportError, match="numba"):
        kernels.set_kernels("numba")
    assert kernels.get_kernels() == "numpy"


@pytest.mark.parametrize("value, want", [("numpy", "numpy"), (" NumPy ", "numpy"),
                                         ("auto", "auto"), ("", "auto")])
def test_env_var_read_at_import(value, want):
    out = _run("from tinygrad_attn.backend import kernels; print(kernels.get_kernels())",
               TINYGRAD_ATTN_KERNELS=value)
    assert out.stdout.split() == [want], out.stderr


def test_env_var_invalid_fails_at_import():
    out = _run("import tinygrad_attn", TINYGRAD_ATTN_KERNELS="fastest")
    assert out.returncode != 0
    assert "ValueError" in out.stderr and "TINYGRAD_ATTN_KERNELS" in out.stderr


def test_env_var_numba_without_numba_fails_at_import():
    out = _run("import tinygrad_attn", no_numba=True, TINYGRAD_ATTN_KERNELS="numba")
    assert out.returncode != 0
    assert "ImportError" in out.stderr and "TINYGRAD_ATTN_KERNELS" in out.stderr


def test_without_numba_everything_runs_the_reference():
    out = _run(no_numba=True, code="""
        import numpy as np
        import tinygrad_attn as ta
        from tinygrad_attn.backend import kernels
        try:
            kernels.set_kernels("numba")
        except ImportError:
            print("refused")
        x = ta.randn(64, 1024, requires_grad=True)  # above AUTO_MIN_SIZE
        ta.functional.gelu(x).sum().backward()
        print(kernels.get_kernels(), sorted(kernels.calls.items()))
        """)
    assert out.returncode == 0, out.stderr
    refused, mode, *counts = out.stdout.split(maxsplit=2)
    assert (refused, mode) == ("refused", "auto")
    assert "'numba'" not in counts[0] and "('gelu_forward', 'numpy'), 1" in counts[0]


def test_auto_threshold(twin, monkeypatch):
    kernels.set_kernels("auto")
    monkeypatch.setitem(kernels.background._bg, "ready", set())
    monkeypatch.setitem(kernels.background._bg, "missed", set())
    small = np.ones(kernels.AUTO_MIN_SIZE - 1, np.float32)
    big = np.ones(kernels.AUTO_MIN_SIZE, np.float32)
    np.testing.assert_array_equal(kernels.gelu_forward(small),
                                  kernels.reference.gelu_forward(small))
    assert kernels.wait_compiled(60)
    assert twin == []  # below the threshold: not even queued for the compiler
    # above it, the first call looks for the kernel without compiling: the twin needs no
    # compiling (as a kernel in numba's cache), so it runs at once, with nothing queued
    np.testing.assert_array_equal(kernels.gelu_forward(big),
                                  kernels.reference.gelu_forward(big) + 1)
    assert twin == [big.shape] and not kernels.background._bg["queue"]
    assert kernels.wait_compiled(60)
    kernels.gelu_forward(big)
    assert twin == [big.shape, big.shape]


def test_auto_without_numba_runs_the_reference(twin, monkeypatch):
    kernels.set_kernels("auto")
    monkeypatch.setattr(kernels, "numba_available", lambda: False)
    kernels.gelu_forward(np.ones(kernels.AUTO_MIN_SIZE * 4, np.float32))
    assert twin == []


def test_numba_mode_at_any_size(twin):
    kernels.set_kernels("numba")
    kernels.gelu_forward(np.ones(3, np.float64))
    kernels.gelu_forward(np.ones((0, 5), np.float32))
    assert twin == [(3,), (0, 5)]


@pytest.mark.parametrize("operand", [
    np.ones(8, np.float16), np.ones((4, 4), np.float32)[:, ::2],
    np.ones((4, 4), np.float32).T])
def test_numba_mode_leaves_other_operands_to_the_reference(twin, operand):
    kernels.set_kernels("numba")
    np.testing.assert_array_equal(kernels.gelu_forward(operand),
                                  kernels.reference.gelu_forward(operand))
    assert twin == []


def test_mixed_dtypes_go_to_the_reference(twin, monkeypatch):
    kernels.set_kernels("numba")
    seen = []
    monkeypatch.setattr(kernels._load_compiled(), "gelu_backward",
                        lambda x, g: seen.append(1) or x, raising=False)
    x = np.ones(8, np.float32)
    kernels.gelu_backward(x, np.ones(8, np.float64))
    assert seen == []
    kernels.gelu_backward(x, np.ones(8, np.float32))
    assert seen == [1]


def test_calls_counts_each_path(twin):
    x = np.ones(kernels.AUTO_MIN_SIZE, np.float32)
    before = kernels.calls.copy()
    kernels.set_kernels("numba")
    kernels.gelu_forward(x)
    kernels.gelu_forward(x)
    kernels.set_kernels("numpy")
    kernels.gelu_forward(x)
    diff = kernels.calls - before
    assert dict(diff) == {("gelu_forward", "numba"): 2, ("gelu_forward", "numpy"): 1}


def test_a_declining_kernel_falls_back(monkeypatch, mode):
    pytest.importorskip("numba")
    compiled = kernels._load_compiled()
    monkeypatch.setattr(compiled, "gelu_forward", lambda x: NotImplemented, raising=False)
    kernels.set_kernels("numba")
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    before = kernels.calls.copy()
    np.testing.assert_array_equal(kernels.gelu_forward(x), kernels.reference.gelu_forward(x))
    assert dict(kernels.calls - before) == {("gelu_forward", "numpy"): 1}


def _numba_importers():
    """The project's modules (tinygrad_attn, nn) that import numba or llvmlite."""
    found = []
    for top in ("tinygrad_attn", "nn"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                if any(n.split(".")[0] in ("numba", "llvmlite") for n in names):
                    found.append(path.relative_to(ROOT).as_posix())
                    break
    return found


def test_only_compiled_imports_numba():
    importers = _numba_importers()
    assert importers and all(p.startswith("tinygrad_attn/backend/kernels/compiled/")
                             for p in importers), importers


def test_no_test_imports_numba_at_module_level():
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""])
                assert not any(n.split(".")[0] == "numba" for n in names), path.name


@pytest.mark.parametrize("env", ["auto", "numpy"])
def test_importing_the_engine_does_not_import_numba(env):
    out = _run("""
        import sys
        import nn
        import tinygrad_attn as ta
        x = ta.randn(4, 8, requires_grad=True)  # below AUTO_MIN_SIZE: the reference
        ta.functional.gelu(x).sum().backward()
        print("numba" in sys.modules, "llvmlite" in sys.modules)
        """, TINYGRAD_ATTN_KERNELS=env)
    assert out.stdout.split() == ["False", "False"], out.stderr
