"""examples/memory_story.py --quick: the story's sections on a tiny GPT under a 3 MiB budget.

The naive port runs out of memory under the budget with the holders report, the plan fits
and its verify (the step under the limit) passes, and the table has every row."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The quick config's 3 MiB budget is sized for the compiled kernels' temporaries: on the NumPy
# reference kernels this toy step's raw (tracemalloc) overhead is as large as its tensors and
# no setting's predicted raw peak fits (measured: 3.6 MiB at best); the full-size story does
# not depend on it
pytest.importorskip("numba", reason="the --quick budget is sized for the compiled kernels")

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("naive port", "unconstrained (views)", "planner's choice", "checkpoint every block",
        "flash only", "recompute policies only")
MiB = 2**20


def run_quick(tmp_path):
    js, md = tmp_path / "story.json", tmp_path / "story.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "memory_story.py"), "--quick",
         "--json", str(js), "--markdown", str(md)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    return proc, json.loads(js.read_text()), md.read_text()


def test_memory_story_quick(tmp_path):
    proc, out, md = run_quick(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert out["batch"] == 16 and out["budget"] == 3 * MiB and out["quick"] is True

    # 1. the naive port: OutOfMemoryError under the budget, with the holders report
    oom = out["naive_oom"]
    assert oom is not None
    assert "out of memory on cpu (emulated limit 3145728 bytes)" in oom
    assert "live by category: " in oom and "saved" in oom
    assert "ta.OutOfMemoryError:" in text and "live by category: " in text
    naive = out["naive_peaks"]
    assert naive["peak"] > 3 * MiB  # why it failed: without the limit it needs more
    assert naive["raw_peak"] >= naive["peak"]

    # 2. the unconstrained default step needs more than the budget too
    assert out["base_peaks"]["peak"] > 3 * MiB
    assert out["base_seconds"] > 0

    # 3. the plan fits and verify ran it under the limit within the budget
    plan = out["plan"]
    assert plan["fits"] is True and plan["needs"] is None
    assert plan["peak"] <= 3 * MiB and plan["raw_peak"] <= 3 * MiB
    v = plan["verify"]
    assert v["within_budget"] is True
    assert v["peak"] <= 3 * MiB and v["raw_peak"] <= 3 * MiB
    # the tensor peak is predicted to the byte (every allocation is affine in the batch)
    assert v["peak"] == plan["peak"]
    assert "memory plan: batch 16, budget 3.00 MiB: fits" in text
    assert "verify: ran under the limit" in text

    # 4. the table: every row, in order, in the printed and the markdown table
    rows = out["rows"]
    assert [r["name"] for r in rows] == list(ROWS)
    by = {r["name"]: r for r in rows}
    assert by["naive port"]["fits"] is False and by["naive port"]["seconds"] is None
    assert by["planner's choice"]["fits"] is True
    assert by["planner's choice"]["choice"] == plan["choice"]
    assert by["planner's choice"]["peak"] == v["peak"]
    assert by["checkpoint every block"]["choice"]["checkpoint"] == [0, 1]
    assert by["flash only"]["choice"] == {"attn": "flash", "policy": "save", "checkpoint": []}
    assert by["recompute policies only"]["choice"]["policy"] == "recompute"
    for r in rows:
        if r["fits"] and r["limited"]:  # ran under the limit: its tensor peak is within
            assert r["peak"] <= 3 * MiB and r["seconds"] > 0
    for name in ROWS:
        assert f"| {name} |" in text and f"| {name} |" in md
    assert "| row | choice | fits under the budget | tensor peak | raw peak | step s | " \
           "overhead vs unconstrained |" in md
    assert out["summary"] in text and out["summary"] in md
