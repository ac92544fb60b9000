"""Data-parallel training step on 1 and 2 MPI ranks: step time, bytes all-reduced, the
share of all-reduce time hidden behind backward, and gradient memory with and without
gradient_as_bucket_view; then a projection (stated as one) of the all-reduce time at 8
and 64 ranks from the measured bytes and an assumed network.

    python benchmarks/data_parallel.py [--config small] [--steps 8] [--bucket-mb 25]

The script launches itself under `mpiexec -n 1` and `mpiexec -n 2` (a worker per rank;
rank 0 writes its measurements as JSON) and prints one table. The global batch is the
same for every row (each of 2 ranks takes half), so the rows do the same arithmetic; a
2-core machine runs two ranks on its two cores, and each rank's NumPy runs one thread
there, against two for the single process: expect little speed-up on such a machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CONFIGS = {  # name: (n_embd, n_layer, n_head, block_size, global batch)
    "tiny": (32, 2, 4, 16, 8),
    "small": (128, 4, 4, 64, 32),
    "shakespeare-b8": (384, 6, 6, 256, 8),
}
# Stated assumptions for the projection, not measurements: a ring all-reduce moves
# 2 (N - 1) / N of the buffer through each rank's link and takes 2 (N - 1) latency steps.
NETWORKS = {"10 GbE": (1.25e9, 20e-6), "100 Gb/s InfiniBand": (12.5e9, 2e-6)}


def worker(opts) -> None:
    import nn
    import tinygrad_attn as ta
    import tinygrad_attn.distributed as dist

    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    n_embd, n_layer, n_head, T, B = CONFIGS[opts.config]
    cfg = nn.GPTConfig(block_size=T, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                       dropout=0.0)
    g = ta.Generator().manual_seed(0)
    x = ta.randint(0, cfg.vocab_size, (B, T), generator=g)
    y = ta.randint(0, cfg.vocab_size, (B, T), generator=g)
    share = B // world
    xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
    out = {"world": world, "config": opts.config, "rows": []}
    for view in (False, True):
        ta.manual_seed(0)
        model = nn.GPT(cfg)
        ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=view,
                                                  bucket_cap_mb=opts.bucket_mb)
        opt = nn.optim.AdamW(model.parameters(), lr=1e-3)

        def step(ddp=ddp, opt=opt, view=view):
            _, loss = ddp(xs, ys)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=not view)  # views: zero in place, keep them views

        step()  # warm-up: every .grad and optimizer state made once, kernels compiled
        step()
        times, hidden, comm = [], [], []
        for _ in range(opts.steps):
            dist.barrier()
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
            rec = ddp.comm_timeline()
            hidden.append(rec.hidden)
            comm.append(rec.comm_seconds)
        opt.zero_grad(set_to_none=not view)
        with ta.memory.profile() as prof:  # forward + backward: what the gradients cost
            ddp(xs, ys)[1].backward()
        peak = prof.summary()["peak"]
        after = {c: v[-1] for c, v in prof.timeline()["series"].items()}
        times.sort()
        out["rows"].append({
            "view": view, "step_s": times[len(times) // 2],
            "allreduce_bytes": sum(b for b, _ in ddp.buckets), "buckets": len(ddp.buckets),
            "comm_s": sorted(comm)[len(comm) // 2], "hidden": sorted(hidden)[len(hidden) // 2],
            "gradient_bytes": after["gradient"], "bucket_bytes": after["bucket"],
            "peak_bytes": peak["bytes"],
            "timeline": str(ddp.comm_timeline())})
        del ddp, model, opt, prof, step
        gc.collect()  # the parameters' hooks hold the DDP: free this row before the next
    if rank == 0:
        with open(opts.worker, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if found is None:
        sys.exit("data_parallel.py: no mpiexec (pip install '.[distributed]')")
    return found


def launch(n: int, opts) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rank0.json")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        threads = str(max(1, (os.cpu_count() or 1) // n))
        env.update(OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads)
        cmd = [mpiexec(), "-n", str(n), sys.executable, os.path.abspath(__file__),
               "--worker", path, "--config", opts.config, "--steps", str(opts.steps),
               "--bucket-mb", str(opts.bucket_mb)]
        subprocess.run(cmd, check=True, env=env, timeout=1800)
        with open(path) as f:
            return json.load(f)


def ring_seconds(nbytes: int, ranks: int, bandwidth: float, latency: float) -> float:
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * latency


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small", choices=sorted(CONFIGS))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.worker:
        return worker(opts)
    results = {n: launch(n, opts) for n in (1, 2)}
    MiB = 2**20
    print(f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; config {opts.config} (global batch "
          f"{CONFIGS[opts.config][4]}), bucket cap {opts.bucket_mb:g} MiB, median of "
          f"{opts.steps} steps\n")
    print("| ranks | gradient_as_bucket_view | step s | speed-up | all-reduced MiB/step | "
          "buckets | all-reduce ms | hidden behind backward | .grad MiB | bucket MiB | "
          "forward+backward peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = {r["view"]: r["step_s"] for r in results[1]["rows"]}
    for n, res in results.items():
        for r in res["rows"]:
            print(f"| {n} | {r['view']} | {r['step_s']:.3f} | {base[r['view']] / r['step_s']:.2f} "
                  f"| {r['allreduce_bytes'] / MiB:.2f} | {r['buckets']} | {r['comm_s'] * 1e3:.1f} "
                  f"| {r['hidden']:.0%} | {r['gradient_bytes'] / MiB:.2f} "
                  f"| {r['bucket_bytes'] / MiB:.2f} | {r['peak_bytes'] / MiB:.1f} |")
    nbytes = results[2]["rows"][0]["allreduce_bytes"]
    print(f"\nProjection (assumed networks, not measured): a ring all-reduce of the "
          f"{nbytes / MiB:.2f} MiB of gradients per step")
    print("| network | bandwidth GB/s, latency µs | 2 ranks ms | 8 ranks ms | 64 ranks ms |")
    print("|---|---|---|---|---|")
    for name, (bw, lat) in NETWORKS.items():
        cells = " | ".join(f"{ring_seconds(nbytes, n, bw, lat) * 1e3:.2f}" for n in (2, 8, 64))
        print(f"| {name} | {bw / 1e9:g}, {lat * 1e6:g} | {cells} |")
    print("\n.grad and bucket MiB: live after backward (the ledger's categories gradient and "
          "bucket); as views of the buckets the gradients cost nothing more.")
    print("\nLast step's timeline on rank 0 (2 ranks, copies into buckets):")
    print(results[2]["rows"][0]["timeline"])


if __name__ == "__main__":
    main()
