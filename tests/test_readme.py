"""README.md's Python blocks run, in order, as a reader would use them: run as a script,
and pasted into the Python shell line by line.

The blocks share one namespace (a later block uses `ta` imported by the first), and run
in a temporary folder (they write pictures). A block that is deliberately not runnable is
fenced ```python no-run; this test also keeps such blocks rare. The shell reads a paste a
statement at a time, so a statement right after an indented block needs a blank line
before it, or the paste is a SyntaxError there; the second test feeds each block through
code.InteractiveConsole the way the shell does."""

import code as console_module
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def _blocks():
    return [(m.group(1).strip(), m.group(2))
            for m in FENCE.finditer((ROOT / "README.md").read_text())]


def test_readme_has_python_blocks_and_few_are_skipped():
    blocks = _blocks()
    runnable = [b for flag, b in blocks if flag != "no-run"]
    assert len(runnable) >= 3
    assert len(blocks) - len(runnable) <= 1


def test_every_python_block_of_the_readme_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    for i, (flag, code) in enumerate(_blocks()):
        if flag == "no-run":
            continue
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "Memory profile on cpu" in out and "Backward peak" in out  # prof.report()
    assert "digraph backward" in out  # graph.to_dot()
    for picture in ("memory.png", "memory.html", "graph.svg"):
        assert (tmp_path / picture).stat().st_size > 1000


class _Shell(console_module.InteractiveConsole):
    """The REPL's reading of a paste: each line pushed as typed; errors recorded."""

    def __init__(self, namespace, where):
        super().__init__(namespace)
        self.where, self.errors = where, []

    def showsyntaxerror(self, filename=None, **kwargs):
        self.errors.append(f"{self.where}: SyntaxError in the shell at line {self.line_no}")

    def showtraceback(self):
        import traceback
        self.errors.append(f"{self.where}, line {self.line_no}: " + traceback.format_exc())


def _paste(shell: _Shell, block: str) -> None:
    for shell.line_no, line in enumerate(block.splitlines(), 1):
        shell.push(line)
    shell.push("")  # the Enter that ends the paste


def test_every_python_block_of_the_readme_pastes_into_the_shell(tmp_path, monkeypatch,
                                                               capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__console__"}
    errors = []
    for i, (flag, block) in enumerate(_blocks()):
        if flag == "no-run":
            continue
        shell = _Shell(namespace, f"README.md python block {i + 1}")
        _paste(shell, block)
        errors += shell.errors
    assert not errors, "\n".join(errors)
    assert (tmp_path / "graph.svg").exists() and "Backward peak" in capsys.readouterr().out


def test_the_shell_check_catches_a_statement_after_a_with_block():
    shell = _Shell({}, "a block")
    _paste(shell, "import contextlib\nwith contextlib.nullcontext():\n    x = 1\ny = x\n")
    assert shell.errors and "SyntaxError" in shell.errors[0]
    shell = _Shell({}, "a block")
    _paste(shell, "import contextlib\nwith contextlib.nullcontext():\n    x = 1\n\ny = x\n")
    assert not shell.errors and shell.locals["y"] == 1
