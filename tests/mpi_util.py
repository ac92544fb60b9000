"""Run a Python program on several MPI ranks (mpiexec) and collect what each rank reports.

The tests that need more than one process write the program as a string; run_ranks launches
it with `mpiexec -n N`, each rank calls `report(obj)` with a JSON-serialisable result, and the
test reads them back as `ranks.results[r]`. run_alone runs the same kind of program as one
process without mpiexec (MPI starts it as a singleton), so the pytest process itself never
initialises MPI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _find_mpiexec() -> str | None:
    beside = pathlib.Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


MPIEXEC: str | None = _find_mpiexec()
HAS_MPI4PY = importlib.util.find_spec("mpi4py") is not None
# CI greps for this reason: in its run with the distributed extra, nothing may skip for it
SKIP_REASON = "needs mpi4py and mpiexec (pip install '.[distributed]')"
requires_mpi = pytest.mark.skipif(not (HAS_MPI4PY and MPIEXEC), reason=SKIP_REASON)

_PRELUDE = '''\
import json as _json, os as _os
_RANK = int(_os.environ.get("PMI_RANK", _os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


def report(obj):
    """Write this rank's result (JSON) where the test reads it."""
    path = _os.path.join(_os.environ["TA_MPI_RESULTS"], f"rank{_RANK}.json")
    with open(path + ".part", "w") as f:
        _json.dump(obj, f)
    _os.replace(path + ".part", path)


'''


@dataclass
class Ranks:
    results: list  # indexed by rank; None where a rank reported nothing
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def __str__(self) -> str:
        return (f"rc={self.returncode} in {self.seconds:.1f} s\n--- stdout\n{self.stdout}\n"
                f"--- stderr\n{self.stderr}")


def _run(command_head: list, source: str, n: int, timeout: float, env: dict | None,
         args: tuple, check: bool) -> Ranks:
    with tempfile.TemporaryDirectory(prefix="ta_mpi_") as tmp:
        program = pathlib.Path(tmp) / "program.py"
        program.write_text(_PRELUDE + source)
        results_dir = pathlib.Path(tmp) / "results"
        results_dir.mkdir()
        full_env = dict(os.environ)
        full_env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        for name in list(full_env):  # a launcher's settings from outside would leak in
            if name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID") or (
                    name.startswith(("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCAL"))):
                del full_env[name]
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else []))
        full_env["TA_MPI_RESULTS"] = str(results_dir)
        full_env.update(env or {})
        command = command_head + [sys.executable, str(program), *map(str, args)]
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and every rank: their own session
            stdout, stderr = proc.communicate()
            raise AssertionError(f"{' '.join(command)} hung: killed after {timeout} s\n"
                                 f"--- stdout\n{stdout}\n--- stderr\n{stderr}") from None
        seconds = time.perf_counter() - start
        results = []
        for r in range(n):
            path = results_dir / f"rank{r}.json"
            results.append(json.loads(path.read_text()) if path.exists() else None)
    ranks = Ranks(results, proc.returncode, stdout, stderr, seconds)
    if check:
        assert ranks.returncode == 0 and all(r is not None for r in results), str(ranks)
    return ranks


def run_ranks(source: str, n: int = 2, timeout: float = 120, env: dict | None = None,
              args: tuple = (), check: bool = True) -> Ranks:
    """Write `source` (a Python program) to a temp file and run `mpiexec -n n python file
    *args` with cwd = the repo root and the repo root on PYTHONPATH. The program's prelude
    defines `report(obj)` (JSON-serialisable) which writes rank<r>.json into a temp dir.
    Returns Ranks with .results (list indexed by rank; None where a rank reported nothing),
    .returncode, .stdout, .stderr, .seconds. check=True: AssertionError (with rc, stdout,
    stderr) unless rc == 0 and every rank reported. A timeout kills the whole process group
    and raises AssertionError saying it hung."""
    assert MPIEXEC is not None, "no mpiexec: mark the test with requires_mpi"
    return _run([MPIEXEC, "-n", str(n)], source, n, timeout, env, args, check)


def run_alone(source: str, timeout: float = 60, env: dict | None = None, args: tuple = (),
              check: bool = True) -> Ranks:
    """run_ranks for one process started without mpiexec (MPI's singleton: world size 1)."""
    return _run([], source, 1, timeout, env, args, check)
