"""A GPT's memory knobs and training step, for ta.memory.plan.

    config = nn.GPTConfig(n_layer=4, n_embd=128, block_size=64)
    step = gpt_step(config)
    plan = ta.memory.plan(step, "6GiB", batch=64, knobs=gpt_knobs(config),
                          time_knobs=TIME_KNOBS, repeats=3)
    config, policies = apply(plan, config)
    model = nn.GPT(config)
    with policies:              # the plan's save policies, for as long as training runs
        ...train at plan.batch...

The knobs (each option JSON-able, the first the default):

    attn        the attention implementation ("views", "flash" by default)
    policy      "save" or "recompute": gelu's and layer_norm's save policies together
                (ta.memory.save_policies)
    checkpoint  which blocks are recomputed in backward: k of the n_layer blocks, for k = 0
                to n_layer, as a list of block indices (GPTConfig.checkpoint takes it)

apply() returns a config rather than changing a model: the attention implementation is
fixed when a GPT is built (its buffers differ), while the parameters are the same under
every choice, so a model built from the new config loads the old one's state_dict.
"""

from __future__ import annotations

import dataclasses
import time

import tinygrad_attn as ta

from .gpt import ATTENTION, GPT, GPTConfig
from .optim import AdamW

KNOBS = ("attn", "policy", "checkpoint")
POLICIES = ("save", "recompute")
# The knob that changes the step's work (ta.memory.plan's time_knobs): policy and checkpoint
# only trade memory for recomputed ops, so a setting of them costs the timed attention's step
# plus those ops' own seconds, which the planner reads with an op recorder.
TIME_KNOBS = ("attn",)


def config_for(config: GPTConfig, choice: dict) -> GPTConfig:
    """`config` with the choice's attention and checkpointed blocks (knobs absent from the
    choice keep the config's value)."""
    unknown = set(choice) - set(KNOBS)
    if unknown:
        raise ValueError(f"unknown GPT memory knobs {sorted(unknown)}; expected {KNOBS}")
    changes = {}
    if "attn" in choice:
        changes["attn"] = choice["attn"]
    if "checkpoint" in choice:
        blocks = choice["checkpoint"]
        changes["checkpoint"] = blocks if isinstance(blocks, bool) else tuple(blocks)
    return dataclasses.replace(config, **changes)


def policies_for(choice: dict):
    """The context manager that sets the choice's save policies (gelu and layer_norm)."""
    mode = choice.get("policy", "save")
    if mode not in POLICIES:
        raise ValueError(f"unknown policy {mode!r}; expected one of {POLICIES}")
    return ta.memory.save_policies(gelu=mode, layer_norm=mode)


def apply(plan, model_or_config):
    """(the config for the plan, a context manager setting its save policies).

    `plan` is a ta.memory.Plan (or its choice dict); `model_or_config` a GPTConfig or a
    GPT (its config is used). Build the model from the returned config and train inside
    the context manager."""
    choice = plan if isinstance(plan, dict) else plan.choice
    config = model_or_config.config if isinstance(model_or_config, GPT) else model_or_config
    if not isinstance(config, GPTConfig):
        raise TypeError(f"apply: expected a GPTConfig or a GPT, got "
                        f"{type(model_or_config).__name__}")
    return config_for(config, choice), policies_for(choice)


def prime_adamw(opt: AdamW) -> None:
    """Make AdamW's state (zeros, step 0) now, before the forward, as it is at every step
    after the first: the steady-state peak holds it through backward, while a first step
    makes it only in opt.step(), after the activations are gone. Step 0 leaves the first
    update exactly what it would have been."""
    for group in opt.param_groups:
        for p in group["params"]:
            if opt.state[p]:
                continue
            state = {"step": 0, "exp_avg": ta.zeros_like(p), "exp_avg_sq": ta.zeros_like(p)}
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = ta.zeros_like(p)
            for name, buf in state.items():
                if name != "step":
                    ta.memory.tag(buf, "optimizer_state")
            opt.state[p] = state


def gpt_step(config: GPTConfig, seed: int = 0, lr: float = 3e-4, dtype=None,
             after_backward=None):
    """step_fn(batch, choice) for ta.memory.plan: builds a GPT of config_for(config,
    choice) (seed `seed`: the same weights under every choice), AdamW with its state made
    up front (prime_adamw: the steady state), a random token batch of `batch` rows, and runs
    one step under the choice's save policies: forward, backward, AdamW step, zero_grad.
    Returns the seconds of that step proper (time.perf_counter around forward, backward
    and the optimizer, after the model and batch are built), which ta.memory.plan takes as
    the step's time; the loss of the last call is the step's `.loss`. `dtype` casts the
    model (ta.float64 for exact comparisons);
    `after_backward(model)`, if given, is called between backward and the optimizer step
    (to read the gradients)."""

    def step(batch: int, choice: dict) -> float:
        cfg = config_for(config, choice)
        with policies_for(choice):
            ta.manual_seed(seed)
            model = GPT(cfg)
            if dtype is not None:
                model.to(dtype)
            opt = AdamW(model.parameters(), lr=lr)
            prime_adamw(opt)
            idx = ta.randint(0, cfg.vocab_size, (batch, cfg.block_size))
            targets = ta.randint(0, cfg.vocab_size, (batch, cfg.block_size))
            t0 = time.perf_counter()
            _, loss = model(idx, targets)
            loss.backward()
            if after_backward is not None:
                after_backward(model)
            opt.step()
            opt.zero_grad()
            step.loss = loss.item()  # (a GPU's queue is done once the loss is read)
            seconds = time.perf_counter() - t0
            return seconds

    step.loss = None
    return step


def block_saved_bytes(config: GPTConfig, choice: dict | None = None, batch: int = 1,
                      seed: int = 0) -> list:
    """Bytes saved for backward by each block (the ledger's by-module table at the saved
    peak, modules transformer.h.i and below), one step at `batch` with `choice`."""
    step = gpt_step(config, seed=seed)
    step(batch, choice or {})  # warm-up: first-call caches
    with ta.memory.profile() as prof:
        step(batch, choice or {})
    by_module = prof.summary()["saved_peak"]["by_module"]
    out = []
    for i in range(config.n_layer):
        name = f"transformer.h.{i}"
        out.append(sum(row["unique_bytes"] for scope, row in by_module.items()
                       if scope == name or scope.startswith(name + ".")))
    return out


def gpt_knobs(config: GPTConfig, attention=("views", "flash"), seed: int = 0) -> dict:
    """The knobs of a GPT step for ta.memory.plan: attn, policy, checkpoint (module
    docstring). The k blocks checkpointed are the k whose saved bytes (measured once, at
    batch 1 with the default choice) are largest, ties to the earliest block: an early
    block's saved tensors live longest (from its forward to the end of backward), and its
    recompute comes last in backward, when the later blocks' saved tensors are already
    freed; a late block's recompute would run while every earlier block still holds its
    own, which leaves the peak where it was."""
    attention = list(attention)
    if not attention:
        raise ValueError("gpt_knobs: attention needs at least one implementation")
    for a in attention:
        if a not in ATTENTION:
            raise ValueError(f"gpt_knobs: unknown attention {a!r}; expected one of "
                             f"{ATTENTION}")
    default = {"attn": attention[0], "policy": "save", "checkpoint": []}
    saved = block_saved_bytes(config, default, seed=seed)
    order = sorted(range(config.n_layer), key=lambda i: (-saved[i], i))
    return {"attn": attention, "policy": list(POLICIES),
            "checkpoint": [sorted(order[:k]) for k in range(config.n_layer + 1)]}
