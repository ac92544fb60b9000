"""docs/adding-an-op.md, followed to the letter: in a copy of the repository, its blocks are
pasted where the page says (the class and its @op line at the end of ops/math.py, the
gradcheck row at the top of UNARY, the conformance row at the top of ROWS), and the command
the page gives is run. Without the two rows the registry's tests must fail naming the op;
with them, everything the command selects passes, the new op's own rows included."""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from tinygrad_attn.ops.registry import REGISTRY

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "adding-an-op.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
OP = "rad2deg"  # the page's worked example


def _block(lang: str, starts: str) -> str:
    found = [code for kind, code in FENCE.findall(PAGE)
             if kind == lang and code.lstrip().startswith(starts)]
    assert len(found) == 1, f"docs/adding-an-op.md: no single ```{lang} block starting {starts!r}"
    return found[0]


def _row(table_block: str) -> str:
    """The row lines of a `TABLE = {` ... `...` ... `}` excerpt."""
    lines = table_block.splitlines()[1:]
    return "".join(line + "\n" for line in lines if line.strip() not in ("...", "}", ""))


def _paste_after(path: pathlib.Path, anchor: str, text: str) -> None:
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path.name}: the page's anchor {anchor!r} is not unique"
    path.write_text(source.replace(anchor, anchor + text))


def _command() -> list[str]:
    """The page's pytest command, its `VAR=value` prefix left to the environment."""
    line = next(x for x in _block("bash", "PYTHONPATH").splitlines() if "pytest" in x)
    words = [w for w in shlex.split(line) if not re.match(r"^[A-Z_]+=", w)]
    assert words[:3] == ["python", "-m", "pytest"], words
    return [sys.executable, *words[1:]]


def _pytest(copy: pathlib.Path, args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(copy), "TINYGRAD_ATTN_KERNELS": "numpy"}
    return subprocess.Popen([*args, "-p", "no:cacheprovider", "-rA"], cwd=copy, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _copy_with_the_op(dest: pathlib.Path) -> pathlib.Path:
    """The parts of the repository the tests import (their bytecode too: faster), with the
    page's class and @op line pasted at the end of ops/math.py."""
    for part in ("tinygrad_attn", "nn", "tests"):
        shutil.copytree(ROOT / part, dest / part)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    math_py = dest / "tinygrad_attn" / "ops" / "math.py"
    math_py.write_text(math_py.read_text() + "\n\n" + _block("python", "class Rad2deg")
                       + "\n\n" + _block("python", "@op(Rad2deg"))
    return dest


def _output(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out


def test_the_recipe_adds_an_op_the_registry_accepts(tmp_path):
    assert OP not in REGISTRY, (
        f"the engine has {OP} now: give docs/adding-an-op.md another worked example")
    bare, full = _copy_with_the_op(tmp_path / "bare"), _copy_with_the_op(tmp_path / "full")
    # full: the two rows too, pasted where the page says
    _paste_after(full / "tests" / "test_gradcheck_ops.py", "\nUNARY = {\n",
                 _row(_block("python", "UNARY = {")))
    _paste_after(full / "tests" / "test_ops_math.py", "\nROWS = {\n",
                 _row(_block("python", "ROWS = {")))
    bare_run = _pytest(bare, [sys.executable, "-m", "pytest", "tests/test_registry.py",
                              "tests/test_zero_size.py", "-k",
                              "gradcheck_row or conformance_rows or zero_size_row"])
    full_run = _pytest(full, _command())  # the page's own command
    (bare_rc, bare_out), (full_rc, full_out) = _output(bare_run), _output(full_run)

    # the class and its registration alone: the registry's tests name what is missing
    assert bare_rc == 1, bare_out[-3000:]
    failed = {line.split()[1] for line in bare_out.splitlines() if line.startswith("FAILED")}
    assert failed == {
        "tests/test_registry.py::test_every_differentiable_op_has_a_gradcheck_row",
        "tests/test_registry.py::test_every_registered_op_has_conformance_rows",
        "tests/test_zero_size.py::test_every_registered_op_has_a_zero_size_row",
    }, bare_out[-3000:]
    assert bare_out.count(f"['{OP}']") >= 3, bare_out[-3000:]

    # with the rows, the page's command passes, the new op's own rows among the tests run
    assert full_rc == 0, full_out[-5000:]
    passed = [line for line in full_out.splitlines() if line.startswith("PASSED")]
    ran = [line for line in passed if OP in line]
    assert any("test_gradcheck_ops.py" in line for line in ran), full_out[-3000:]
    assert any("test_every_registered_op_has_conformance_rows" in line for line in passed)
    if _has_torch():
        assert any("test_ops_math.py" in line for line in ran), full_out[-3000:]
        assert any("test_zero_size.py" in line for line in ran), full_out[-3000:]


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
