"""The trainer, data-parallel on two MPI ranks (mpiexec -n 2): against one process with the
same global batch (parameters and loss history), resuming on the same and on another number
of ranks, stopping every rank at the same step on a signal to one, and the CLI.

Each test launches one program (a few seconds); the one-process references run in the
program before its process group exists, or in the test process itself. The model has no
biases: a bias whose gradient is zero up to rounding (the key bias of attention, say) is
where AdamW's g / sqrt(v) turns the last bit of a float32 sum into a step of lr, so with
biases the two runs part by about 1e-5 there, and agree to 1e-7 everywhere else.
Skips without mpi4py or mpiexec.
"""

import json
import os
import subprocess
import sys

import pytest
from mpi_util import MPIEXEC, ROOT, requires_mpi, run_ranks

TEXT = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n" for i in range(400))
TOL = 1e-6  # float32: the ranks' sums of gradients are ordered differently

PRELUDE = r'''
import json, os, signal, sys
import nn
import nn.trainer as trainer_module
import tinygrad_attn as ta
from nn.trainer import Interrupted, TrainConfig, Trainer

TEXT = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i % 5}\n" for i in range(400))


def gpt(dropout=0.0):
    return nn.GPTConfig(vocab_size=1, block_size=16, n_layer=1, n_head=2, n_embd=16,
                        bias=False, dropout=dropout)


def cfg(out, steps=5, **kw):
    base = dict(steps=steps, batch_size=4, eval_every=0, warmup=2, lr=1e-2, min_lr=1e-3,
                progress=False, out=out)
    return TrainConfig(**{**base, **kw})


def params(trainer):
    return {k: v.detach().cpu().reshape(-1).tolist()
            for k, v in trainer.model.state_dict().items()}


def worst(a, b):
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))


def quiet(*args):
    pass


def record_batches(trainer):
    """trainer.seen: the x of every forward_backward, as lists."""
    trainer.seen = []
    forward_backward = trainer.forward_backward
    def recorded(x, y, stats=None):
        trainer.seen.append(x.tolist())
        return forward_backward(x, y, stats)
    trainer.forward_backward = recorded


def join_group():
    import tinygrad_attn.distributed as dist

    dist.init_process_group("mpi")
    return dist.get_rank()
'''

VS_ONE_PROCESS = PRELUDE + r'''
out = sys.argv[1]
alone = Trainer(gpt(), cfg(None), TEXT, log=quiet)  # no process group yet: one process
record_batches(alone)
alone_history = [r["loss"] for r in alone.run(memory_report=False)]
rank = join_group()

written = []  # the files this rank's checkpoints went to
real_save = trainer_module.save
def counting_save(tensors, path, metadata=None):
    written.append(path)
    return real_save(tensors, path, metadata=metadata)
trainer_module.save = counting_save

lines = []
trainer = Trainer(gpt(), cfg(os.path.join(out, "run"), eval_every=5, eval_iters=1), TEXT,
                  log=lines.append)
record_batches(trainer)
history = trainer.run(memory_report=True)

# SIGTERM to rank 1 alone, during step 2: both ranks stop after step 2, and save it
stopper = Trainer(gpt(), cfg(os.path.join(out, "stop"), steps=50), TEXT, log=quiet)
step_of = stopper.train_step
def step_with_signal():
    if rank == 1 and stopper.step == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return step_of()
stopper.train_step = step_with_signal
try:
    stopper.run(memory_report=False)
    stopped = None
except Interrupted as e:
    stopped = {"signum": e.signum, "step": e.step, "path": e.path}

# a save rank 0 cannot write (its directory is a file): every rank raises CheckpointError
blocker = os.path.join(out, "a_file")
if rank == 0:
    open(blocker, "w").close()
try:
    trainer.save_checkpoint(os.path.join(blocker, "ckpt.safetensors"))
    failed_save = None
except trainer_module.CheckpointError as e:
    failed_save = str(e)

report({"world": trainer.world_size, "rank": trainer.rank, "failed_save": failed_save,
        "worst": worst(params(alone), params(trainer)),
        "alone": alone_history, "history": [r["loss"] for r in history],
        "alone_batches": alone.seen, "batches": trainer.seen,
        "lines": lines, "written": written, "stopped": stopped,
        "stop_saved_step": nn.load_metadata(stopped["path"])["step"] if stopped else None})
'''

RESUME = PRELUDE + r'''
out = sys.argv[1]
rank = join_group()
result = {}
for dropout in (0.0, 0.1):
    d = os.path.join(out, f"dropout{dropout}")
    straight = Trainer(gpt(dropout), cfg(os.path.join(d, "straight")), TEXT, log=quiet)
    straight.run(memory_report=False)
    first = Trainer(gpt(dropout), cfg(os.path.join(d, "first")), TEXT, log=quiet)
    first.run(until=3, memory_report=False)  # saves step 3 in d/first
    del first
    ta.manual_seed(999)  # whatever happened in between must not matter
    path = os.path.join(d, "first", trainer_module.CHECKPOINT)
    resumed = Trainer.from_checkpoint(path, TEXT, log=quiet, out=os.path.join(d, "resumed"))
    step = resumed.step
    resumed.run(memory_report=False)
    meta = nn.load_metadata(path)
    result[str(dropout)] = {
        "resumed_at": step, "worst": worst(params(straight), params(resumed)),
        "rng": json.loads(meta["rng"]), "rng_by_rank": json.loads(meta["rng_by_rank"]),
        "world_size": meta["world_size"]}
report(result)
'''


def _state(path):
    import nn

    return {k: v.detach().reshape(-1).tolist() for k, v in nn.load(path).items()
            if k.startswith("model.")}


@requires_mpi
def test_two_ranks_equal_one_process_with_the_global_batch(tmp_path):
    ranks = run_ranks(VS_ONE_PROCESS, n=2, args=(tmp_path,), timeout=180)
    zero, one = ranks.results
    assert (zero["world"], zero["rank"], one["world"], one["rank"]) == (2, 0, 2, 1)
    # the global batch is one process's; rank r trains on rows [2r, 2r + 2) of it
    assert zero["alone_batches"] == one["alone_batches"]
    for step, batch in enumerate(zero["alone_batches"]):
        assert len(batch) == 4
        assert zero["batches"][step] == batch[:2] and one["batches"][step] == batch[2:]
    for r in (zero, one):
        assert r["worst"] <= TOL, r["worst"]
        assert len(r["history"]) == 5
        assert r["history"] == pytest.approx(r["alone"], abs=TOL)
    assert zero["history"] == one["history"]  # the logged loss is the mean over ranks
    # rank 0 alone logs and writes
    assert zero["lines"][0].startswith("memory of the first step: peak")
    assert sum(s.startswith("step     5 | loss") for s in zero["lines"]) == 1
    ckpt = str(tmp_path / "run" / "ckpt.safetensors")
    assert zero["lines"][-1] == f"checkpoint: step 5 saved to {ckpt}"
    assert one["lines"] == []
    assert zero["written"] == [ckpt, str(tmp_path / "stop" / "ckpt.safetensors")]
    assert one["written"] == []
    # a failed save stops both ranks, with rank 0's message
    assert zero["failed_save"].startswith("cannot save the checkpoint of step 5 to ")
    assert one["failed_save"] == zero["failed_save"]
    # a SIGTERM to rank 1 alone stops both after the same step, saved
    import signal

    for r in (zero, one):
        assert r["stopped"] == {"signum": signal.SIGTERM, "step": 2,
                                "path": str(tmp_path / "stop" / "ckpt.safetensors")}
        assert r["stop_saved_step"] == "2"


@requires_mpi
def test_resume_on_two_ranks_and_on_one(tmp_path):
    ranks = run_ranks(RESUME, n=2, args=(tmp_path,), timeout=240)
    zero, one = ranks.results
    for r in (zero, one):
        for dropout in ("0.0", "0.1"):
            assert r[dropout]["resumed_at"] == 3
            # same number of ranks: the run continues bit for bit, dropout included
            assert r[dropout]["worst"] == 0.0, (dropout, r[dropout]["worst"])
    for dropout in ("0.0", "0.1"):
        meta = zero[dropout]
        assert meta["world_size"] == "2"
        by_rank = meta["rng_by_rank"]
        assert len(by_rank) == 2 and by_rank[0] == meta["rng"]
        assert by_rank[0] != by_rank[1]  # each rank its own dropout stream

    # the two-rank checkpoint of step 3 (dropout 0), resumed here on one process to step 5,
    # meets the uninterrupted two-rank run
    from nn.trainer import Trainer

    d = tmp_path / "dropout0.0"
    resumed = Trainer.from_checkpoint(str(d / "first" / "ckpt.safetensors"), TEXT,
                                      log=lambda *_: None, out=str(tmp_path / "alone"))
    assert (resumed.world_size, resumed.step) == (1, 3)
    resumed.run(memory_report=False)
    straight = _state(d / "straight" / "ckpt.safetensors")
    mine = _state(tmp_path / "alone" / "ckpt.safetensors")
    assert straight.keys() == mine.keys()
    worst = max(abs(x - y) for k in straight for x, y in zip(straight[k], mine[k]))
    assert worst <= TOL, worst
    # and a checkpoint written by one process holds no per-rank state
    import nn

    meta = nn.load_metadata(str(tmp_path / "alone" / "ckpt.safetensors"))
    assert "rng_by_rank" not in meta and "world_size" not in meta


def _cli(args, timeout=180):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDI_", "HYDRA_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [MPIEXEC, "-n", "2", sys.executable, str(ROOT / "examples" / "train_gpt.py"),
               *map(str, args)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@requires_mpi
def test_cli_trains_data_parallel(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    tiny = ["--data", data, "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
            "--block-size", "16", "--eval-every", "3", "--eval-iters", "1",
            "--sample-tokens", "10", "--no-progress"]
    out = tmp_path / "run"
    run = _cli([*tiny, "--batch-size", "4", "--steps", "3", "--out", out])
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "data-parallel on 2 ranks (2 samples per rank, global batch 4)"
    assert run.stdout.count("data-parallel on") == 1
    assert run.stdout.count("checkpoint: step 3 saved to") == 1
    assert run.stdout.count("sample:") == 1
    assert sorted(os.listdir(out)) == ["ckpt.safetensors"]  # the lock is gone
    import nn

    meta = nn.load_metadata(str(out / "ckpt.safetensors"))
    assert meta["step"] == "3" and meta["world_size"] == "2"
    assert json.loads(meta["train_config"])["batch_size"] == 4

    # a global batch the ranks cannot share: one line, status 2, nothing left behind
    bad = tmp_path / "bad"
    run = _cli([*tiny, "--batch-size", "3", "--steps", "3", "--out", bad])
    assert run.returncode == 2, run.stdout + run.stderr
    errors = [s for s in run.stderr.splitlines() if s.startswith("train_gpt.py: error:")]
    assert errors == ["train_gpt.py: error: batch_size 3 is the global batch and must be "
                      "divisible by the world size 2 (each rank trains on batch_size / "
                      "world_size rows): use a multiple of 2, or another number of ranks"]
    assert not bad.exists()
