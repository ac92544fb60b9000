"""A GPT training step side by side with PyTorch CPU: step time, saved bytes, peak, GEMM share.

The same GPT (same config, same initial weights moved by name through the safetensors
interchange, the same batch of tokens, dropout 0, float32) is trained with AdamW in this
engine and in PyTorch, each attention implementation against its PyTorch twin:

    naive  <-> the same naive port written in torch (three slices, permute().contiguous(),
               an additive -inf mask, softmax, matmul, permute + copy back)
    views  <-> nanoGPT's manual attention (split, view + transpose, masked_fill, softmax)
    flash  <-> torch.nn.functional.scaled_dot_product_attention(is_causal=True)

The torch side is a plain nanoGPT-style GPT (benchmarks/torch_plain_step.py: no Dropout
modules at p = 0, the mask built once, torch's default AdamW), the fastest torch step
measured here, not the tests' reference (tests/torch_nanogpt.py, `--torch-model
reference`; both: `--torch-model plain,reference`). Torch runs under its own settings:
this file imports the engine before NumPy and torch, so NumPy's OpenBLAS loads with the
engine's short thread timeout; loaded the other way round, as this harness once did,
OpenBLAS's worker spins about 0.1 s after each of our GEMMs on a core that the torch
step which follows needs (OPENBLAS_THREAD_TIMEOUT=28 in the environment brings that back;
the machine line says which is in force). What is not torch's own: the glibc setting
that keeps freed host memory (process-wide, `--host-cache off` for glibc's defaults) and
the thread count (`--threads`, both engines). docs/performance.md has the table of what
each of these changed.

After one warm-up step each, the engines alternate step by step (ours i, torch i, ...), so
drifting machine load hits both alike; reported are the median step times and the median of
the per-pair ratios. One further step of each is measured for memory (see the notes printed
with the table). The machine's float32 GEMM peak is measured in the same run; the GEMM
fraction of a row is its step's FLOP/s over that peak.

    python benchmarks/vs_torch.py --quick                      # a tiny smoke test, seconds
    python benchmarks/vs_torch.py --device cuda --configs shakespeare-b64   # on a GPU
    python benchmarks/vs_torch.py                              # small, shakespeare-b8
    python benchmarks/vs_torch.py --configs nanogpt-cpu --attn views,flash --policy save
    python benchmarks/vs_torch.py --configs small,shakespeare-b8,shakespeare-b32 \\
        --attn views,flash --markdown vs_torch.md
    python benchmarks/vs_torch.py --kernels numpy,numba --threads 2

Our kernels run on each path of --kernels (ta.backend.set_kernels: "numpy", the reference;
"numba", the compiled kernels; "auto"), one row each; `--threads` sets torch's threads and
ours (ta.set_num_threads: OpenBLAS's and numba's pools).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# The engine before NumPy and torch: importing it first is what lets it load NumPy's
# OpenBLAS with OPENBLAS_THREAD_TIMEOUT=4 (backend/threads.py). Loaded the other way round,
# OpenBLAS's worker spins about 0.1 s after each of our GEMMs, on a core the torch step
# that follows wants (docs/performance.md measures what that did to this harness).
_BLAS_TIMEOUT = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "").strip() or None
import tinygrad_attn as ta  # noqa: E402, I001 - before numpy: see above

import nn  # noqa: E402
import numpy as np  # noqa: E402

try:
    import torch
    import torch.nn.functional as TF
except ImportError:  # the whole benchmark needs torch; main() says so and exits 0
    torch = None

MiB = 2**20
TOLERANCE = 1e-4  # relative, on the loss of the first step (float32)


@dataclass
class Config:
    name: str
    n_embd: int
    n_layer: int
    n_head: int
    block_size: int
    batch: int
    steps: int
    vocab_size: int = 65


CONFIGS = {
    "tiny": Config("tiny", 32, 2, 4, 16, 4, 2),
    "small": Config("small", 128, 4, 4, 64, 32, 6),
    # nanoGPT's CPU recipe (its README's shakespeare_char on a laptop): batch 12
    "nanogpt-cpu": Config("nanogpt-cpu", 128, 4, 4, 64, 12, 10),
    "shakespeare-b8": Config("shakespeare-char", 384, 6, 6, 256, 8, 3),
    "shakespeare-b32": Config("shakespeare-char", 384, 6, 6, 256, 32, 3),
    "shakespeare-b64": Config("shakespeare-char", 384, 6, 6, 256, 64, 10),  # GPU-sized
}
ATTN = ("naive", "views", "flash")
TORCH_MODELS = ("plain", "reference")


# ----------------------------------------------------------------------------- torch side
def load_reference():
    """The PyTorch reference model the tests compare against (tests/torch_nanogpt.py),
    imported as the module `tests.torch_nanogpt`: one model, not a benchmark's own copy.

    The repository root goes on sys.path once (a script's own folder is what Python puts
    there), so `tests` imports as a namespace package without an __init__.py that would
    change how pytest collects the suite."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests import torch_nanogpt

    return torch_nanogpt


def naive_attention_class(ref):
    """The naive port of nn/gpt.py's CausalSelfAttention._naive, in torch, op for op."""

    class NaiveCausalSelfAttention(ref.CausalSelfAttention):

        def __init__(self, config):
            super().__init__(config)  # config.flash is False: registers nanoGPT's "bias"
            bs = config.block_size
            future = torch.tril(torch.ones(bs, bs)) == 0
            neg = torch.zeros(bs, bs).masked_fill(future, float("-inf"))
            self.register_buffer("neg_mask", neg, persistent=False)

        def forward(self, x):
            B, T, C = x.size()
            nh, hs = self.n_head, C // self.n_head
            qkv = self.c_attn(x)
            q = qkv[:, :, :C]  # three slices, not one split
            k = qkv[:, :, C:2 * C]
            v = qkv[:, :, 2 * C:]
            q = q.reshape(B, T, nh, hs).permute(0, 2, 1, 3).contiguous()  # (B, nh, T, hs)
            k = k.reshape(B, T, nh, hs).permute(0, 2, 3, 1).contiguous()  # (B, nh, hs, T)
            v = v.reshape(B, T, nh, hs).permute(0, 2, 1, 3).contiguous()  # (B, nh, T, hs)
            att = (q @ k) * (1.0 / math.sqrt(hs))
            att = att + self.neg_mask[:T, :T]  # an additive -inf mask
            att = TF.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
            y = y.permute(0, 2, 1, 3).contiguous().reshape(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    return NaiveCausalSelfAttention


def load_plain():
    """benchmarks/torch_plain_step.py, the plain PyTorch GPT (imported by its path's folder,
    which is on sys.path when this file runs as a script, not when it is imported)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import torch_plain_step

    return torch_plain_step


def torch_twin(ref, cfg: Config, attn: str, ours, kind: str = "plain"):
    """The torch GPT with `attn`'s twin, holding `ours`'s weights (safetensors, by name):
    kind "plain" is torch_plain_step.PlainGPT (the harness's default), "reference" the
    tests' nanoGPT (tests/torch_nanogpt.py)."""
    if kind == "plain":
        model = load_plain().PlainGPT(cfg.vocab_size, cfg.block_size, cfg.n_layer,
                                      cfg.n_head, cfg.n_embd, attn=attn)
    else:
        tcfg = ref.GPTConfig(block_size=cfg.block_size, vocab_size=cfg.vocab_size,
                             n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                             dropout=0.0, bias=True, flash=attn == "flash")
        model = ref.GPT(tcfg)
        if attn == "naive":
            naive = naive_attention_class(ref)
            for block in model.transformer.h:
                block.attn = naive(tcfg)
    try:
        import safetensors.torch
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "weights.safetensors")
            nn.save(ours.state_dict(), path)
            state = safetensors.torch.load_file(path)
        missing, unexpected = model.load_state_dict(state, strict=False)
        bad = [k for k in missing if not k.endswith(".attn.bias")]
        if bad or unexpected:
            raise RuntimeError(f"weights did not move by name: missing {bad}, "
                               f"unexpected {unexpected}")
    except ImportError:  # no safetensors: copy by name in memory
        ref.load_from_ta(model, ours.state_dict())
    if model.transformer.wte.weight is not model.lm_head.weight:
        raise RuntimeError("the torch model lost its weight tying")
    return model


def torch_saved_bytes(model, idx, targets) -> int:
    """Unique bytes saved for backward by one forward, each storage once (by data_ptr),
    parameters' storages excluded. The pack hook returns the tensor itself, so what the
    graph keeps is unchanged."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict = {}

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in params and st.nbytes() > 0:
            seen[ptr] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(idx, targets)
    loss.backward()
    return sum(seen.values())


@contextlib.contextmanager
def quiet_stderr():
    """Send file descriptor 2 to /dev/null for a moment (C++ logging bypasses sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def torch_peak_bytes(step) -> int | None:
    """Peak of the bytes torch's CPU allocator handed out during `step` and had not yet
    freed, from the profiler's memory events ("Total Allocated" counts only what was
    allocated while profiling, so this is the peak above the start)."""
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with quiet_stderr():  # the profiler's C++ side logs its start and stop there
        prof.start()
    try:
        step()
    finally:
        with quiet_stderr():
            prof.stop()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    mem = [e["args"] for e in events if e.get("name") == "[memory]"
           and e.get("args", {}).get("Device Type") == 0]
    if not mem:
        return None
    start = mem[0]["Total Allocated"] - mem[0]["Bytes"]
    return max(m["Total Allocated"] for m in mem) - start


def torch_cuda_peak(step) -> int:
    """Peak bytes torch's CUDA caching allocator handed out during `step`, above its start."""
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


# ----------------------------------------------------------------------------- machine
def gemm_peak(n: int, repeat: int, device: str = "cpu") -> tuple[float, float | None]:
    """GFLOP/s of an n x n float32 matmul, best of `repeat`: (torch, ours).

    Ours is NumPy's on CPU and this engine's (CuPy's cuBLAS) on a GPU."""
    flops = 2.0 * n**3

    def best(fn):
        fn()
        times = []
        for _ in range(repeat):
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - t0)
        return flops / min(times) / 1e9

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    t = best(lambda: a @ b)
    if device == "cpu":
        an, bn = a.numpy().copy(), b.numpy().copy()
        return t, best(lambda: an @ bn)
    x, y = ta.randn(n, n, device=device), ta.randn(n, n, device=device)
    with ta.no_grad():
        return t, best(lambda: x @ y)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# ----------------------------------------------------------------------------- one config
def step_flops(cfg: Config, non_embedding_params: int) -> float:
    """nanoGPT's estimate (PaLM appendix B): 6 N per token for the weight matmuls (forward
    2N, backward 4N), plus 12 * n_layer * T * n_embd per token for the attention matmuls
    (q k^T and att v, full T x T, forward and backward)."""
    tokens = cfg.batch * cfg.block_size
    return (6.0 * non_embedding_params * tokens
            + 12.0 * cfg.n_layer * cfg.batch * cfg.block_size**2 * cfg.n_embd)


def run_config(ref, cfg: Config, attn: str, steps: int, peak: float, policy: str = "save",
               device: str = "cpu", kinds=(("plain", 0.0),)) -> list[dict]:
    """Ours under save policy `policy` for gelu and layer_norm ("save" keeps their outputs
    as PyTorch does; "recompute" rebuilds them in backward), against each (torch model,
    gap) of `kinds`: one row each. The torch model is torch_twin's kind; the gap, seconds
    of idle time between our step and that twin's (0: none)."""
    with ta.memory.save_policies(gelu=policy, layer_norm=policy):
        rows = _run_config(ref, cfg, attn, steps, peak, device, kinds)
    for row in rows:
        row["policy"] = policy
        row["device"] = device
    return rows


def synchronize(device: str) -> None:
    """Wait for queued GPU work, so a step's wall time is its whole cost."""
    if device != "cpu":
        ta.cuda.synchronize()
        torch.cuda.synchronize()


def _run_config(ref, cfg: Config, attn: str, steps: int, peak: float, device: str,
                kinds) -> list[dict]:
    ta.manual_seed(0)
    ours = nn.GPT(nn.GPTConfig(vocab_size=cfg.vocab_size, block_size=cfg.block_size,
                               n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                               dropout=0.0, attn=attn))
    twins = [torch_twin(ref, cfg, attn, ours, kind).to(device) for kind, _ in kinds]
    ours = ours.to(device)
    hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = nn.optim.AdamW(ours.parameters(), **hyper)
    # torch's default AdamW on CPU (the for-loop one; fused and foreach measured no faster
    # at these shapes: docs/performance.md)
    topts = [torch.optim.AdamW(t.parameters(), **hyper) for t in twins]

    rng = np.random.default_rng(1)
    shape = (cfg.batch, cfg.block_size)
    idx_np = rng.integers(0, cfg.vocab_size, shape)
    tgt_np = rng.integers(0, cfg.vocab_size, shape)
    idx, tgt = ta.tensor(idx_np, device=device), ta.tensor(tgt_np, device=device)
    tidx, ttgt = torch.from_numpy(idx_np).to(device), torch.from_numpy(tgt_np).to(device)

    def ours_step() -> float:
        _, loss = ours(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    def torch_step(i: int):
        def step() -> float:
            _, loss = twins[i](tidx, ttgt)
            loss.backward()
            topts[i].step()
            topts[i].zero_grad(set_to_none=True)
            return loss.item()

        return step

    def timed(fn):
        synchronize(device)
        t0 = time.perf_counter()
        loss = fn()  # .item() inside waits for the step's GPU work
        synchronize(device)
        return time.perf_counter() - t0, loss

    # warm-up: step 1 of each, same weights, so the losses must agree; then pairs (ours,
    # twin), each twin's pair in turn, so every torch step follows one of ours. With one
    # twin the two trajectories stay step for step; with more, ours runs ahead of each.
    first = ours_step()
    losses = [[(first, torch_step(i)())] for i in range(len(twins))]
    times = [[] for _ in twins]
    for _ in range(steps):
        for i in range(len(twins)):
            t_o, l_o = timed(ours_step)
            if kinds[i][1]:
                time.sleep(kinds[i][1])
            t_t, l_t = timed(torch_step(i))
            times[i].append((t_o, t_t))
            losses[i].append((l_o, l_t))

    # memory: one more step of ours, and of each twin, measured (not timed)
    with ta.memory.profile(raw=True, device=device) as prof:
        _, loss = ours(idx, tgt)
        ours_saved_walk = ta.memory.saved_bytes(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
    summ = prof.summary()
    ours_saved = summ["saved_peak"]["unique_bytes_without_parameters"]
    flops = step_flops(cfg, ours.num_params(non_embedding=True))
    rows = []
    for i, (kind, gap) in enumerate(kinds):
        t_saved = torch_saved_bytes(twins[i], tidx, ttgt)
        topts[i].step()
        topts[i].zero_grad(set_to_none=True)
        t_peak = (torch_peak_bytes(torch_step(i)) if device == "cpu"
                  else torch_cuda_peak(torch_step(i)))
        t_ours = statistics.median(t for t, _ in times[i])
        t_torch = statistics.median(t for _, t in times[i])
        rel = [abs(a - b) / abs(b) for a, b in losses[i]]
        rows.append(dict(
            config=cfg.name, batch=cfg.batch, attn=attn, steps=steps,
            torch_model=f"{kind}, {gap:g} s gap" if gap else kind,
            ours_s=t_ours, torch_s=t_torch,
            ratio=statistics.median(a / b for a, b in times[i]),
            ours_saved=ours_saved, ours_saved_walk=ours_saved_walk, torch_saved=t_saved,
            ours_peak=summ["tensor_peak_above_start"], ours_raw_peak=summ["raw_peak_bytes"],
            ours_reserved=summ["reserved_end_bytes"],
            torch_peak=t_peak, flops=flops,
            gemm_ours=flops / t_ours / 1e9 / peak, gemm_torch=flops / t_torch / 1e9 / peak,
            rel_first=rel[0], rel_max=max(rel) if len(twins) == 1 else rel[0],
            losses=losses[i],
        ))
    return rows


# ----------------------------------------------------------------------------- report
def mib(b) -> str:
    return "n/a" if b is None else f"{b / MiB:.1f}"


def table(rows) -> str:
    head = ("| config | B | attn | ours policy | kernels | torch model | ours step s "
            "| torch step s | ratio | ours saved MiB | torch saved MiB | ratio "
            "| ours peak MiB (tensor / raw) | torch peak MiB | GEMM fraction ours / torch |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        saved_ratio = r["ours_saved"] / r["torch_saved"] if r["torch_saved"] else float("nan")
        lines.append(
            f"| {r['config']} | {r['batch']} | {r['attn']} | {r['policy']} "
            f"| {r.get('kernels', '-')} | {r['torch_model']} | {r['ours_s']:.3f} "
            f"| {r['torch_s']:.3f} | {r['ratio']:.2f} | {mib(r['ours_saved'])} "
            f"| {mib(r['torch_saved'])} | {saved_ratio:.2f} "
            f"| {mib(r['ours_peak'])} / {mib(r['ours_raw_peak'])} | {mib(r['torch_peak'])} "
            f"| {r['gemm_ours']:.2f} / {r['gemm_torch']:.2f} |")
    return "\n".join(lines)


NOTES = """\
Notes (what is measured how):
- step: forward + backward + AdamW step + zero_grad (set to None), float32, dropout 0, one
  fixed batch; after one warm-up step each, the engines alternate (ours i, torch i); step s
  = median over the timed steps, ratio = median of the per-pair ratios ours/torch.
- torch model: plain = benchmarks/torch_plain_step.py's GPT (nanoGPT's modules and names,
  no Dropout modules at p = 0, torch's default AdamW); reference = tests/torch_nanogpt.py.
  "N s gap": N seconds idle between our step and that torch step (--gap).
- ours policy: save = gelu and layer_norm keep their outputs for the next Linear's backward,
  as PyTorch does; recompute = that Linear keeps a recipe instead and the output is rebuilt
  in backward from what gelu / layer_norm saved anyway (ta.memory.save_policies).
- saved MiB: saved-for-backward bytes of one step, each storage once, parameters left out.
  Ours: the ledger's saved_peak unique_bytes_without_parameters (ta.memory.profile).
  Torch: torch.autograd.graph.saved_tensors_hooks over the forward, storages counted once
  by untyped_storage().data_ptr(), the storages of model.parameters() excluded.
- ours peak: tensor = the ledger's tensor_peak_above_start (Storages only); raw = tracemalloc
  peak above start (profile(raw=True)), which also sees NumPy temporaries inside ops.
- on --device cuda: ours raw peak = a memory hook on CuPy's pool (every array, temporaries
  included); torch peak = torch.cuda.max_memory_allocated above the start; step times
  between synchronize() calls of both engines.
- torch peak: peak of "Total Allocated" of torch's CPU allocator during one step, from the
  profiler's memory events (torch.profiler, profile_memory=True), above the start; it sees
  every ATen allocation incl. temporaries inside ops, but not MKL/oneDNN's private buffers.
  Both peaks are above the start of a step, so they leave out parameters and optimizer
  state that exist before it, and include the gradients made in the step.
- GEMM fraction: step FLOPs / step time / machine peak, step FLOPs = 6 * N * B * T
  + 12 * n_layer * B * T^2 * n_embd (N = non-embedding parameters, wte counted as it is
  lm_head; the attention term counts the full T x T matrices, which naive/views compute;
  flash may skip masked tiles, so its fraction counts work not done). Machine peak = the
  higher of torch's and numpy's large square float32 matmul, measured in this run.
- Each engine's memory figures come from one further step measured after the timed ones.
"""


def machine_line(threads: int, blas: int | None, peaks: tuple[float, float], n: int,
                 device: str = "cpu") -> str:
    t, npk = peaks
    if device != "cpu":
        return (f"Machine: {platform.platform()}, {cpu_name()}, GPU "
                f"{torch.cuda.get_device_name(0)}; Python {platform.python_version()}, "
                f"numpy {np.__version__}, torch {torch.__version__}; float32 GEMM peak "
                f"({n}x{n} matmul on the GPU): torch {t:.0f} GFLOP/s, ours (CuPy) {npk:.0f} "
                f"GFLOP/s; used {max(t, npk):.0f}.")
    return (f"Machine: {platform.platform()}, {cpu_name()}, {os.cpu_count()} CPUs; "
            f"Python {platform.python_version()}, numpy {np.__version__}, torch "
            f"{torch.__version__}; torch threads {threads} (torch.set_num_threads; MKL/"
            f"OpenMP), NumPy OpenBLAS threads {blas if blas is not None else 'unknown'} "
            f"and numba's (ta.set_num_threads); OpenBLAS thread timeout "
            f"{blas_timeout()}; float32 GEMM peak "
            f"({n}x{n} matmul): torch {t:.0f} GFLOP/s, numpy {npk:.0f} GFLOP/s; "
            f"used {max(t, npk):.0f}.")


def load_line() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def busy() -> bool:
    """Other work on the machine: a 1-minute load average above half its CPUs."""
    try:
        return os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1) + 1
    except OSError:
        return False


def blas_timeout() -> str:
    """The OPENBLAS_THREAD_TIMEOUT NumPy's OpenBLAS loaded with (2^N cycles of spinning
    after a GEMM before its workers sleep)."""
    if _BLAS_TIMEOUT is not None:
        return f"{_BLAS_TIMEOUT} (from the environment)"
    return f"{ta.backend.threads.OPENBLAS_THREAD_TIMEOUT} (the engine's)"


def parse(argv):
    """The arguments, with the comma-separated lists split and checked (as args.names,
    args.attns, args.policies, args.paths)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="small,shakespeare-b8",
                   help=f"comma-separated, from {','.join(CONFIGS)}")
    p.add_argument("--attn", default=",".join(ATTN), help="comma-separated, from naive,"
                   "views,flash")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per config (default: small 6, shakespeare 3)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kernels", default=None, help="comma-separated kernel paths for ours, "
                   "from numpy,numba,auto (default: numpy,numba; numpy without numba)")
    p.add_argument("--quick", action="store_true", help="tiny config, 2 steps: a smoke test")
    p.add_argument("--markdown", default=None, help="also write the table to this path")
    p.add_argument("--policy", default="save,recompute",
                   help="comma-separated save policies for ours (gelu and layer_norm): "
                        "save (as PyTorch), recompute (rebuild their outputs in backward)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (both engines on it)")
    p.add_argument("--torch-model", default="plain",
                   help="comma-separated torch twins, from plain (benchmarks/"
                        "torch_plain_step.py), reference (tests/torch_nanogpt.py); with "
                        "both, each torch step still follows one of ours")
    p.add_argument("--gap", default="0",
                   help="comma-separated seconds of idle time between our step and torch's "
                        "(one row each, alternating in one process): 0.25 lets threads "
                        "still spinning after our step go to sleep first")
    p.add_argument("--host-cache", choices=("on", "off"), default="on",
                   help="keep freed host memory in the process (ta.memory."
                        "keep_freed_host_memory; process-wide, so torch runs under it too)")
    args = p.parse_args(argv)
    names = ["tiny"] if args.quick else [c.strip() for c in args.configs.split(",") if c]
    attns = [a.strip() for a in args.attn.split(",") if a.strip()]
    for name in names:
        if name not in CONFIGS:
            p.error(f"unknown config {name!r}; choose from {', '.join(CONFIGS)}")
    for a in attns:
        if a not in ATTN:
            p.error(f"unknown attention {a!r}; choose from {', '.join(ATTN)}")

    policies = [x.strip() for x in args.policy.split(",") if x.strip()]
    default = "numpy,numba" if ta.backend.kernels.numba_available() else "numpy"
    paths = [k.strip() for k in (args.kernels or default).split(",") if k.strip()]
    for k in paths:
        if k not in ta.backend.kernels.MODES:
            p.error(f"unknown kernels {k!r}; choose from numpy, numba, auto")
        if k != "numpy" and not ta.backend.kernels.numba_available():
            p.error(f"--kernels {k}: numba is not installed")
    for pol in policies:
        if pol not in ("save", "recompute"):
            p.error(f"unknown policy {pol!r}; choose from save, recompute")
    if args.device not in ("cpu", "cuda"):
        p.error(f"unknown device {args.device!r}; choose cpu or cuda")
    kinds = [k.strip() for k in args.torch_model.split(",") if k.strip()]
    for k in kinds:
        if k not in TORCH_MODELS:
            p.error(f"unknown torch model {k!r}; choose from {', '.join(TORCH_MODELS)}")
    args.names, args.attns, args.policies, args.paths = names, attns, policies, paths
    try:
        gaps = [float(g) for g in args.gap.split(",") if g.strip()]
    except ValueError:
        p.error(f"--gap: expected comma-separated seconds, got {args.gap!r}")
    args.torch_models = [(k, g) for k in kinds for g in gaps or [0.0]]
    return args


def _report_row(name: str, r: dict, wall: float) -> list[str]:
    """Print one row's line (and any warning, returned) as soon as it is measured."""
    attn, policy, kern, kind = r["attn"], r["policy"], r["kernels"], r["torch_model"]
    print(f"{name:16s} {attn:5s} {policy:9s} {kern:5s} vs {kind:9s}: ours {r['ours_s']:.3f} s, "
          f"torch {r['torch_s']:.3f} s, ratio {r['ratio']:.2f}; step-1 loss rel diff "
          f"{r['rel_first']:.1e} (max over steps {r['rel_max']:.1e}); {wall:.0f} s wall",
          flush=True)
    warnings = []
    if r["rel_first"] > TOLERANCE:
        w = (f"WARNING: {name} {attn}: step-1 losses differ by {r['rel_first']:.2e} "
             f"relative (> {TOLERANCE:g}): ours {r['losses'][0][0]:.7f}, torch "
             f"{r['losses'][0][1]:.7f}")
        warnings.append(w)
        print(w, flush=True)
    if r["ours_saved"] != r["ours_saved_walk"]:
        print(f"note: {name} {attn}: ledger saved peak {mib(r['ours_saved'])} MiB, "
              f"ta.memory.saved_bytes(loss) after forward "
              f"{mib(r['ours_saved_walk'])} MiB", flush=True)
    del r["losses"]
    return warnings


def run_rows(ref, args, peak: float, device: str):
    """Every (config, attention, policy, kernel path) row: (rows, warnings)."""
    rows, warnings = [], []
    for name in args.names:
        cfg = CONFIGS[name]
        steps = args.steps or (2 if args.quick else cfg.steps)
        for attn, policy, kern in [(a, pol, k) for a in args.attns for pol in args.policies
                                   for k in args.paths]:
            t0 = time.perf_counter()
            ta.backend.set_kernels(kern)
            for r in run_config(ref, cfg, attn, steps, peak, policy, device,
                                args.torch_models):
                r["kernels"] = kern
                rows.append(r)
                warnings += _report_row(name, r, time.perf_counter() - t0)
            gc.collect()
    return rows, warnings


def main(argv=None) -> int:
    args = parse(argv)
    if torch is None:
        print("vs_torch.py compares against PyTorch, which is not installed: "
              "pip install torch (CPU) to run it. Nothing measured.")
        return 0
    device = args.device
    if device == "cuda":
        if not (ta.cuda.is_available() and torch.cuda.is_available()):
            print("--device cuda needs CuPy and torch with a CUDA GPU; none here. "
                  "Nothing measured.")
            return 0
        device = "cuda:0"
    if args.host_cache == "off" and os.environ.get("TINYGRAD_ATTN_KEEP_HOST_MEMORY") != "0":
        # glibc's untouched malloc (its dynamic mmap threshold) needs the setting left alone
        # from the start: rerun this script with the engine's opt-out set
        os.environ["TINYGRAD_ATTN_KEEP_HOST_MEMORY"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    kept = ta.memory.keep_freed_host_memory() if args.host_cache == "on" else False

    torch.set_num_threads(args.threads)
    ta.set_num_threads(args.threads)
    blas = ta.backend.threads.openblas_num_threads()
    ref = load_reference()
    n = 1024 if args.quick else 4096
    peaks = gemm_peak(n, 3 if args.quick else 5, device)
    peak = max(peaks)
    machine = machine_line(torch.get_num_threads(), blas, peaks, n, device)
    machine += (" Host memory: freed memory kept in the process (glibc mallopt; process-wide, "
                "so torch's steps run under it too)." if kept else
                " Host memory: glibc's defaults (freed large blocks go back to the system).")
    print(machine, flush=True)
    load_before = load_line()

    rows, warnings = run_rows(ref, args, peak, device)

    machine += f" Load average (1 min) at the start {load_before}, at the end {load_line()}."
    if busy():
        warnings.append(f"WARNING: the machine was busy (load average above half its "
                        f"{os.cpu_count()} CPUs): other jobs shared the cores, and torch's "
                        "OpenMP team suffers most from that; rerun on a quiet machine.")
    parts = [machine, table(rows), NOTES.rstrip()]
    if warnings:
        parts.append("\n".join(warnings))
    text = "\n\n".join(parts)
    print()
    print(machine)
    print()
    print(table(rows))
    print()
    print(NOTES.rstrip())
    for w in warnings:
        print(w)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
        print(f"\nwrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
