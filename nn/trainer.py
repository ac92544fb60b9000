"""Training a GPT: the loop behind examples/train_gpt.py, with exact checkpoint/resume.

A checkpoint is one safetensors file: the model's tensors ("model.*"), the optimizer's
state ("optim.*"), and JSON metadata with the GPT config, the training config, the
tokenizer, the step, the batch sampler's and the engine's RNG state. Resuming from it
continues the run exactly: N steps, or N/2 steps + resume + N/2 steps, give bit-identical
parameters on CPU. The learning-rate schedule is part of the run (its length is
`lr_decay_steps`, fixed when the run starts), so a resumed run follows the schedule the
checkpoint's run was on; what may change on resume is only what does not alter the
trajectory (RESUMABLE: the step total, logging, checkpointing, the device).

The run is kept: SIGINT (Ctrl-C) or SIGTERM during `run` finishes the step under way,
saves the checkpoint (when `out` is set) and raises Interrupted, which says where it went;
a second signal raises it at once, without saving. A save that fails (a full disk) raises
CheckpointError naming the file; the previous checkpoint stays whole. The checkpoint
records what identifies its text (nn.data.text_identity), so a resumed run accepts the
same text from anywhere and refuses a different one, saying what changed.

A step that fails before its update (ta.OutOfMemoryError under ta.memory.set_limit, say)
leaves nothing a retry depends on: gradients are set to None before each backward, and
the next train_step reuses the failed step's batch and RNG state, so it is the step a
clean run takes.

Data-parallel: launched on N processes (`mpiexec -n N`) with a ta.distributed process group
of N > 1 ranks, the trainer wraps the model in nn.parallel.DistributedDataParallel. The
batch size stays the global batch: every rank draws the same window starts (the sampler's
state is the same everywhere and independent of N) and trains on its N-th of the rows, so a
run on N ranks follows the one-process run with that batch, up to the order of float sums,
and resumes on another N. The logged loss is the mean over ranks; rank 0 alone logs, shows
the progress bar and writes the checkpoint (every rank calls save_checkpoint: it gathers
each rank's dropout RNG state, and a failed save raises CheckpointError on every rank).
Ranks > 0 draw dropout from seed + rank; a resume on the same N restores each rank's own
stream (exact), on another N a rank without a saved stream reseeds, so with dropout 0 a
resume on any N is exact and with dropout > 0 it is exact on the same N. A signal stops
every rank after the same step (one all-reduce of a stop flag per step).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import threading
import time

import tinygrad_attn as ta

from .data import BatchSampler, CharTokenizer, identity_changes, text_identity, train_val_split
from .gpt import GPT, GPTConfig
from .optim import configure_adamw
from .ranks import (
    broadcast_text,
    check_data_parallel,
    distributed,
    gather_text,
    mean_over_ranks,
    quiet,
    rank_seed,
    world,
)
from .runlock import LOCK, RunLock, RunLocked  # noqa: F401 - the trainer's names, as before
from .serialization import flatten_state, load, load_metadata, save, unflatten_state
from .utils import clip_grad_norm_, cosine_lr

CHECKPOINT = "ckpt.safetensors"
# Checkpoint metadata of a data-parallel run: every rank's RNG state (a JSON list, rank 0's
# first) and the number of ranks; absent from a one-process run's checkpoint
DISTRIBUTED_STATE = ("rng_by_rank", "world_size")


@dataclasses.dataclass
class TrainConfig:
    steps: int = 600
    batch_size: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    lr_decay_steps: int = 0  # the schedule's length (warmup included); 0: `steps`
    eval_every: int = 100
    eval_iters: int = 4
    seed: int = 1337
    device: str = "cpu"
    out: str | None = None
    save_every: int = 0  # 0: only at the end
    sample_tokens: int = 200
    progress: bool = True


# Checkpoint metadata a trainer needs to resume (a weights-only file from nn.save has none)
TRAINER_STATE = ("gpt_config", "train_config", "tokenizer", "step", "sampler", "rng",
                 "optim_layout")
# TrainConfig fields a resumed run may change: none of them alters the parameters it reaches
RESUMABLE = ("steps", "eval_every", "eval_iters", "device", "out", "save_every",
             "sample_tokens", "progress")


class ResumeConflict(ValueError):
    """Settings given for a resumed run that contradict the checkpoint's run;
    `conflicts` lists (field, given, checkpoint's value)."""

    def __init__(self, message: str, conflicts: list) -> None:
        super().__init__(message)
        self.conflicts = conflicts


class DataMismatch(ValueError):
    """The text given to resume a run is not the text the run trained on; `changes` lists
    how it differs (size, hash, characters added or removed)."""

    def __init__(self, message: str, changes: list) -> None:
        super().__init__(message)
        self.changes = changes


class CheckpointError(OSError):
    """A checkpoint could not be written (a full disk, a read-only directory); the message
    names the file and says whether a previous checkpoint there is still whole."""

    def __str__(self) -> str:
        return self.strerror


class Interrupted(KeyboardInterrupt):
    """Training stopped by a signal: `signum`, the `step` reached, and `path`, the
    checkpoint saved there (None when nothing was saved: no `out`, or a second signal that
    asked to stop at once). `exit_status` is what a shell reports for the signal."""

    def __init__(self, signum: int, step: int, path: str | None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.step, self.path = signum, step, path
        self.exit_status = 128 + signum


class _StopOnSignal:
    """While active (main thread only: Python delivers signals there), the first SIGINT
    or SIGTERM only sets `signum`, so the loop can finish its step and save; the second
    raises Interrupted at once. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.signum = None
        self.agreed = None  # data-parallel: the signal any rank had at the last agree()
        self.previous: dict = {}

    def stopping(self) -> bool:
        """Whether to stop now. On several ranks only what every rank agreed on counts: a
        rank that stopped alone would leave the others waiting in a collective."""
        if self.trainer.world_size == 1:
            return self.signum is not None
        return self.agreed is not None

    def agree(self) -> None:
        """Data-parallel: every rank learns whether any rank had a signal (one all-reduce
        MAX of the signal number; every rank calls this at the same point of a step)."""
        dist = distributed()
        flag = ta.tensor([self.signum or 0], dtype=ta.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.item()):  # `signum` stays this rank's own: a second one stops at once
            self.agreed = int(flag.item())

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise Interrupted(signum, self.trainer.step, None)
        self.signum = signum
        if self.trainer.rank != 0:  # rank 0 says it (mpiexec sends Ctrl-C to every rank)
            return
        cfg = self.trainer.tcfg
        step = self.trainer.step
        now = f"finishing step {step + 1}" if self.trainer._stepping else f"after step {step}"
        then = (f"then saving the checkpoint to {os.path.join(cfg.out, CHECKPOINT)}"
                if cfg.out else "then stopping (no out directory: nothing will be saved)")
        # os.write, not print: the handler may run in the middle of another print
        again = ("Ctrl-C again stops at once, without saving" if signum == signal.SIGINT
                 else "a second signal stops at once, without saving")
        os.write(2, f"\n{signal.Signals(signum).name}: {now}, {then}; {again}\n".encode())


class Trainer:
    """Model, optimizer, data and the loop; `run(until)` trains up to step `until`."""

    def __init__(self, gpt_config: GPTConfig, train_config: TrainConfig, text: str,
                 tokenizer: CharTokenizer | None = None, log=print) -> None:
        if not train_config.lr_decay_steps:  # fixed now: a resumed run keeps this schedule
            train_config = dataclasses.replace(train_config, lr_decay_steps=train_config.steps)
        self.world_size, self.rank = world()
        if self.world_size > 1:
            check_data_parallel(train_config, self.world_size)
        self.tcfg = train_config
        self.log = log if self.rank == 0 else quiet
        ta.manual_seed(train_config.seed)
        self.tokenizer = tokenizer or CharTokenizer(text)
        ids = ta.tensor(self.tokenizer.encode(text), dtype=ta.int64)
        # the data defines the vocabulary
        gpt_config = dataclasses.replace(gpt_config, vocab_size=self.tokenizer.vocab_size)
        self.gcfg = gpt_config
        self.model = GPT(gpt_config).to(train_config.device)
        self.optimizer = configure_adamw(self.model, train_config.weight_decay,
                                         train_config.lr)
        train_ids, val_ids = train_val_split(ids, 0.9)
        T, B, seed = gpt_config.block_size, train_config.batch_size, train_config.seed
        self.train_batches = BatchSampler(train_ids, T, B, seed=seed,
                                          device=train_config.device)
        self.val_ids = val_ids
        # the model each rank's forward and backward go through: the model itself on one
        # process, DistributedDataParallel around it on several (it broadcasts rank 0's
        # parameters and averages the gradients in backward). self.model stays the bare
        # model: checkpoints, evaluation and sampling use it.
        self.ddp = None
        if self.world_size > 1:
            from .parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(self.model)
            if self.rank:  # rank 0 keeps one process's dropout stream; the others their own
                ta.manual_seed(rank_seed(seed, self.rank))
        # what identifies the text (its hash, size, characters), recorded in the checkpoint
        self.data_identity = text_identity(text)
        self.step = 0
        self.history: list[dict] = []
        # strings saved in the checkpoint beside the trainer's state (the CLI records the
        # data file and its config file here)
        self.metadata: dict[str, str] = {}
        self._retry = None  # (batch, RNG state) of a step that failed before its update
        self._saved_step = None  # the step the last checkpoint holds
        self._stepping = False  # in train_step: a signal now is for the step under way

    # -- one step ----------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        cfg = self.tcfg
        return cosine_lr(step, cfg.lr, cfg.warmup, cfg.lr_decay_steps, cfg.min_lr)

    def forward_backward(self, x, y, stats=None):
        """The loss of batch (x, y), its gradients in each parameter's .grad.

        Gradients are set to None first: a previous step that failed in the middle of
        backward (out of memory, say) may have left some parameters with partial
        gradients, which this step's backward would otherwise add to.
        """
        self.optimizer.zero_grad(set_to_none=True)
        _, loss = (self.model if self.ddp is None else self.ddp)(x, y)
        if stats is not None:
            stats.mark_saved(loss)
        loss.backward()
        return loss

    def train_step(self) -> dict:
        self._stepping = True
        try:
            return self._train_step()
        finally:
            self._stepping = False

    def _train_step(self) -> dict:
        cfg = self.tcfg
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self._retry is not None:  # the step that failed last time, with its batch
            (x, y), rng_state = self._retry  # and the RNG state its dropout drew from
            self._retry = None
            ta.set_rng_state(rng_state)
        else:
            rng_state = ta.get_rng_state()
            x, y = self._rows_of_this_rank(*self.train_batches.sample())
        t0 = time.perf_counter()
        with ta.memory.step_stats(cfg.device) as stats:
            try:
                loss = self.forward_backward(x, y, stats)
            except BaseException:
                self.optimizer.zero_grad(set_to_none=True)
                self._retry = ((x, y), rng_state)
                raise
            if cfg.grad_clip:
                clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        self.step += 1
        loss_value = loss.item()
        if self.world_size > 1:  # the mean over the ranks' equal shares: the batch's loss
            loss_value = mean_over_ranks(loss_value)
        return {"step": self.step, "loss": loss_value, "lr": lr, "seconds": dt,
                "tokens_per_s": x.numel() * self.world_size / dt,
                "peak_bytes": stats.peak_bytes,
                "saved_bytes": stats.saved_bytes, "copied_bytes": stats.copied_bytes,
                "copies": stats.copies}

    def _rows_of_this_rank(self, x, y):
        """Rank r's share of the global batch: rows [r B/N, (r+1) B/N) (all on one process)."""
        if self.world_size == 1:
            return x, y
        share = self.tcfg.batch_size // self.world_size
        lo = self.rank * share
        return x[lo:lo + share], y[lo:lo + share]

    @ta.no_grad()
    def evaluate(self) -> float:
        """Mean loss over fixed validation windows (the same ones every time)."""
        self.model.eval()
        T, B = self.gcfg.block_size, self.tcfg.batch_size
        sampler = BatchSampler(self.val_ids, T, B, seed=0, device=self.tcfg.device)
        losses = [self.model(*sampler.sample())[1].item() for _ in range(self.tcfg.eval_iters)]
        self.model.train()
        return sum(losses) / len(losses)

    def unigram_entropy(self) -> float:
        """Entropy (nats) of the validation characters: the loss of a model that learned
        only character frequencies. A model that learned anything more goes below it."""
        counts: dict = {}
        for i in self.val_ids.tolist():
            counts[i] = counts.get(i, 0) + 1
        n = sum(counts.values())
        return -sum(c / n * math.log(c / n) for c in counts.values())

    # -- the loop ----------------------------------------------------------------------
    def run(self, until: int | None = None, memory_report: bool = True) -> list[dict]:
        """Train up to step `until` (default: `steps`), then save the checkpoint (with
        `out`). SIGINT / SIGTERM finish the step under way, save, and raise Interrupted."""
        cfg = self.tcfg
        until = cfg.steps if until is None else until
        bar = None
        if cfg.progress and self.rank == 0:
            from tqdm import tqdm

            bar = tqdm(total=until, initial=self.step, unit="step", dynamic_ncols=True)
        try:
            with _StopOnSignal(self) as stop:
                self._loop(until, memory_report, bar, stop)
                if bar is not None:
                    bar.close()
                    bar = None
                if cfg.out and self._saved_step != self.step:
                    self.save_checkpoint()
                if self.world_size > 1:  # a signal during the save: every rank stops
                    stop.agree()
                if stop.stopping():
                    signum = stop.signum if self.world_size == 1 else stop.agreed
                    raise Interrupted(signum, self.step,
                                      self.checkpoint_path() if cfg.out else None)
        finally:
            if bar is not None:
                bar.close()
        return self.history

    def _loop(self, until: int, memory_report: bool, bar, stop: _StopOnSignal) -> None:
        cfg = self.tcfg
        while self.step < until and not stop.stopping():
            if memory_report and self.step == 0 and self.rank == 0:
                with ta.memory.profile(raw=True) as prof:
                    rec = self.train_step()
                self.log(memory_summary(prof))
            else:
                rec = self.train_step()
            self.history.append(rec)
            if bar is not None:
                bar.set_postfix(loss=f"{rec['loss']:.3f}",
                                tok_s=f"{rec['tokens_per_s']:.0f}",
                                peak=f"{rec['peak_bytes'] / 2**20:.0f}MiB")
                bar.update(1)
            if self.world_size > 1:
                stop.agree()
            if stop.stopping():  # save now; evaluating can wait for the resume
                break
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == until):
                rec["val_loss"] = self.evaluate()
                self.log(_format(rec))
            if cfg.out and cfg.save_every and self.step % cfg.save_every == 0:
                self.save_checkpoint()

    def schedule_note(self) -> str | None:
        """A line saying which steps to `steps` train at the minimum learning rate because
        the run's schedule (`lr_decay_steps`, fixed when the run started) ends before;
        None when the schedule lasts the run."""
        cfg = self.tcfg
        if cfg.steps <= cfg.lr_decay_steps:
            return None
        first = max(self.step, cfg.lr_decay_steps) + 1
        steps = f"step {first}" if first == cfg.steps else f"steps {first} to {cfg.steps}"
        return (f"note: this run's learning-rate schedule ends at step {cfg.lr_decay_steps} "
                f"(lr_decay_steps, fixed when the run started); {steps} train at the "
                f"minimum rate {cfg.min_lr:g}")

    def sample(self, prompt: str = "\n", max_new_tokens: int | None = None,
               temperature: float = 0.8, top_k: int | None = 20) -> str:
        n = self.tcfg.sample_tokens if max_new_tokens is None else max_new_tokens
        ids = ta.tensor([self.tokenizer.encode(prompt)], dtype=ta.int64,
                        device=self.tcfg.device)
        out = self.model.generate(ids, n, temperature=temperature, top_k=top_k)
        return self.tokenizer.decode(out[0].tolist())

    # -- checkpoints -------------------------------------------------------------------
    def checkpoint_path(self) -> str:
        return os.path.join(self.tcfg.out, CHECKPOINT)

    def checkpoint_bytes(self) -> int:
        """About the size of this run's checkpoint once the optimizer has its state: the
        model's tensors and AdamW's two moments per parameter (the header aside)."""
        model = sum(t.nbytes for t in self.model.state_dict().values())
        return model + 2 * sum(p.nbytes for p in self.model.parameters())

    def save_checkpoint(self, path: str | None = None) -> str:
        """Write the checkpoint atomically and log its path and step. CheckpointError
        (an OSError) when it cannot be written; a previous file at `path` stays whole.

        Data-parallel: every rank calls it (it gathers every rank's RNG state); rank 0
        writes, and its outcome is broadcast, so a failed save raises on every rank."""
        path = path or self.checkpoint_path()
        if self.world_size == 1:
            self._write_checkpoint(path)
        else:
            rng_by_rank = [json.loads(s) for s in gather_text(json.dumps(ta.get_rng_state()))]
            error = None
            if self.rank == 0:
                try:
                    self._write_checkpoint(path, {
                        "rng_by_rank": json.dumps(rng_by_rank),
                        "world_size": str(self.world_size)})
                except BaseException as e:
                    error = e
            _share_outcome(error, self.step, path)
        self._saved_step = self.step
        self.log(f"checkpoint: step {self.step} saved to {path}")
        return path

    def _write_checkpoint(self, path: str, extra: dict | None = None) -> None:
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        optim_tensors, optim_layout = flatten_state(self.optimizer.state_dict(), "optim.")
        tensors.update(optim_tensors)
        meta = {
            "gpt_config": json.dumps(dataclasses.asdict(self.gcfg)),
            "train_config": json.dumps(dataclasses.asdict(self.tcfg)),
            "tokenizer": json.dumps(self.tokenizer.to_dict()),
            "step": str(self.step),
            "sampler": json.dumps(self.train_batches.state_dict()),
            "rng": json.dumps(ta.get_rng_state()),
            "optim_layout": optim_layout,
            "data_identity": json.dumps(self.data_identity),
            **(extra or {}),
        }
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            save(tensors, path, metadata={**self.metadata, **meta})
        except OSError as e:
            raise CheckpointError(e.errno, f"cannot save the checkpoint of step {self.step} "
                                  f"to {path}: {e.strerror or e}; {_previous(path)}") from e

    @classmethod
    def from_checkpoint(cls, path: str, text: str, log=print, model: dict | None = None,
                        **overrides) -> Trainer:
        """A trainer in exactly the state the checkpoint recorded (same config, step,
        weights, optimizer state, data position and RNG state).

        `overrides` are TrainConfig fields: those in RESUMABLE replace the checkpoint's;
        any other, and any GPTConfig field in `model`, must equal the checkpoint's value,
        else ResumeConflict lists each difference. A file without the trainer's state
        (from nn.save, say) raises ValueError saying so.
        """
        meta = load_metadata(path)
        gcfg, tcfg = checkpoint_configs(path, meta)
        conflicts = [(k, v, getattr(gcfg, k)) for k, v in (model or {}).items()
                     if k != "vocab_size" and v != getattr(gcfg, k)]
        conflicts += [(k, v, getattr(tcfg, k)) for k, v in overrides.items()
                      if k not in RESUMABLE and v != getattr(tcfg, k)]
        if conflicts:
            rows = "\n".join(f"  {k}: given {v!r}, checkpoint {c!r}" for k, v, c in conflicts)
            raise ResumeConflict(
                f"cannot resume {path!r} with settings that differ from its run (a resumed "
                f"run continues that run exactly):\n{rows}\nDrop these settings, or start "
                "a new run in another directory.", conflicts
            )
        tcfg = dataclasses.replace(tcfg, **overrides)
        check_data(path, meta, text)
        tokenizer = CharTokenizer.from_dict(json.loads(meta["tokenizer"]))
        unknown = set(text) - set(tokenizer.chars)
        if unknown:  # a checkpoint from before the data's identity was recorded
            raise DataMismatch(f"the text has characters that the vocabulary of {path!r} "
                               f"lacks: {_chars(unknown)}", [f"characters added: "
                                                             f"{_chars(unknown)}"])
        trainer = cls(gcfg, tcfg, text, tokenizer=tokenizer, log=log)
        trainer.metadata = {k: v for k, v in meta.items() if k not in TRAINER_STATE
                            and k != "data_identity" and k not in DISTRIBUTED_STATE}
        tensors = load(path, device=tcfg.device)
        model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        _check_tensors(path, trainer.gcfg, trainer.model, model_sd)
        trainer.model.load_state_dict(model_sd, strict=True)
        optim_sd = unflatten_state(tensors, meta["optim_layout"])
        try:
            trainer.optimizer.load_state_dict(optim_sd)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"{path!r}: its optimizer state does not fit its model: "
                             f"{e.args[0] if e.args else e}") from None
        trainer.train_batches.load_state_dict(json.loads(meta["sampler"]))
        ta.set_rng_state(json.loads(meta["rng"]))  # rank 0's, on any number of ranks
        trainer.step = int(meta["step"])
        if trainer.rank:  # its own stream if the run had this rank, else a fresh one
            saved = json.loads(meta.get("rng_by_rank", "[]"))
            if trainer.rank < len(saved):
                ta.set_rng_state(saved[trainer.rank])
            else:
                ta.manual_seed(rank_seed(tcfg.seed, trainer.rank, trainer.step))
        if tcfg.out and os.path.abspath(trainer.checkpoint_path()) == os.path.abspath(path):
            trainer._saved_step = trainer.step  # its out holds this step already
        return trainer


# -- data-parallel helpers ---------------------------------------------------------------
def _share_outcome(error: BaseException | None, step: int, path: str) -> None:
    """After rank 0 tried to save: every rank learns whether it failed. Rank 0 raises its
    own error; the others a CheckpointError with rank 0's message."""
    dist = distributed()
    code = ta.tensor([0 if error is None else 1, getattr(error, "errno", None) or 0],
                     dtype=ta.int64)
    dist.broadcast(code, src=0)
    failed, errno = code.tolist()
    if not failed:
        return
    message = broadcast_text(str(error) if error is not None else "")
    if error is not None:
        raise error
    raise CheckpointError(errno or None, message or f"rank 0 could not save the checkpoint "
                                                    f"of step {step} to {path}")


def check_data(path: str, meta: dict, text: str) -> None:
    """DataMismatch unless `text` is the text the checkpoint at `path` (its metadata
    `meta`) recorded; a checkpoint from before the identity was recorded passes."""
    if "data_identity" not in meta:
        return
    recorded = json.loads(meta["data_identity"])
    changes = identity_changes(recorded, text)
    if changes:
        raise DataMismatch(f"the text is not the one the run of {path!r} trained on: "
                           f"{'; '.join(changes)}", changes)


def _chars(chars: set) -> str:
    return ", ".join(repr(c) for c in sorted(chars))


def _previous(path: str) -> str:
    """What a failed save left at `path`, for its message."""
    try:
        return f"the previous checkpoint there (step {load_metadata(path)['step']}) is whole"
    except (OSError, ValueError, KeyError):
        return "no checkpoint was written"


def _check_tensors(path: str, gcfg: GPTConfig, model: GPT, tensors: dict) -> None:
    """ValueError, one line naming each tensor whose name or shape is not what the
    checkpoint's own config builds (a hand-edited or mismatched config), before
    load_state_dict would raise from deep inside."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    problems = [f"model.{k} is {got[k]} in the file but {shape} for the config"
                for k, shape in expected.items() if k in got and got[k] != shape]
    problems += [f"model.{k} is missing" for k in expected if k not in got]
    problems += [f"model.{k} is not in the model the config builds" for k in got
                 if k not in expected]
    if problems:
        shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)"
                                           if len(problems) > 3 else "")
        config = ", ".join(f"{k}={getattr(gcfg, k)}" for k in (
            "vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd"))
        raise ValueError(f"{path!r}: its tensors do not match its recorded gpt_config "
                         f"({config}): {shown}")


def checkpoint_configs(path: str, meta: dict | None = None) -> tuple[GPTConfig, TrainConfig]:
    """The GPT and training configs a trainer's checkpoint recorded.

    ValueError, naming the file, for a file without them (nn.save of a bare state_dict)."""
    meta = load_metadata(path) if meta is None else meta
    missing = [k for k in TRAINER_STATE if k not in meta]
    if missing:
        raise ValueError(
            f"{path!r} has no trainer state (no {', '.join(missing)} in its metadata): it is "
            "not a checkpoint written by the trainer (nn.save of a state_dict writes weights "
            "only). To start from its weights, load them into a model with "
            "model.load_state_dict(nn.load(path))."
        )
    try:
        gcfg = GPTConfig(**json.loads(meta["gpt_config"]))
        saved = json.loads(meta["train_config"])
        if not saved.get("lr_decay_steps"):  # written before the field: steps was the length
            saved["lr_decay_steps"] = saved["steps"]
        tcfg = TrainConfig(**saved)
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"{path!r}: its gpt_config / train_config metadata cannot be "
                         f"read: {e}") from None
    return gcfg, tcfg


def load_model(path: str, device: str = "cpu") -> tuple[GPT, CharTokenizer, dict]:
    """(the GPT, its tokenizer, the metadata) of a trainer's checkpoint, in eval mode:
    enough to sample from it without the training data or the optimizer."""
    meta = load_metadata(path)
    for key in ("gpt_config", "tokenizer"):
        if key not in meta:
            raise ValueError(f"{path!r} has no {key} in its metadata: it is not a checkpoint "
                             "written by the trainer (nn.save of a state_dict writes weights "
                             "only)")
    gcfg = GPTConfig(**json.loads(meta["gpt_config"]))
    tokenizer = CharTokenizer.from_dict(json.loads(meta["tokenizer"]))
    model = GPT(gcfg)
    tensors = load(path)
    model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    _check_tensors(path, gcfg, model, model_sd)
    model.load_state_dict(model_sd, strict=True)
    return model.to(device).eval(), tokenizer, meta


def _format(rec: dict) -> str:
    val = f" val {rec['val_loss']:.4f}" if "val_loss" in rec else ""
    return (f"step {rec['step']:5d} | loss {rec['loss']:.4f}{val} | lr {rec['lr']:.2e} | "
            f"{rec['seconds'] * 1e3:7.1f} ms {rec['tokens_per_s']:8.0f} tok/s | peak "
            f"{rec['peak_bytes'] / 2**20:7.1f} MiB saved {rec['saved_bytes'] / 2**20:6.1f} "
            f"MiB copied {rec['copied_bytes'] / 2**20:5.2f} MiB ({rec['copies']} copies)")


def memory_summary(prof, top: int = 6) -> str:
    """One screen from the ledger: the peak, bytes by category, who saves what, copies."""
    s = prof.summary()
    pk = s["peak"]
    mib = 2**20
    lines = [f"memory of the first step: peak {pk['bytes'] / mib:.1f} MiB during "
             f"{pk['phase']} ({pk['op']}{', ' + pk['scope'] if pk['scope'] else ''}); raw "
             f"peak above start {(s['raw_peak_bytes'] or 0) / mib:.1f} MiB"]
    lines.append("  at peak: " + ", ".join(
        f"{c} {b / mib:.1f}" for c, b in sorted(pk["by_category"].items(), key=lambda x: -x[1])
        if b) + " MiB")
    sv = s["saved_peak"]
    lines.append(f"  saved for backward: {sv['unique_bytes_without_parameters'] / mib:.1f} MiB "
                 f"of activations ({sv['unique_bytes'] / mib:.1f} MiB with the parameters "
                 "nodes keep); by op, unique bytes:")
    for op, row in sorted(sv["by_op"].items(), key=lambda kv: -kv[1]["unique_bytes"])[:top]:
        lines.append(f"    {op:<28}{row['unique_bytes'] / mib:8.2f} MiB in {row['nodes']} nodes")
    copies = s["copies"]
    by_reason: dict = {}
    for c in copies:
        key = (c["reason"], c["op"])
        by_reason[key] = by_reason.get(key, 0) + c["bytes"]
    lines.append(f"  copies: {len(copies)}, {sum(c['bytes'] for c in copies) / mib:.2f} MiB")
    for (reason, op), b in sorted(by_reason.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"    {reason:<16}{op or '-':<24}{b / mib:8.2f} MiB")
    return "\n".join(lines)
