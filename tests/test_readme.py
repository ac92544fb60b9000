"""README.md's Python blocks run, in order, as a reader would paste them.

The blocks share one namespace (a later block uses `ta` imported by the first), and run
in a temporary folder (they write pictures). A block that is deliberately not runnable is
fenced ```python no-run; this test also keeps such blocks rare."""

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
