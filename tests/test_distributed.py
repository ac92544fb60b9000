"""ta.distributed on MPI: one process (MPI's singleton, in a subprocess so pytest never starts
MPI), two ranks under mpiexec, and ranks that die, hang or raise.

Each test is one launch: a program that runs many checks and reports them as JSON, so the
suite pays the start-up cost (about two seconds of imports) a handful of times."""

from __future__ import annotations

import math
import re
import sys

import pytest
from mpi_util import requires_mpi, run_alone, run_ranks

import tinygrad_attn as ta

pytestmark = requires_mpi

# a program's helper: the type and text of what a call raises (None if it returns)
_RAISES = '''
def raises(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa
        return [type(e).__name__, str(e)]
    return None
'''

SINGLETON = _RAISES + '''
import datetime, os, sys
import tinygrad_attn as ta
import tinygrad_attn.distributed as dist

out = {"mpi_loaded_by_import": "mpi4py.MPI" in sys.modules}
out["before"] = {name: raises(getattr(dist, name)) for name in
                 ("get_rank", "get_world_size", "get_backend", "barrier",
                  "destroy_process_group")}
out["before"]["all_reduce"] = raises(dist.all_reduce, ta.ones(2))
out["before_init"] = dist.is_initialized()
out["bad_backend"] = raises(dist.init_process_group, "foo")
out["nccl"] = raises(dist.init_process_group, "nccl")
out["int_timeout"] = raises(dist.init_process_group, timeout=5)
os.environ["WORLD_SIZE"] = "2"
out["env_disagrees"] = raises(dist.init_process_group)
del os.environ["WORLD_SIZE"]
out["rank_arg_disagrees"] = raises(dist.init_process_group, rank=1, world_size=1)
out["still_uninitialized"] = dist.is_initialized()

out["device_backends"] = raises(dist.init_process_group, "cpu:nccl,cuda:nccl")
dist.init_process_group("cpu:gloo,cuda:nccl", timeout=datetime.timedelta(seconds=60))
out["twice"] = raises(dist.init_process_group)
out["query"] = [dist.is_initialized(), dist.get_rank(), dist.get_world_size(),
                dist.get_backend(), dist.get_local_rank(), dist.get_node_local_rank(),
                dist.get_process_group_ranks(dist.group.WORLD), dist.group.WORLD is not None]
t = ta.tensor([1.5, -2.0, 3.0])
dist.all_reduce(t)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
dist.broadcast(t, src=0)
gathered = [ta.zeros(3)]
dist.all_gather(gathered, t)
into = ta.zeros(3)
dist.all_gather_into_tensor(into, t)
scattered = ta.zeros(3)
dist.reduce_scatter_tensor(scattered, t, op=dist.ReduceOp.MAX)
dist.barrier()
out["identity"] = [t.tolist(), gathered[0].tolist(), into.tolist(), scattered.tolist()]
work = dist.all_reduce(t, async_op=True)
out["work"] = [work.wait(), work.is_completed(), work.is_success(), work.exception() is None,
               work.t_issued <= work.t_started <= work.t_finished, work.nbytes,
               dist.all_reduce(t) is None]
out["errors"] = {
    "non_contiguous": raises(dist.all_reduce, ta.zeros(2, 3).t()),
    "float16": raises(dist.all_reduce, ta.zeros(2, dtype=ta.float16)),
    "avg_int": raises(dist.all_reduce, ta.zeros(2, dtype=ta.int64), op=dist.ReduceOp.AVG),
    "band_float": raises(dist.all_reduce, ta.zeros(2), op=dist.ReduceOp.BAND),
    "not_a_tensor": raises(dist.all_reduce, [1.0, 2.0]),
    "op_not_reduceop": raises(dist.all_reduce, ta.zeros(2), op="sum"),
    "gather_dtype": raises(dist.all_gather, [ta.zeros(3, dtype=ta.float64)], t),
    "gather_shape": raises(dist.all_gather, [ta.zeros(4)], t),
    "gather_length": raises(dist.all_gather, [ta.zeros(3), ta.zeros(3)], t),
    "into_size": raises(dist.all_gather_into_tensor, ta.zeros(4), t),
    "bad_src": raises(dist.broadcast, t, 1),
    "no_src": raises(dist.broadcast, t),
    "other_group": raises(dist.get_rank, group=5),
    "not_built": raises(dist.all_to_all, [t], [t]),
    "object": raises(dist.broadcast_object_list, [1]),
}
leaf = ta.ones(3, requires_grad=True)
dist.all_reduce(leaf)  # torch allows it on a leaf that requires grad: the write is the user's
out["leaf"] = [leaf.tolist(), leaf._version]
dist.destroy_process_group()
out["after_destroy"] = [dist.is_initialized(), raises(dist.get_rank)]
dist.init_process_group()  # MPI stays initialised: a new group can start
out["again"] = [dist.get_backend(), dist.get_world_size()]
dist.destroy_process_group()
report(out)
'''


@pytest.fixture(scope="module")
def alone():
    return run_alone(SINGLETON).results[0]


def test_importing_the_engine_does_not_start_mpi(alone):
    assert alone["mpi_loaded_by_import"] is False
    assert "mpi4py.MPI" not in sys.modules  # nor did this pytest process
    assert ta.distributed.is_available() is True and ta.distributed.is_mpi_available()
    assert not ta.distributed.is_nccl_available() and not ta.distributed.is_gloo_available()
    assert ta.distributed.is_initialized() is False


def test_calls_before_init_raise_torchs_errors(alone):
    text = ("Default process group has not been initialized, please make sure to call "
            "init_process_group.")
    for name in ("get_rank", "get_world_size", "get_backend", "barrier", "all_reduce"):
        assert alone["before"][name] == ["ValueError", text], name
    assert alone["before"]["destroy_process_group"] == ["AssertionError",
                                                        "Process group cannot be None"]
    assert alone["before_init"] is False and alone["still_uninitialized"] is False


def test_init_refuses_bad_backends_timeouts_and_a_launch_mpi_disagrees_with(alone):
    assert alone["bad_backend"] == ["AssertionError", "Unknown backend type foo"]
    assert alone["device_backends"][0] == "ValueError"  # the CPU entry must be mpi or gloo
    kind, text = alone["nccl"]
    assert kind == "RuntimeError" and "NCCL backend is not built" in text and "'mpi'" in text
    assert alone["int_timeout"] == ["TypeError", "Expected timeout argument to be of type "
                                                 "datetime.timedelta, got 5"]
    kind, text = alone["env_disagrees"]
    assert kind == "RuntimeError"
    assert "WORLD_SIZE=2 (environment)" in text and "world of size 1" in text
    assert "without mpiexec" in text and "mpiexec -n N" in text
    kind, text = alone["rank_arg_disagrees"]
    assert kind == "RuntimeError" and "rank=1 (argument)" in text and "world_size" not in \
        text.split("but")[0]
    assert alone["twice"] == ["ValueError", "trying to initialize the default process group "
                                            "twice!"]


def test_a_world_of_one_is_rank_0_and_every_collective_is_the_identity(alone):
    assert alone["query"] == [True, 0, 1, "gloo", 0, 0, [0], True]
    v = [1.5, -2.0, 3.0]
    assert alone["identity"] == [v, v, v, v]
    assert alone["work"] == [True, True, True, True, True, 12, True]
    assert alone["leaf"] == [[1.0, 1.0, 1.0], 1]
    assert alone["after_destroy"][0] is False
    assert alone["after_destroy"][1][0] == "ValueError"
    assert alone["again"] == ["mpi", 1]


def test_refused_tensors_and_arguments_say_why(alone):
    e = alone["errors"]
    assert e["non_contiguous"][0] == "RuntimeError"
    assert "Tensors must be contiguous" in e["non_contiguous"][1]
    assert "strides (1, 3)" in e["non_contiguous"][1]
    assert e["float16"][0] == "TypeError" and "all_reduce" in e["float16"][1]
    assert "float16" in e["float16"][1]
    assert e["avg_int"][0] == "RuntimeError" and "ReduceOp.AVG" in e["avg_int"][1]
    assert e["band_float"] == ["RuntimeError", "all_reduce: Cannot use ReduceOp.BAND with "
                                               "non-integral dtype (float32)"]
    assert e["not_a_tensor"][0] == "TypeError" and e["op_not_reduceop"][0] == "TypeError"
    assert e["gather_dtype"][0] == "ValueError" and "float64" in e["gather_dtype"][1]
    assert e["gather_shape"][0] == "RuntimeError"
    assert "expected (3,), got (4,)" in e["gather_shape"][1]
    assert e["gather_length"][0] == "RuntimeError" and "got 2" in e["gather_length"][1]
    assert e["into_size"][0] == "RuntimeError"
    assert e["bad_src"][0] == "RuntimeError" and "invalid root rank: 1" in e["bad_src"][1]
    assert e["no_src"] == ["ValueError", "Must specify global_rank or group_rank"]
    assert e["other_group"][0] == "ValueError" and "not registered" in e["other_group"][1]
    assert e["not_built"][0] == "RuntimeError"
    assert "not implemented in tinygrad_attn" in e["not_built"][1]
    assert "pickle" in e["object"][1]


def test_error_types_match_torchs_gloo(alone, tmp_path):
    torch = pytest.importorskip("torch")
    dist = torch.distributed

    def kind(fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            return type(e).__name__
        return None

    before = kind(dist.get_rank)
    destroy = kind(dist.destroy_process_group)
    bad = kind(dist.init_process_group, "foo", init_method=f"file://{tmp_path}/s0", rank=0,
               world_size=1)
    timeout = kind(dist.init_process_group, "gloo", init_method=f"file://{tmp_path}/s1",
                   rank=0, world_size=1, timeout=5)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/s2", rank=0, world_size=1)
    try:
        t = torch.ones(3)
        got = {
            "twice": kind(dist.init_process_group, "gloo",
                          init_method=f"file://{tmp_path}/s3", rank=0, world_size=1),
            "avg_int": kind(dist.all_reduce, torch.zeros(2, dtype=torch.int64),
                            op=dist.ReduceOp.AVG),
            "band_float": kind(dist.all_reduce, torch.zeros(2), op=dist.ReduceOp.BAND),
            "not_a_tensor": kind(dist.all_reduce, [1.0, 2.0]),
            "op_not_reduceop": kind(dist.all_reduce, torch.zeros(2), op="sum"),
            "gather_dtype": kind(dist.all_gather, [torch.zeros(3, dtype=torch.float64)], t),
            "gather_shape": kind(dist.all_gather, [torch.zeros(4)], t),
            "gather_length": kind(dist.all_gather, [torch.zeros(3), torch.zeros(3)], t),
            "into_size": kind(dist.all_gather_into_tensor, torch.zeros(4), t),
            "bad_src": kind(dist.broadcast, t, 1),
            "no_src": kind(dist.broadcast, t),
            "other_group": kind(dist.get_rank, group=5),
        }
        leaf = torch.ones(3, requires_grad=True)
        leaf_ok = kind(dist.all_reduce, leaf) is None
    finally:
        dist.destroy_process_group()
    assert alone["before"]["get_rank"][0] == before
    assert alone["before"]["destroy_process_group"][0] == destroy
    assert alone["bad_backend"][0] == bad and alone["int_timeout"][0] == timeout
    assert alone["twice"][0] == got.pop("twice")
    assert {k: alone["errors"][k][0] for k in got} == got
    assert leaf_ok  # and ours wrote into the leaf too (test above)


# ----------------------------------------------------------------------------- two ranks
TWO_RANKS = _RAISES + '''
import time
import tinygrad_attn as ta
import tinygrad_attn.distributed as dist

dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
R = dist.ReduceOp
out = {"rank": rank, "size": size, "local": dist.get_local_rank(), "backend": dist.get_backend()}

def values(dtype):
    if dtype == "float32":
        return [1.5 * (rank + 1), -2.0 - rank, 0.25 + 3 * rank]
    if dtype == "float64":
        return [1.0 / 3 + rank, -(10.0 ** (rank + 1)), 2.0 ** -20 * (rank + 1)]
    return [2 ** 31 + rank, -3 - rank, 7 * rank]

reduced = {}
for dtype in ("float32", "float64", "int64"):
    for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
        t = ta.tensor(values(dtype), dtype=getattr(ta, dtype))
        failure = raises(dist.all_reduce, t, op=getattr(R, op))
        reduced[f"{dtype} {op}"] = failure[0] if failure else t.tolist()
for op in ("BAND", "BOR", "BXOR"):
    t = ta.tensor([12 + rank, 5, rank], dtype=ta.int64)
    dist.all_reduce(t, op=getattr(R, op))
    reduced[f"int64 {op}"] = t.tolist()
flags = ta.tensor([rank == 0, True, False])
dist.all_reduce(flags)
reduced["bool SUM"] = flags.tolist()
out["reduced"] = reduced

b = ta.tensor([float(rank)] * 3) + 10
dist.broadcast(b, src=1)
out["broadcast"] = b.tolist()
x = ta.tensor([[rank, rank + 0.5]])
parts = [ta.zeros(1, 2), ta.zeros(1, 2)]
dist.all_gather(parts, x)
into = ta.zeros(2, 2)
dist.all_gather_into_tensor(into, x)
inplace = ta.zeros(4)  # the in-place form: this rank's block of the output is the input
inplace[2 * rank:2 * rank + 2] = ta.tensor([rank + 1.0, -rank])
dist.all_gather_into_tensor(inplace, inplace[2 * rank:2 * rank + 2])
out["gather"] = [[p.tolist() for p in parts], into.tolist(), inplace.tolist()]
inputs = [ta.tensor([1.0 + rank, 2.0]), ta.tensor([10.0 * (rank + 1), -1.0])]
scat = ta.zeros(2)
dist.reduce_scatter(scat, inputs)
whole = ta.tensor([1.0 + rank, 2.0, 10.0 * (rank + 1), -1.0])
scat_t = ta.zeros(2)
dist.reduce_scatter_tensor(scat_t, whole, op=R.MAX)
red = ta.tensor([rank + 1.0, 2.0])
dist.reduce(red, dst=1)
out["scatter"] = [scat.tolist(), scat_t.tolist(), red.tolist()]
dist.barrier()

# zero copy: the tensor's own memory, written in place; no Storage made; version bumped
z = ta.ones(1000) * (rank + 1)
ptr, version, live = z.data_ptr(), z._version, ta.memory.live_bytes()
dist.all_reduce(z)
dist.broadcast(z, src=0)
g = ta.zeros(2000)
live = ta.memory.live_bytes()
dist.all_gather_into_tensor(g, z)
out["zero_copy"] = [z.data_ptr() == ptr, z._version - version, ta.memory.live_bytes() - live,
                    z[0].item(), g[0].item()]
a = ta.ones(3, requires_grad=True)
h = a * 2
y = h * h  # saves h for backward
dist.all_reduce(h)
out["saved_changed"] = raises(y.sum().backward)

# overlap: rank 1 joins late; rank 0's main thread computes while its worker waits in MPI
big = ta.ones(1 << 20)
if rank == 1:
    time.sleep(0.5)
work = dist.all_reduce(big, async_op=True)
count, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < 0.2:
    count += 1
t_computed = time.perf_counter()
out["overlap"] = [work.wait(), work.t_issued, work.t_started, t_computed, work.t_finished,
                  work.nbytes, big[0].item(), count]

# destroy waits for what is queued; an async op never waited on finishes before exit
last = dist.all_reduce(ta.ones(4), async_op=True)
dist.destroy_process_group()
out["drained"] = last.is_completed()
dist.init_process_group()
report(out)
dist.all_reduce(ta.ones(1 << 16), async_op=True)  # pending at exit: drained, then finalized
'''


def _reduce(op, a, b):
    return {"SUM": lambda: a + b, "AVG": lambda: (a + b) / 2, "PRODUCT": lambda: a * b,
            "MIN": lambda: min(a, b), "MAX": lambda: max(a, b), "BAND": lambda: a & b,
            "BOR": lambda: a | b, "BXOR": lambda: a ^ b}[op]()


def _f32(v):
    import struct
    return struct.unpack("f", struct.pack("f", v))[0]


@pytest.fixture(scope="module")
def two():
    return run_ranks(TWO_RANKS, n=2, timeout=120)


def test_two_ranks_reduce_exactly(two):
    r0, r1 = two.results
    assert [r0["rank"], r1["rank"], r0["size"], r0["local"], r1["local"]] == [0, 1, 2, 0, 1]
    assert r0["backend"] == "mpi"

    def values(dtype, rank):
        if dtype == "float32":
            return [_f32(v) for v in (1.5 * (rank + 1), -2.0 - rank, 0.25 + 3 * rank)]
        if dtype == "float64":
            return [1.0 / 3 + rank, -(10.0 ** (rank + 1)), 2.0 ** -20 * (rank + 1)]
        return [2 ** 31 + rank, -3 - rank, 7 * rank]

    for rank_result in (r0, r1):
        got = rank_result["reduced"]
        for dtype in ("float32", "float64", "int64"):
            for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
                if dtype == "int64" and op == "AVG":
                    assert got[f"{dtype} {op}"] == "RuntimeError"
                    continue
                want = [_reduce(op, a, b) for a, b in zip(values(dtype, 0), values(dtype, 1))]
                if dtype == "float32":
                    want = [_f32(w) for w in want]
                assert got[f"{dtype} {op}"] == want, (dtype, op)
        for op in ("BAND", "BOR", "BXOR"):
            want = [_reduce(op, a, b) for a, b in zip([12, 5, 0], [13, 5, 1])]
            assert got[f"int64 {op}"] == want, op
        assert got["bool SUM"] == [True, True, False]
    assert math.isclose(r0["reduced"]["float64 SUM"][0], 1.0 / 3 + 1.0 / 3 + 1)


def test_two_ranks_broadcast_gather_scatter(two):
    for r in two.results:
        assert r["broadcast"] == [11.0, 11.0, 11.0]
        parts, into, inplace = r["gather"]
        assert parts == [[[0.0, 0.5]], [[1.0, 1.5]]]
        assert into == [[0.0, 0.5], [1.0, 1.5]]
        assert inplace == [1.0, 0.0, 2.0, -1.0]
    r0, r1 = two.results
    # reduce_scatter: rank r gets the sum over ranks of input_list[r]
    assert r0["scatter"][0] == [1.0 + 2.0, 4.0] and r1["scatter"][0] == [30.0, -2.0]
    assert r0["scatter"][1] == [2.0, 2.0] and r1["scatter"][1] == [20.0, -1.0]
    assert r1["scatter"][2] == [3.0, 4.0]  # reduce: dst holds the sum
    assert r0["scatter"][2] == [1.0, 2.0]  # elsewhere the tensor is only read


def test_collectives_write_the_tensors_own_memory_and_bump_its_version(two):
    for r in two.results:
        same_ptr, bumps, new_bytes, z0, g0 = r["zero_copy"]
        assert same_ptr and new_bytes == 0 and z0 == 3.0 and g0 == 3.0
        # all_reduce writes on both ranks, broadcast only where it is not the source
        assert bumps == (1 if r["rank"] == 0 else 2)
        kind, text = r["saved_changed"]  # autograd saw the write into a saved tensor
        assert kind == "RuntimeError" and "modified" in text


def test_an_async_all_reduce_overlaps_compute(two):
    r0 = two.results[0]
    done, issued, started, computed, finished, nbytes, value, count = r0["overlap"]
    assert done is True and value == 2.0 and nbytes == 4 << 20 and count > 0
    # the worker was inside MPI (waiting for rank 1) while the main thread ran Python:
    # mpi4py released the GIL
    assert issued <= started < computed < finished
    assert finished - started > 0.25
    for r in two.results:
        assert r["drained"] is True
    assert two.returncode == 0


# ----------------------------------------------------------------------------- failures
KILLED = '''
import os, signal, time
import tinygrad_attn as ta
import tinygrad_attn.distributed as dist

dist.init_process_group()
t = ta.ones(8)
dist.all_reduce(t)
if dist.get_rank() == 1:
    report({"pid": os.getpid()})
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(t)  # rank 0 waits here for a rank that is gone
report({"finished": True})
'''


def test_a_killed_rank_ends_the_job_promptly_and_mpiexec_names_its_pid():
    ranks = run_ranks(KILLED, n=2, timeout=60, env={"TINYGRAD_ATTN_DIST_TIMEOUT": "5"},
                      check=False)
    text = ranks.stdout + ranks.stderr
    assert ranks.returncode != 0 and ranks.seconds < 30, str(ranks)
    assert ranks.results[0] is None  # rank 0 never finished its all_reduce
    pid = ranks.results[1]["pid"]
    # MPICH's launcher ends the other ranks at once and says which process died, and how
    assert "BAD TERMINATION" in text and f"PID {pid}" in text and "EXIT CODE: 9" in text, text


TIMED_OUT = _RAISES + '''
import time
import tinygrad_attn as ta
import tinygrad_attn.distributed as dist

dist.init_process_group()
if dist.get_rank() == 1:
    time.sleep(60)  # never calls the all_reduce: rank 0's wait times out
t = ta.ones(2, 3, dtype=ta.float64)
early = dist.all_reduce(t, async_op=True)
short = raises(early.wait, timeout=0.2)  # shorter than the group's: only reported
start = time.perf_counter()
failure = raises(early.wait)
report({"short": short, "short_completed": early.is_completed(), "failure": failure,
        "seconds": time.perf_counter() - start, "next": raises(dist.broadcast, t, 0),
        "destroy": raises(dist.destroy_process_group), "again": raises(dist.init_process_group),
        "initialized": dist.is_initialized()})
'''


def test_a_collective_a_rank_never_joins_times_out_and_the_job_is_aborted_at_exit():
    ranks = run_ranks(TIMED_OUT, n=2, timeout=60, env={"TINYGRAD_ATTN_DIST_TIMEOUT": "1.5"},
                      check=False)
    assert ranks.returncode != 0 and ranks.seconds < 30, str(ranks)  # no hang in Finalize
    r0 = ranks.results[0]
    kind, text = r0["short"]
    assert kind == "RuntimeError" and "within 0.2 s" in text and "may be called again" in text
    assert r0["short_completed"] is False
    kind, text = r0["failure"]
    assert kind == "RuntimeError" and 1.5 <= r0["seconds"] < 10
    assert re.search(r"all_reduce \(tensor of shape \(2, 3\), float64\) did not finish "
                     r"within 1.5 s on rank 0 of 2", text), text
    assert "another rank may have died or not called all_reduce" in text
    kind, text = r0["next"]
    assert kind == "RuntimeError" and "process group is broken" in text
    kind, text = r0["destroy"]  # destroy cannot drain a stuck queue: it says so and forgets
    assert kind == "RuntimeError" and "aborted when this process exits" in text
    assert r0["initialized"] is False
    kind, text = r0["again"]  # the stuck collective still holds MPI: no new group
    assert kind == "RuntimeError" and "cannot use MPI again" in text
    assert "ta.distributed: rank 0: exiting with all_reduce" in ranks.stderr, str(ranks)
    assert "aborting the MPI job" in ranks.stderr, str(ranks)


RAISED = '''
import tinygrad_attn as ta
import tinygrad_attn.distributed as dist

dist.init_process_group()
if dist.get_rank() == 1:
    raise ValueError("rank 1's own bug")
dist.all_reduce(ta.ones(4))  # rank 0 would wait out the 60 s timeout without the abort
report({"finished": True})
'''


def test_an_uncaught_exception_on_one_rank_aborts_the_job():
    ranks = run_ranks(RAISED, n=2, timeout=60, env={"TINYGRAD_ATTN_DIST_TIMEOUT": "60"},
                      check=False)
    assert ranks.returncode != 0 and ranks.seconds < 30, str(ranks)
    assert "ValueError: rank 1's own bug" in ranks.stderr
    assert "uncaught ValueError on rank 1 of 2" in ranks.stderr, str(ranks)
    assert ranks.results[0] is None


def test_mpiexec_reports_the_size_it_launched_with():
    """The launch check's other side: under mpiexec, env WORLD_SIZE must match -n."""
    ranks = run_ranks(_RAISES + '''
import tinygrad_attn.distributed as dist
report(raises(dist.init_process_group))
''', n=2, env={"WORLD_SIZE": "3"}, timeout=60)
    for kind, text in ranks.results:
        assert kind == "RuntimeError" and "WORLD_SIZE=3" in text
        assert "by mpiexec with 2 processes" in text

