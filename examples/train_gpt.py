"""Train a small character-level GPT: the project's main job.

    python examples/train_gpt.py                       # the embedded corpus, CPU
    python examples/train_gpt.py --data input.txt --steps 2000 --out runs/a
    python examples/train_gpt.py --out runs/a --resume --steps 3000   # on to step 3000
    python examples/train_gpt.py --config run.toml --lr 1e-3          # flags beat the file

The default corpus needs no download: it is built from a fixed list of the standard
library's own source files. The log shows, beside the loss, each step's memory from the
ledger: the peak, the bytes saved for backward, and the bytes copied. The default run
took 49 s and 55 s of wall time on the 2-core machine README.md describes (numba's cache
warm; 65 s the first time, while the kernels compiled).

A flag out of range (`--steps 0`) stops with argparse's usage line and the error; an error
in the run's files or settings stops with one line; both exit with status 2. A model too
large for this machine's memory (`--block-size 100000`) is refused before anything is
allocated, with one line naming the bytes it would need and what to lower (status 2).

The run is kept: its checkpoint goes to --out (default: a new runs/DATE-TIME directory
under the working directory, named in the log), at the end, every --save-every steps, and
on Ctrl-C or SIGTERM, which finish the step under way, save, print the command that
resumes, and exit with 130 or 143 (a second Ctrl-C exits at once, without saving). --out
is checked writable before training; a lock file keeps a second trainer out of it; a new
run into a directory that holds a checkpoint stops unless --resume or --overwrite.

--resume continues the run in --out exactly: --steps is the total to reach (the
checkpoint's own total when not given), the learning-rate schedule is the one the run
started with (--lr-decay-steps long; give it the final total up front to resume a run
further without the rate having reached --min-lr), and a flag that would change the
run's trajectory (the model, the learning rates, the batch size...) stops with a list of
the conflicts. The checkpoint records what identifies its text (hash, size, characters):
a resume reads the file where the run found it, or --data FILE at a new path, and stops,
saying what changed, when the text is not the same. A --config TOML file holds flags by
name (`n_layer = 6`, `lr = 1e-3`); flags on the command line override it, and its text is
saved in the checkpoint.

--memory-budget SIZE (`--memory-budget 6GiB --batch-size 64`) trains within SIZE bytes of
tensors: ta.memory.plan measures the step (nn.memory_plan.gpt_step, the run's seed and
learning rate) and picks the fastest attention (views or flash; --attn given: that one),
save policies and recomputed blocks (--checkpoint given: all or none) that fit, prints the
plan, and trains under ta.memory.set_limit(SIZE), the emulated device: the process's
tensors, so the step is planned within SIZE less the corpus's tensors (and anything else
alive then). Without --batch-size, the batch is the largest that fits. A budget nothing
fits stops before training with one line naming the budget or batch that would (status
2). The plan is saved in the checkpoint ("memory_plan", "memory_budget"); --resume trains
on under it without planning again, and refuses another --memory-budget (as it refuses
other flags that would change the run). On the CPU and one process only.

Data-parallel: `mpiexec -n N python examples/train_gpt.py ...` trains on N processes (the
MPI backend of ta.distributed; pip install '.[distributed]'). --batch-size stays the global
batch and must be divisible by N; each rank trains on its N-th of every batch. Rank 0 alone
prints, shows the progress bar, takes the lock and writes the checkpoint. A run resumes
exactly on the same N, and on another N when --dropout is 0 (the batches are the same on
any N; the dropout masks of ranks > 0 are each rank's own).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import shlex
import shutil
import signal
import sys
import threading
import time

import nn
import nn.ranks
import tinygrad_attn as ta
from nn.data import default_corpus, identity_changes, load_text
from nn.gpt import ATTENTION, MLPS, NORMS, POS_EMBS
from nn.trainer import (
    CHECKPOINT,
    CheckpointError,
    DataMismatch,
    Interrupted,
    ResumeConflict,
    RunLock,
    RunLocked,
    TrainConfig,
    Trainer,
    broadcast_text,
)

RUNS = "runs"  # the default --out is a new directory in it: runs/DATE-TIME


# ----------------------------------------------------------------------------- flag types
def _int(lo: int, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {value}")
        return value

    return parse


def _float(lo: float, hi: float | None = None, hi_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        too_high = hi is not None and (value >= hi if hi_open else value > hi)
        if not math.isfinite(value) or value < lo or too_high:
            bound = (f">= {lo}" if hi is None else
                     f"in [{lo}, {hi}{')' if hi_open else ']'}")
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value

    return parse


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean (true/false, yes/no, on/off, 1/0): "
                                     f"{text!r}")


def _budget(text: str) -> int:
    try:
        return ta.memory.parse_bytes(text, "--memory-budget")
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _device(text: str) -> str:
    if text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"invalid device {text!r}: use cpu, cuda, or cuda:N "
                                     "for GPU number N (cuda:0, cuda:1, ...)")


# dest: (type, kind for a config file, help). Every flag, model and training alike.
MODEL_FLAGS = {
    "block_size": (_int(1), int, "context length T: tokens per training window, and the "
                                 "most the model attends to"),
    "n_layer": (_int(1), int, "transformer blocks"),
    "n_head": (_int(1), int, "attention heads per block (must divide --n-embd)"),
    "n_embd": (_int(1), int, "embedding width C"),
    "dropout": (_float(0.0, 1.0, hi_open=True), float,
                "dropout probability (0 with --attn flash)"),
    "bias": (_bool, bool, "biases in the Linear and LayerNorm layers"),
    "attn": (str, str, "attention: naive (the story's port, with copies), views (views "
                       "only), flash (blocked, never forms the T x T matrix)"),
    "checkpoint": (_bool, bool, "recompute each block in backward instead of saving its "
                                "activations"),
    "attn_block_size": (_int(1), int, "query/key tile of --attn flash"),
    "norm": (str, str, "layernorm (nanoGPT) or rmsnorm"),
    "pos_emb": (str, str, "positions: learned (the wpe table) or rope (rotary q and k)"),
    "mlp": (str, str, "gelu (nanoGPT) or swiglu (w2(silu(w1 x) * w3 x))"),
    "n_kv_head": (_int(1), int, "key/value heads for grouped-query attention (must divide "
                                "--n-head; default: --n-head)"),
}
CHOICES = {"attn": ATTENTION, "norm": NORMS, "pos_emb": POS_EMBS, "mlp": MLPS}
TRAIN_FLAGS = {
    "steps": (_int(1), int, "optimizer steps in all; with --resume, the total to reach "
                            "counting the checkpoint's (default there: the checkpoint's)"),
    "batch_size": (_int(1), int, "sequences per step"),
    "lr": (_float(0.0), float, "peak learning rate, reached after --warmup steps"),
    "min_lr": (_float(0.0), float, "learning rate at the end of the cosine decay and after"),
    "warmup": (_int(0), int, "steps of linear warmup"),
    "weight_decay": (_float(0.0), float, "AdamW weight decay (matrices only, as nanoGPT)"),
    "grad_clip": (_float(0.0), float, "clip the gradients' global norm to this (0: never)"),
    "lr_decay_steps": (_int(0), int, "length of the warmup + cosine schedule in steps "
                                     "(0: --steps); fixed for the run, resumes included"),
    "eval_every": (_int(0), int, "steps between validation losses (0: only at the end)"),
    "eval_iters": (_int(1), int, "validation batches per evaluation"),
    "seed": (_int(0, 2**32 - 1), int, "seed of the weights' init, dropout and batches"),
    "device": (_device, str, "cpu, cuda or cuda:N"),
    "save_every": (_int(0), int, "steps between checkpoints in --out (0: only at the end)"),
    "sample_tokens": (_int(0), int, "characters sampled from the model after training"),
}
OTHER_FLAGS = {  # dest: (type, kind, help); not TrainConfig or GPTConfig fields
    "data": (str, str, "a UTF-8 text file to train on (default: the embedded stdlib "
                       "corpus)"),
    "out": (str, str, f"directory for the checkpoint ({CHECKPOINT}) (default: a new "
                      f"{RUNS}/DATE-TIME in the working directory)"),
    "no_progress": (None, bool, "no progress bar"),
    "memory_budget": (_budget, str, "train within this many bytes of tensors (6GiB, 512MiB): "
                                    "plan the fastest attention, save policies and "
                                    "recomputed blocks that fit (ta.memory.plan), print the "
                                    "plan, and train under this emulated limit; without "
                                    "--batch-size, at the largest batch that fits"),
}
DEFAULT_MODEL = nn.GPTConfig(block_size=64, n_layer=4, n_head=4, n_embd=128)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown after each flag's help, but for flags whose default is "none", which
    their help explains."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def build_parser(suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """The CLI. With suppress_defaults, a flag not given is absent from the namespace:
    how main() learns which flags were given, to check them against a checkpoint."""
    p = argparse.ArgumentParser(
        prog="train_gpt.py", description=__doc__.split("\n")[0],
        formatter_class=_HelpFormatter,
        argument_default=argparse.SUPPRESS if suppress_defaults else None)

    def add(group, dest, spec, default):
        kind_type, _, text = spec
        flag = "--" + dest.replace("_", "-")
        if suppress_defaults:
            default = argparse.SUPPRESS
        if kind_type is None:  # a switch
            group.add_argument(flag, action="store_true", help=text,
                               **({"default": default} if suppress_defaults else {}))
            return
        extra = {"choices": CHOICES[dest]} if dest in CHOICES else {}
        if kind_type is _bool:
            extra["metavar"] = "BOOL"
        group.add_argument(flag, type=kind_type, default=default, help=text, **extra)

    p.add_argument("--config", metavar="FILE.toml", default=None if not suppress_defaults
                   else argparse.SUPPRESS,
                   help="a TOML file of flags by name (n_layer = 6); command-line flags "
                        "override it; saved in the checkpoint")
    add(p, "data", OTHER_FLAGS["data"], None)
    g = p.add_argument_group("model (GPTConfig; vocab_size comes from the data)")
    for dest, spec in MODEL_FLAGS.items():
        add(g, dest, spec, getattr(DEFAULT_MODEL, dest))
    t = p.add_argument_group("training")
    defaults = TrainConfig()
    for dest, spec in TRAIN_FLAGS.items():
        add(t, dest, spec, getattr(defaults, dest))
    add(t, "out", OTHER_FLAGS["out"], None)
    t.add_argument("--resume", action="store_true",
                   **({"default": argparse.SUPPRESS} if suppress_defaults else {}),
                   help="continue the run in --out exactly from its checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   **({"default": argparse.SUPPRESS} if suppress_defaults else {}),
                   help="start a new run in an --out that holds a checkpoint, replacing it")
    add(t, "no_progress", OTHER_FLAGS["no_progress"], False)
    add(t, "memory_budget", OTHER_FLAGS["memory_budget"], None)
    return p


# ----------------------------------------------------------------------------- ranks
LAUNCH_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE")  # what launchers set


def _launched_on_ranks() -> bool:
    """Whether a launcher (mpiexec) started this process as one of several."""
    for name in LAUNCH_SIZE:
        try:
            if int(os.environ.get(name, "1")) > 1:
                return True
        except ValueError:
            pass
    return False


_dist = nn.ranks.distributed  # ta.distributed, imported on first use
_world = nn.ranks.world  # (world size, rank); (1, 0) on one process


def _say(*args, **kwargs) -> None:
    """print, on rank 0 only: it speaks for the run."""
    if _world()[1] == 0:
        print(*args, **kwargs)


def _on_rank0(check) -> None:
    """Run `check` on rank 0 alone (the out directory, its lock and its disk are rank 0's).
    On several ranks every rank then learns whether it failed, so that none goes on alone
    into training: the others exit with rank 0's status, quietly (rank 0 said why)."""
    world, rank = _world()
    if world == 1:
        check()
        return
    failure, status = None, 0
    if rank == 0:
        try:
            check()
        except SystemExit as e:
            failure, status = e, e.code if isinstance(e.code, int) else 1
        except BaseException as e:
            failure, status = e, 1
    dist = _dist()
    code = ta.tensor([status], dtype=ta.int64)
    dist.broadcast(code, src=0)
    if failure is not None:
        raise failure
    if int(code.item()):
        raise SystemExit(int(code.item()))


def _fail(message: str, status: int = 2) -> None:
    """An error in the arguments or the run's files: a message and exit status 2, no
    traceback (as argparse does for a bad flag); status 1 for a save that failed. On
    several ranks only rank 0 prints: every rank meets the same error there."""
    _say(f"train_gpt.py: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def _read_config(path: str) -> tuple[dict, str]:
    """(flag values by dest, the file's text) from a TOML file, each checked as its flag."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            _fail("--config needs Python 3.11+ (tomllib) or the tomli package "
                  "(pip install tomli)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        raw = tomllib.loads(text)
    except OSError as e:
        _fail(f"--config {path}: {e.strerror or e}")
    except (ValueError, UnicodeDecodeError) as e:  # TOMLDecodeError is a ValueError
        _fail(f"--config {path}: not valid TOML: {e}")
    specs = {**MODEL_FLAGS, **TRAIN_FLAGS, **OTHER_FLAGS}
    values = {}
    for key, value in raw.items():
        dest = key.replace("-", "_")
        if dest not in specs:
            _fail(f"--config {path}: unknown setting {key!r}; the settings are the flags' "
                  f"names: {', '.join(sorted(specs))}")
        parse, kind, _ = specs[dest]
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok:
            _fail(f"--config {path}: {key} must be a TOML {kind.__name__}, got {value!r}")
        if parse not in (None, str):
            try:
                value = parse(str(value).lower() if kind is bool else str(value))
            except argparse.ArgumentTypeError as e:
                _fail(f"--config {path}: {key}: {e}")
        if dest in CHOICES and value not in CHOICES[dest]:
            _fail(f"--config {path}: {dest} must be one of {', '.join(CHOICES[dest])}, "
                  f"got {value!r}")
        values[dest] = value
    return values, text


def parse_args(argv=None) -> tuple[argparse.Namespace, set]:
    """(the arguments, the dests given on the command line or in --config)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)  # --help, and every flag checked
    given = set(vars(build_parser(suppress_defaults=True).parse_args(argv)))
    args.config_text = None
    if args.config:
        from_config, text = _read_config(args.config)
        parser.set_defaults(**from_config)
        args = parser.parse_args(argv)
        args.config_text = text
        given |= set(from_config)
    return args, given


class _Run:
    """The out directory of this command and what it holds of it: the lock, and whether
    the command created the directory (removed again if it stays empty)."""

    def __init__(self) -> None:
        self.out: str | None = None
        self.lock: RunLock | None = None
        self.created = False
        self.total = None  # the step the run trains to
        self.plan = None  # (the memory plan, the process's budget) under --memory-budget
        self.memory = contextlib.ExitStack()  # its limit and save policies while training

    @property
    def ckpt(self) -> str:
        return os.path.join(self.out, CHECKPOINT)

    def take(self, out: str, create: bool, created: bool = False) -> None:
        """Create `out` if needed (`created`: it was just made) and lock it: one line and
        status 2 if it cannot be written (checked now, not at the first save after all the
        training)."""
        self.out, self.created = out, created
        if os.path.exists(out) and not os.path.isdir(out):
            _fail(f"--out {out}: not a directory")
        try:
            if create and not os.path.isdir(out):
                os.makedirs(out)
                self.created = True
            if os.path.isdir(self.ckpt):
                _fail(f"--out {out}: {self.ckpt} is a directory, not a checkpoint file")
            self.lock = RunLock(out).acquire()
        except RunLocked as e:
            _fail(str(e))
        except OSError as e:
            _fail(f"--out {out}: cannot write there ({e.strerror or e}); checked before "
                  "training, so that the run's checkpoint is not lost at its end")

    def release(self) -> None:
        self.memory.close()  # the emulated limit and the save policies, as they were
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.created:
            try:
                os.rmdir(self.out)  # only if nothing was saved in it
            except OSError:
                pass


def _default_out() -> str:
    """A new directory runs/DATE-TIME (-2, -3... if taken), and runs/.gitignore so that
    runs made inside a clone stay out of git."""
    try:
        if not os.path.isdir(RUNS):
            os.makedirs(RUNS, exist_ok=True)
            with open(os.path.join(RUNS, ".gitignore"), "w") as f:
                f.write("# checkpoints of examples/train_gpt.py\n*\n")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1, 1000):
            out = os.path.join(RUNS, stamp if n == 1 else f"{stamp}-{n}")
            try:
                os.mkdir(out)
            except FileExistsError:
                continue
            return out
    except OSError as e:
        _fail(f"cannot create the default out directory in {RUNS}/ ({e.strerror or e}); "
              "pass --out DIR")
    _fail(f"{RUNS}/ has no free name for {stamp}; pass --out DIR")


def _command(script: str, *args: str) -> str:
    """A command line the user can paste: `python` when that is this interpreter."""
    python = "python" if shutil.which("python") and os.path.realpath(
        shutil.which("python")) == os.path.realpath(sys.executable) else sys.executable
    rel = os.path.relpath(script)
    script = rel if not rel.startswith("..") else os.path.abspath(script)
    return shlex.join([python, script, *args])


def _resume_command(out: str) -> str:
    return _command(__file__, "--out", out, "--resume")


def _checkpoint_step(path: str) -> str | None:
    try:
        return nn.load_metadata(path)["step"]
    except (OSError, ValueError, KeyError):
        return None


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _least_bytes(gcfg: nn.GPTConfig, batch: int) -> dict:
    """A lower bound on what the model and one training step allocate, float32, by part:
    the causal masks each block builds (a (T, T) bool kept, two float32 ones made on the
    way; naive's additive mask besides), the block weights with their gradients and
    AdamW's two moments, and the probabilities (B, nh, T, T) each layer saves unless the
    attention is flash (one layer at a time under checkpointing)."""
    T, C, L, nh = gcfg.block_size, gcfg.n_embd, gcfg.n_layer, gcfg.n_head
    masks = L * T * T + 8 * T * T + (4 * L * T * T if gcfg.attn == "naive" else 0)
    weights = 16 * (12 * L * C * C + (T * C if gcfg.pos_emb == "learned" else 0))
    layers = 0 if gcfg.attn == "flash" else (1 if gcfg.checkpoint else L)
    scores = 4 * layers * batch * nh * T * T
    return {"the causal masks": masks, "weights, gradients and AdamW state": weights,
            "one step's attention probabilities": scores}


def _check_fits(gcfg: nn.GPTConfig, batch: int) -> None:
    """Refuse, in one line, a model this machine cannot hold, before allocating it."""
    parts, free = _least_bytes(gcfg, batch), ta.memory.available_bytes()
    need = sum(parts.values())
    if free is None or need <= free:
        return
    biggest = max(parts, key=parts.get)
    _fail(f"this model needs at least {_size(need)} of memory ({biggest}: "
          f"{_size(parts[biggest])}) and {_size(free)} is available: lower --block-size "
          f"({gcfg.block_size}), --batch-size ({batch}) or --n-layer ({gcfg.n_layer})")


def _stop_at_once(signum, frame) -> None:
    """Before and after training, SIGTERM (like Ctrl-C) stops at once, as an exception,
    so that the lock is released and the message says what is saved."""
    raise Interrupted(signum, 0, None)


def main(argv=None) -> Trainer:
    """Train (or resume) per the command line. Launched by mpiexec on several ranks, it
    makes the process group first and destroys it at the end (unless the caller made it)."""
    owns_group = _launched_on_ranks() and not _dist().is_initialized()
    if owns_group:
        try:
            _dist().init_process_group("mpi")
        except RuntimeError as e:  # no mpi4py, or a launch MPI does not see
            _fail(str(e))
    try:
        return _main_of_rank(argv)
    finally:
        if owns_group:
            _dist().destroy_process_group()


def _main_of_rank(argv) -> Trainer:
    if _world()[1] == 0:
        args, given = parse_args(argv)
    else:  # --help and a flag's error: once, from rank 0 (every rank parses the same argv)
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            args, given = parse_args(argv)
    if args.device != "cpu" and not ta.cuda.is_available():
        _fail(f"--device {args.device}: no CUDA GPU here (CuPy missing or no device); "
              "use --device cpu")
    if args.resume and args.overwrite:
        _fail("--resume continues the run in --out, --overwrite starts a new one there: "
              "give one of them")
    run = _Run()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _stop_at_once)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _main(args, given, run)
    except (Interrupted, KeyboardInterrupt) as e:
        _interrupted(e, run)
    except CheckpointError as e:
        hint = ""
        if run.out and _checkpoint_step(run.ckpt) is not None:
            hint = f"; once there is room, resume with: {_resume_command(run.out)}"
        _fail(f"{e}{hint}", status=1)
    finally:
        run.release()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupted(e: KeyboardInterrupt, run: _Run) -> None:
    """The message after a signal, and the shell's status for it (130 SIGINT, 143 SIGTERM)."""
    signum = getattr(e, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    path = getattr(e, "path", None)
    if _world()[1] != 0:  # rank 0 says where the run stopped
        raise SystemExit(128 + signum)
    if path is not None:
        total = f" of {run.total}" if run.total else ""
        print(f"train_gpt.py: {name}: stopped at step {e.step}{total}; checkpoint saved to "
              f"{path}\n"
              f"resume with: {_resume_command(run.out)}", file=sys.stderr)
    else:
        step = _checkpoint_step(run.ckpt) if run.out else None
        kept = (f"the checkpoint {run.ckpt} (step {step}) is whole; resume with: "
                f"{_resume_command(run.out)}" if step is not None else "nothing was saved")
        print(f"train_gpt.py: {name}: stopped at once; {kept}", file=sys.stderr)
    raise SystemExit(128 + signum)


def _main(args, given: set, run: _Run) -> Trainer:
    train_given = {k: getattr(args, k) for k in TRAIN_FLAGS if k in given}
    if args.memory_budget is not None and _world()[0] > 1:
        _fail("--memory-budget plans one process's step; a data-parallel run is not planned "
              "per rank: drop --memory-budget, or train on one process")
    if args.memory_budget is not None and args.device != "cpu":
        _fail(f"--memory-budget plans the step on the CPU only; drop it with --device "
              f"{args.device}")
    if args.resume:
        trainer = _resume(args, given, train_given, run)
    else:
        trainer = _start(args, run, given)
    if args.config_text is not None:
        trainer.metadata["config_file"] = json.dumps({"path": os.path.abspath(args.config),
                                                      "text": args.config_text})

    def room() -> None:
        need, free = trainer.checkpoint_bytes(), shutil.disk_usage(run.out).free
        if free < need:
            _fail(f"--out {run.out}: {_size(free)} free on its filesystem, and a checkpoint "
                  f"of this model needs about {_size(need)}")

    _on_rank0(room)
    model = trainer.model
    _say(f"corpus: {len(trainer.train_batches.data) + len(trainer.val_ids):,} characters, "
          f"vocabulary {trainer.tokenizer.vocab_size}; model: {model.num_params():,} "
          f"parameters, {trainer.gcfg}")
    _say(f"unigram entropy of the validation text: {trainer.unigram_entropy():.3f} nats")
    every = f", every {trainer.tcfg.save_every} steps" if trainer.tcfg.save_every else ""
    _say(f"checkpoint: {run.ckpt} (at the end{every}, and on Ctrl-C or SIGTERM)")
    run.total = trainer.tcfg.steps
    note = trainer.schedule_note()
    if note:
        _say(note)
    if run.plan is not None:
        _enter_plan(trainer, run)
    trainer.run()
    if trainer.rank != 0:  # the final loss and the sample are rank 0's to print
        return trainer
    val = trainer.evaluate()
    print(f"final validation loss {val:.4f} nats "
          f"(unigram entropy {trainer.unigram_entropy():.3f})")
    print("sample:\n" + trainer.sample())
    sampler = os.path.join(os.path.dirname(__file__), "sample.py")
    print(f"sample more: {_command(sampler, '--ckpt', run.out)}")
    return trainer


def _start(args, run: _Run, given: frozenset = frozenset()) -> Trainer:
    """A new run: its flags and data checked, then its out directory taken."""
    if args.n_embd % args.n_head:
        _fail(f"--n-embd ({args.n_embd}) must be a multiple of --n-head ({args.n_head})")
    if args.attn == "flash" and args.dropout > 0:
        _fail("--attn flash has no attention dropout: use --dropout 0 or --attn views")
    text = _text(args.data)

    def take() -> None:
        if args.out:
            run.take(args.out, create=True)
        else:
            run.take(_default_out(), create=True, created=True)
        if os.path.exists(run.ckpt) and not args.overwrite:
            step = _checkpoint_step(run.ckpt)
            what = f"at step {step}" if step is not None else "not one this trainer can read"
            _fail(f"--out {run.out} already holds a checkpoint ({run.ckpt}, {what}): --resume "
                  "continues that run, --overwrite replaces it with this new one (at its "
                  "first save), or give another --out")

    _on_rank0(take)
    if _world()[0] > 1:  # rank 0's out directory (a new runs/DATE-TIME is named there)
        run.out = broadcast_text(run.out or "")
    gcfg = nn.GPTConfig(**{k: getattr(args, k) for k in MODEL_FLAGS})
    if args.memory_budget is not None:
        gcfg = _plan(args, given, gcfg, text, run)
    _check_fits(gcfg, args.batch_size)
    tcfg = TrainConfig(**{k: getattr(args, k) for k in TRAIN_FLAGS}, out=run.out,
                       progress=not args.no_progress)
    try:
        trainer = Trainer(gcfg, tcfg, text)
    except ValueError as e:  # the data is too short for a window, say
        _fail(str(e))
    _say_data_parallel(trainer)
    trainer.metadata["data"] = os.path.abspath(args.data) if args.data else ""
    if run.plan is not None:
        plan, budget = run.plan
        trainer.metadata["memory_plan"] = json.dumps(plan.to_dict())
        trainer.metadata["memory_budget"] = str(budget)
    return trainer


def _corpus_bytes(text: str) -> int:
    """The tensor bytes the trainer holds for the corpus (its token ids, split into views
    for training and validation), measured by making them as the trainer does."""
    from nn.data import CharTokenizer, train_val_split

    before = ta.memory.live_bytes()
    ids = ta.tensor(CharTokenizer(text).encode(text), dtype=ta.int64)
    parts = train_val_split(ids, 0.9)
    del ids
    held = ta.memory.live_bytes() - before
    del parts
    return held


def _plan(args, given: set, gcfg: nn.GPTConfig, text: str, run: _Run) -> nn.GPTConfig:
    """--memory-budget: the plan of this run's step, printed; the config it builds (and
    args.batch_size set to its batch). One line and status 2 when nothing fits.

    The budget is the whole process's: the trainer runs under ta.memory.set_limit(budget),
    which counts every tensor alive. The step (ta.memory.plan of nn.memory_plan.gpt_step,
    which builds the model, its gradients and AdamW's state, and the batch) is planned
    within what is left of it once the corpus tensors and whatever else the process holds
    now are counted."""
    from nn.data import CharTokenizer
    from nn.memory_plan import TIME_KNOBS, apply, gpt_knobs, gpt_step

    budget = args.memory_budget
    gcfg = dataclasses.replace(gcfg, vocab_size=CharTokenizer(text).vocab_size)
    held = ta.memory.live_bytes() + _corpus_bytes(text)
    fmt = ta.memory.fmt_bytes
    if held >= budget:
        _fail(f"--memory-budget {fmt(budget)}: the corpus's tensors (with what the process "
              f"holds already) take {fmt(held)}; give a larger budget")
    if "attn" in given:  # the attention asked for; else views and flash (naive is never
        attention = (args.attn,)  # faster), flash only without dropout
    else:
        attention = ("views",) if args.dropout > 0 else ("views", "flash")
    knobs = gpt_knobs(gcfg, attention=attention, seed=args.seed)
    if "checkpoint" in given:  # recomputing every block or none, as asked
        knobs["checkpoint"] = [list(range(gcfg.n_layer))] if args.checkpoint else [[]]
    batch = args.batch_size if "batch_size" in given else None
    _say(f"planning the step within --memory-budget {fmt(budget)} ({fmt(budget - held)} "
         f"after the corpus's {fmt(held)} of tensors) "
         + (f"at batch {batch}" if batch else "at the largest batch that fits") + " ...")
    plan = ta.memory.plan(gpt_step(gcfg, seed=args.seed, lr=args.lr), budget - held,
                          batch=batch, knobs=knobs, time_batches=(2, 4),
                          time_knobs=TIME_KNOBS, repeats=3)
    _say(str(plan))
    if not plan.fits:
        need, most = plan.needs["budget"], plan.needs["largest_batch"]
        _fail(f"--memory-budget {fmt(budget)} does not fit batch {plan.batch}: the least "
              f"predicted peak of its step is {fmt(need)} above the corpus's {fmt(held)} of "
              f"tensors; "
              f"give --memory-budget {fmt(need + held)} ({need + held} bytes) or more"
              + (f", or --batch-size {most} or less" if most else
                 "; not even batch 1 fits"))
    if batch is None:
        _say(f"batch size {plan.batch}: the largest that fits --memory-budget "
             f"{fmt(budget)}")
    args.batch_size = plan.batch
    run.plan = (plan, budget)
    config, _ = apply(plan, gcfg)
    return config


def _enter_plan(trainer: Trainer, run: _Run) -> None:
    """Training from here on under the plan's save policies and the emulated limit."""
    from nn.memory_plan import policies_for

    plan, budget = run.plan
    run.memory.enter_context(policies_for(plan.choice))
    run.memory.enter_context(ta.memory.limit(budget, trainer.tcfg.device))
    _say(f"memory: training under an emulated limit of {ta.memory.fmt_bytes(budget)} "
         f"(ta.memory.set_limit), {plan.choice}")


def _say_data_parallel(trainer: Trainer) -> None:
    n, batch = trainer.world_size, trainer.tcfg.batch_size
    if n > 1:
        _say(f"data-parallel on {n} ranks ({batch // n} samples per rank, global batch "
             f"{batch})")


def _text(data: str | None) -> str:
    if not data:
        return default_corpus()
    try:
        return load_text(data)
    except OSError as e:
        _fail(f"--data {data}: {e.strerror or e}")
    except ValueError as e:
        _fail(str(e))


def _resume_text(args, given: set, meta: dict, path: str) -> tuple[str, str]:
    """(the run's text, where it was read: a path, "" for the embedded corpus).

    The checkpoint's data_identity says what the text is: the file where the run read it
    if it still holds that text, else --data FILE if it does. A checkpoint without it
    (older) resumes by path, as it was written."""
    recorded = meta.get("data")
    identity = json.loads(meta["data_identity"]) if "data_identity" in meta else None
    where = recorded or "the embedded stdlib corpus"
    if "data" in given:
        text = _text(args.data)
        if identity is None:
            if recorded is not None and os.path.abspath(args.data) != (recorded or None):
                _fail(f"cannot resume {path} with --data {args.data}: its run trained on "
                      f"{where} (the checkpoint predates content checks, so the path must "
                      "match)")
        else:
            changes = identity_changes(identity, text)
            if changes:
                _fail(f"cannot resume {path} with --data {args.data}: it is not the text "
                      f"the run trained on ({where}): {'; '.join(changes)}")
        return text, os.path.abspath(args.data)
    if not recorded:
        text = default_corpus()
        changes = identity_changes(identity, text) if identity is not None else []
        if changes:
            _fail(f"cannot resume {path}: the embedded stdlib corpus, read from this Python "
                  f"({sys.version.split()[0]}), is not the text the run trained on: "
                  f"{'; '.join(changes)}; resume with the Python the run started on, or "
                  "pass --data FILE with its text")
        return text, ""
    try:
        text = load_text(recorded)
    except OSError as e:
        need = (f" (it must hold the same text: {identity['bytes']:,} bytes, sha256 "
                f"{identity['sha256'][:12]}...)" if identity is not None else "")
        _fail(f"cannot resume {path}: its run's data file {recorded} cannot be read "
              f"({e.strerror or e}); if it moved, pass --data FILE, its new path{need}")
    except ValueError as e:
        _fail(f"cannot resume {path}: {e}")
    changes = identity_changes(identity, text) if identity is not None else []
    if changes:
        _fail(f"cannot resume {path}: {recorded}, the file its run trained on, has changed: "
              f"{'; '.join(changes)}; pass --data FILE with the run's text, or start a new "
              "run")
    return text, recorded


def _resume(args, given: set, train_given: dict, run: _Run) -> Trainer:
    if not args.out:
        _fail("--resume needs --out DIR, the directory that holds the checkpoint")
    path = os.path.join(args.out, CHECKPOINT)
    try:
        meta = nn.load_metadata(path)
    except (FileNotFoundError, ValueError) as e:
        _fail(f"--resume: {e}")
    _on_rank0(lambda: run.take(args.out, create=False))
    run.out = args.out
    _resume_plan(args, given, meta, path, run)
    text, data = _resume_text(args, given, meta, path)
    model = {k: getattr(args, k) for k in MODEL_FLAGS if k in given}
    overrides = {**train_given, "out": args.out, "progress": not args.no_progress}
    try:
        trainer = Trainer.from_checkpoint(path, text, model=model, **overrides)
    except ResumeConflict as e:
        rows = "\n".join(f"  --{k.replace('_', '-')}: given {v!r}, checkpoint {c!r}"
                         for k, v, c in e.conflicts)
        _fail(f"cannot resume {path} with flags that contradict its run (a resumed run "
              f"continues that run exactly):\n{rows}\nDrop these flags (or set them to the "
              "checkpoint's values), or start a new run with another --out.")
    except DataMismatch as e:
        _fail(f"cannot resume {path} on {data or 'the embedded stdlib corpus'}: {e}")
    except ValueError as e:  # no trainer state, unreadable file, tensors unlike the config
        _fail(f"--resume: {e}")
    if trainer.step >= trainer.tcfg.steps:
        _fail(f"nothing to train: {path} is at step {trainer.step} and --steps "
              f"{trainer.tcfg.steps} is the total to reach (the checkpoint's steps "
              f"included); pass --steps greater than {trainer.step}")
    _say_data_parallel(trainer)
    if data != meta.get("data", data):
        _say(f"data: {data} (the run's text, moved from {meta['data'] or 'the corpus'})")
    trainer.metadata["data"] = data
    _say(f"resumed from {path} at step {trainer.step}, training to step {trainer.tcfg.steps}")
    if run.plan is not None:
        _say(f"memory plan of the run (from its checkpoint, not planned again): batch "
             f"{run.plan[0].batch}, {run.plan[0].choice}, --memory-budget "
             f"{ta.memory.fmt_bytes(run.plan[1])}")
    return trainer


def _resume_plan(args, given: set, meta: dict, path: str, run: _Run) -> None:
    """The checkpoint's memory plan, restored as it was (its batch and model are in the
    run's configs; its save policies and budget come back from here). --memory-budget on a
    resume must be the run's own: a resumed run continues its run exactly, as with the
    other flags that would change it."""
    fmt = ta.memory.fmt_bytes
    if "memory_plan" not in meta:
        if "memory_budget" in given:
            _fail(f"cannot resume {path} with --memory-budget: its run was not planned (a "
                  "resumed run continues that run exactly); drop --memory-budget, or start "
                  "a new run with another --out")
        return
    try:
        plan = ta.memory.Plan.from_dict(json.loads(meta["memory_plan"]))
        budget = int(meta["memory_budget"])
    except (KeyError, TypeError, ValueError) as e:
        _fail(f"--resume: {path}: its memory_plan metadata cannot be read: {e}")
    if "memory_budget" in given and args.memory_budget != budget:
        _fail(f"cannot resume {path} with --memory-budget {fmt(args.memory_budget)}: its run "
              f"was planned for {fmt(budget)} (a resumed run continues that run exactly, "
              f"with the same plan); drop --memory-budget, or start a new run with another "
              "--out")
    run.plan = (plan, budget)


if __name__ == "__main__":
    try:
        main()
    except MemoryError as e:  # past the estimate above: one line, not NumPy's traceback
        _fail(f"out of memory: {str(e).splitlines()[0] if str(e) else 'MemoryError'}; "
              "lower --batch-size or --block-size")
