"""examples/train_gpt.py --memory-budget: the step planned (ta.memory.plan), the plan
printed, training under the emulated limit, the plan in the checkpoint and kept on resume.

Tiny configs, in-process (train_gpt.main(argv)), a few steps each.
"""

import gc
import json
import os

import pytest
from conftest import load_example

import nn
import tinygrad_attn as ta
from nn.trainer import CHECKPOINT, Trainer

# The budgets below (1 MiB at a 16-wide model) are sized for the compiled kernels: on the
# NumPy reference kernels this toy step's raw (tracemalloc) overhead is larger than its
# tensors and the plan refuses the budget
pytest.importorskip("numba", reason="the toy budgets are sized for the compiled kernels")
# planning reads tracemalloc's process-wide peak: run in a fresh process (see
# tests/test_memory_plan.py's note), by tests/test_memory_plan_fresh.py
pytestmark = pytest.mark.skipif(
    os.environ.get("TINYGRAD_ATTN_PLANNER_TESTS") != "1",
    reason="run in a fresh process by tests/test_memory_plan_fresh.py (tracemalloc is "
           "process-wide)")

TEXT = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n" for i in range(400))
BUDGET = 2**20  # 1 MiB: the tiny model's step fits at a few tens of rows

train_gpt = load_example("train_gpt")


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text(TEXT)
    return str(path)


def _tiny(data, out, *extra):
    return ["--data", data, "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
            "--block-size", "16", "--eval-every", "0", "--eval-iters", "1",
            "--sample-tokens", "0", "--steps", "3", "--no-progress", "--out", str(out),
            *extra]


@pytest.fixture
def limits(monkeypatch):
    """The emulated limit and gelu's save policy seen at each training step."""
    seen = []
    step = Trainer.train_step

    def train_step(self):
        seen.append((ta.memory.get_limit(self.tcfg.device),
                     ta.memory.save_policy("gelu")))
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    return seen


def _exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        train_gpt.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _plan_of(out):
    meta = nn.load_metadata(os.path.join(out, CHECKPOINT))
    return meta, ta.memory.Plan.from_dict(json.loads(meta["memory_plan"]))


def test_budget_and_batch_plan_print_and_train_under_the_limit(data, tmp_path, capsys,
                                                               limits):
    out = tmp_path / "run"
    trainer = train_gpt.main(_tiny(data, out, "--memory-budget", "1MiB", "--batch-size",
                                   "8"))
    text = capsys.readouterr().out
    meta, plan = _plan_of(out)
    assert plan.batch == 8 and plan.fits and trainer.tcfg.batch_size == 8
    assert str(plan) in text  # printed before training, as saved
    assert text.index("memory plan: batch 8") < text.index("memory of the first step")
    assert meta["memory_budget"] == str(BUDGET)
    # the step was planned within the budget less the corpus's tensors: the int64 ids
    corpus = 8 * len(TEXT)
    assert plan.budget == BUDGET - corpus
    # the model built from the plan's choice
    gcfg = json.loads(meta["gpt_config"])
    assert gcfg["attn"] == plan.choice["attn"]
    assert gcfg["checkpoint"] == plan.choice["checkpoint"]
    assert set(plan.knobs) == {"attn", "policy", "checkpoint"}
    assert plan.knobs["attn"] == ["views", "flash"] and plan.time_batches == [2, 4]
    # every step under the limit of the budget itself and the plan's save policy; no
    # OutOfMemoryError; the limit and the policies as they were afterwards
    assert limits == [(BUDGET, plan.choice["policy"])] * 3 and trainer.step == 3
    assert all(0 < rec["peak_bytes"] <= BUDGET for rec in trainer.history)
    assert ta.memory.get_limit() is None and ta.memory.save_policy("gelu") == "save"


def test_resume_keeps_the_plan_and_refuses_another_budget(data, tmp_path, capsys, limits):
    out = tmp_path / "run"
    train_gpt.main(_tiny(data, out, "--memory-budget", "1MiB", "--batch-size", "8"))
    meta, plan = _plan_of(out)
    capsys.readouterr()
    limits.clear()
    resumed = train_gpt.main(_tiny(data, out, "--resume", "--steps", "5"))
    text = capsys.readouterr().out
    assert "memory plan: batch" not in text  # not planned again
    assert "not planned again" in text and resumed.tcfg.batch_size == 8
    assert limits == [(BUDGET, plan.choice["policy"])] * 2 and resumed.step == 5
    after, again = _plan_of(out)
    assert after["memory_plan"] == meta["memory_plan"] and again == plan
    assert after["memory_budget"] == str(BUDGET) and after["step"] == "5"
    # the same budget again is the run's own: fine
    train_gpt.main(_tiny(data, out, "--resume", "--steps", "6", "--memory-budget", "1024KiB"))
    capsys.readouterr()
    err = _exit_2(capsys, _tiny(data, out, "--resume", "--steps", "7", "--memory-budget",
                                "2MiB"))
    assert "was planned for 1.00 MiB" in err and len(err.strip().splitlines()) == 1


def test_resume_of_an_unplanned_run_with_a_budget_is_refused(data, tmp_path, capsys):
    out = tmp_path / "plain"
    train_gpt.main(_tiny(data, out, "--batch-size", "4", "--steps", "2"))
    meta = nn.load_metadata(os.path.join(out, CHECKPOINT))
    assert "memory_plan" not in meta and "memory_budget" not in meta
    capsys.readouterr()
    err = _exit_2(capsys, _tiny(data, out, "--resume", "--steps", "3", "--memory-budget",
                                "1MiB"))
    assert "its run was not planned" in err


def test_without_batch_size_the_largest_batch_that_fits(data, tmp_path, capsys, limits):
    out = tmp_path / "run"
    trainer = train_gpt.main(_tiny(data, out, "--memory-budget", "1MiB"))
    text = capsys.readouterr().out
    _, plan = _plan_of(out)
    most = max(a["largest_batch"] for a in plan.alternatives)
    assert plan.fits and plan.batch == most > 1 and trainer.tcfg.batch_size == most
    assert f"batch size {most}: the largest that fits --memory-budget 1.00 MiB" in text
    assert not plan.replan(plan.budget, batch=most + 1).fits
    # at the very edge of the prediction, every step ran under the limit
    assert limits == [(BUDGET, plan.choice["policy"])] * 3
    assert all(rec["peak_bytes"] <= BUDGET for rec in trainer.history)


def test_a_budget_that_does_not_fit_exits_2_with_one_line(data, tmp_path, capsys):
    err = _exit_2(capsys, _tiny(data, tmp_path / "a", "--memory-budget", "1MiB",
                                "--batch-size", "64"))
    line = err.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith("train_gpt.py: error: --memory-budget 1.00 MiB does not fit "
                           "batch 64: the least predicted peak of its step is ")
    assert "or more, or --batch-size " in line
    need = int(line.split("give --memory-budget ")[1].split("(")[1].split(" bytes")[0])
    most = int(line.split("--batch-size ")[1].split(" or less")[0])
    assert need > BUDGET and 1 <= most < 64
    assert not (tmp_path / "a").exists() or not os.listdir(tmp_path / "a")
    # the batch it names fits, planned
    fits = train_gpt.main(_tiny(data, tmp_path / "b", "--memory-budget", "1MiB",
                                "--batch-size", str(most), "--steps", "1"))
    assert fits.tcfg.batch_size == most
    del fits
    gc.collect()
    capsys.readouterr()
    # less than the corpus itself (with what the process holds); not a size
    held = ta.memory.fmt_bytes(ta.memory.live_bytes() + 8 * len(TEXT))
    err = _exit_2(capsys, _tiny(data, tmp_path / "c", "--memory-budget", "64KiB"))
    assert f"(with what the process holds already) take {held}" in err
    err = _exit_2(capsys, _tiny(data, tmp_path / "d", "--memory-budget", "six gigs"))
    assert "--memory-budget" in err


def test_budget_with_flags_narrows_the_knobs_and_refuses_data_parallel(data, tmp_path,
                                                                       capsys, monkeypatch):
    out = tmp_path / "run"
    train_gpt.main(_tiny(data, out, "--memory-budget", "1MiB", "--batch-size", "4",
                         "--attn", "flash", "--checkpoint", "true", "--steps", "1"))
    _, plan = _plan_of(out)
    assert plan.knobs == {"attn": ["flash"], "policy": ["save", "recompute"],
                          "checkpoint": [[0]]}
    capsys.readouterr()
    # dropout: flash has none, so views alone
    train_gpt.main(_tiny(data, tmp_path / "drop", "--memory-budget", "1MiB", "--batch-size",
                         "4", "--dropout", "0.1", "--steps", "1"))
    assert _plan_of(tmp_path / "drop")[1].knobs["attn"] == ["views"]
    capsys.readouterr()
    # in a --config file, as a size string; its batch_size counts as given
    toml = tmp_path / "run.toml"
    toml.write_text('memory_budget = "1MiB"\nbatch_size = 3\n')
    train_gpt.main(_tiny(data, tmp_path / "cfg", "--config", str(toml), "--steps", "1"))
    meta, plan = _plan_of(tmp_path / "cfg")
    assert plan.batch == 3 and meta["memory_budget"] == str(BUDGET)
    capsys.readouterr()
    monkeypatch.setattr(train_gpt, "_world", lambda: (2, 0))
    err = _exit_2(capsys, _tiny(data, tmp_path / "dp", "--memory-budget", "1MiB"))
    assert "not planned per rank" in err
