"""Training a GPT: the loop behind examples/train_gpt.py, with exact checkpoint/resume.

A checkpoint is one safetensors file: the model's tensors ("model.*"), the optimizer's
state ("optim.*"), and JSON metadata with the GPT config, the training config, the
tokenizer, the step, the batch sampler's and the engine's RNG state. Resuming from it
continues the run exactly: N steps, or N/2 steps + resume + N/2 steps, give bit-identical
parameters on CPU. The learning-rate schedule is part of the run (its length is
`lr_decay_steps`, fixed when the run starts), so a resumed run follows the schedule the
checkpoint's run was on; what may change on resume is only what does not alter the
trajectory (RESUMABLE: the step total, logging, checkpointing, the device).

A step that fails before its update (ta.OutOfMemoryError under ta.memory.set_limit, say)
leaves nothing a retry depends on: gradients are set to None before each backward, and
the next train_step reuses the failed step's batch and RNG state, so it is the step a
clean run takes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import tinygrad_attn as ta

from .data import BatchSampler, CharTokenizer, train_val_split
from .gpt import GPT, GPTConfig
from .optim import configure_adamw
from .serialization import flatten_state, load, load_metadata, save, unflatten_state
from .utils import clip_grad_norm_, cosine_lr

CHECKPOINT = "ckpt.safetensors"


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


class Trainer:
    """Model, optimizer, data and the loop; `run(until)` trains up to step `until`."""

    def __init__(self, gpt_config: GPTConfig, train_config: TrainConfig, text: str,
                 tokenizer: CharTokenizer | None = None, log=print) -> None:
        if not train_config.lr_decay_steps:  # fixed now: a resumed run keeps this schedule
            train_config = dataclasses.replace(train_config, lr_decay_steps=train_config.steps)
        self.tcfg = train_config
        self.log = log
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
        self.step = 0
        self.history: list[dict] = []
        # strings saved in the checkpoint beside the trainer's state (the CLI records the
        # data file and its config file here)
        self.metadata: dict[str, str] = {}
        self._retry = None  # (batch, RNG state) of a step that failed before its update

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
        _, loss = self.model(x, y)
        if stats is not None:
            stats.mark_saved(loss)
        loss.backward()
        return loss

    def train_step(self) -> dict:
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
            x, y = self.train_batches.sample()
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
        return {"step": self.step, "loss": loss.item(), "lr": lr, "seconds": dt,
                "tokens_per_s": x.numel() / dt, "peak_bytes": stats.peak_bytes,
                "saved_bytes": stats.saved_bytes, "copied_bytes": stats.copied_bytes,
                "copies": stats.copies}

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
        cfg = self.tcfg
        until = cfg.steps if until is None else until
        bar = None
        if cfg.progress:
            from tqdm import tqdm

            bar = tqdm(total=until, initial=self.step, unit="step", dynamic_ncols=True)
        while self.step < until:
            if memory_report and self.step == 0:
                with ta.memory.profile(raw=True) as prof:
                    rec = self.train_step()
                self.log(memory_summary(prof))
            else:
                rec = self.train_step()
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == until):
                rec["val_loss"] = self.evaluate()
                self.log(_format(rec))
            self.history.append(rec)
            if bar is not None:
                bar.set_postfix(loss=f"{rec['loss']:.3f}",
                                tok_s=f"{rec['tokens_per_s']:.0f}",
                                peak=f"{rec['peak_bytes'] / 2**20:.0f}MiB")
                bar.update(1)
            if cfg.out and cfg.save_every and self.step % cfg.save_every == 0:
                self.save_checkpoint()
        if bar is not None:
            bar.close()
        if cfg.out:
            self.save_checkpoint()
        return self.history

    def sample(self, prompt: str = "\n", max_new_tokens: int | None = None,
               temperature: float = 0.8, top_k: int | None = 20) -> str:
        n = self.tcfg.sample_tokens if max_new_tokens is None else max_new_tokens
        ids = ta.tensor([self.tokenizer.encode(prompt)], dtype=ta.int64,
                        device=self.tcfg.device)
        out = self.model.generate(ids, n, temperature=temperature, top_k=top_k)
        return self.tokenizer.decode(out[0].tolist())

    # -- checkpoints -------------------------------------------------------------------
    def save_checkpoint(self, path: str | None = None) -> str:
        path = path or os.path.join(self.tcfg.out, CHECKPOINT)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
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
        }
        save(tensors, path, metadata={**self.metadata, **meta})
        return path

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
        tokenizer = CharTokenizer.from_dict(json.loads(meta["tokenizer"]))
        trainer = cls(gcfg, tcfg, text, tokenizer=tokenizer, log=log)
        trainer.metadata = {k: v for k, v in meta.items() if k not in TRAINER_STATE}
        tensors = load(path, device=tcfg.device)
        model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        trainer.model.load_state_dict(model_sd, strict=True)
        optim_sd = unflatten_state(tensors, meta["optim_layout"])
        trainer.optimizer.load_state_dict(optim_sd)
        trainer.train_batches.load_state_dict(json.loads(meta["sampler"]))
        ta.set_rng_state(json.loads(meta["rng"]))
        trainer.step = int(meta["step"])
        return trainer


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
    model.load_state_dict({k[len("model."):]: v for k, v in tensors.items()
                           if k.startswith("model.")}, strict=True)
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
