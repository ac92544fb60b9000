"""A training script written for torchrun, in PyTorch's idiom (torch.distributed, DDP,
gradient accumulation with require_backward_grad_sync as nanoGPT does it), run unchanged by
`mpiexec -n 2 python -m tinygrad_attn.compat SCRIPT`: the compat runner gives each rank
torchrun's RANK / WORLD_SIZE / LOCAL_RANK from the MPI launcher's variables, the script's
init_process_group("gloo") runs on MPI, and its parameters end equal to the same script
run as one process."""

import json
import os
import subprocess
import sys

import pytest
from mpi_util import MPIEXEC, ROOT, requires_mpi

from tinygrad_attn.compat import torchrun_env_from_mpi

SCRIPT = r'''
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    assert local_rank == rank  # one machine
else:
    rank, world = 0, 1
master = rank == 0

torch.manual_seed(1337)
model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)).double()
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model
optimizer = torch.optim.AdamW(raw_model.parameters(), lr=1e-2)

g = torch.Generator().manual_seed(0)
X = torch.randn(64, 8, generator=g, dtype=torch.float64)
Y = torch.randn(64, 8, generator=g, dtype=torch.float64)
accum, micro = 2, 16 // world           # a global batch of 32 = 2 micro-steps x 16
for step in range(4):
    for m in range(accum):
        start = (step * accum + m) * 16 % 64 + rank * micro
        xb, yb = X[start:start + micro], Y[start:start + micro]
        if ddp:
            model.require_backward_grad_sync = m == accum - 1
        loss = F.mse_loss(model(xb), yb) / accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
if master:
    with open(sys.argv[1], "w") as f:
        json.dump({"world": world, "ddp": type(model).__name__,
                   "params": [p.detach().flatten().tolist() for p in raw_model.parameters()]}, f)
if ddp:
    destroy_process_group()
'''


def _run(tmp_path, launcher: list, name: str) -> list:
    script = tmp_path / "train_ddp_script.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{name}.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("PMI_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(launcher + [sys.executable, "-m", "tinygrad_attn.compat",
                                      str(script), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


@requires_mpi
def test_torchrun_style_script_runs_under_mpiexec_and_equals_one_process(tmp_path):
    two = _run(tmp_path, [MPIEXEC, "-n", "2"], "two")
    one = _run(tmp_path, [], "one")
    assert (two["world"], two["ddp"]) == (2, "DistributedDataParallel")
    assert (one["world"], one["ddp"]) == (1, "Sequential")
    assert len(two["params"]) == len(one["params"]) == 4
    worst = max(abs(a - b) for p, q in zip(two["params"], one["params"]) for a, b in zip(p, q))
    assert worst < 1e-12


def test_torchrun_variables_come_from_the_mpi_launchers():
    mpich = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert torchrun_env_from_mpi(mpich) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                            "LOCAL_WORLD_SIZE": "2"}
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}
    assert torchrun_env_from_mpi(ompi) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3",
                                           "LOCAL_WORLD_SIZE": "4"}
    # torchrun's own win; no launcher, nothing
    assert torchrun_env_from_mpi({**mpich, "RANK": "0", "WORLD_SIZE": "2"}) == {}
    assert torchrun_env_from_mpi({"HOME": "/root"}) == {}


@pytest.mark.parametrize("missing", ["PMI_RANK", "PMI_SIZE"])
def test_half_a_launcher_environment_sets_nothing(missing):
    env = {"PMI_RANK": "0", "PMI_SIZE": "2"}
    del env[missing]
    assert torchrun_env_from_mpi(env) == {}
