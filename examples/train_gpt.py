"""Train a small character-level GPT: the project's main job.

    python examples/train_gpt.py                       # the embedded corpus, CPU, ~2 min
    python examples/train_gpt.py --data input.txt --steps 2000 --out runs/a
    python examples/train_gpt.py --out runs/a --resume --steps 600   # continue exactly

The default corpus needs no download: it is built from a fixed list of the standard
library's own source files. The log shows, beside the loss, each step's memory from the
ledger: the peak, the bytes saved for backward, and the bytes copied.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import nn
from nn.data import default_corpus, load_text
from nn.trainer import CHECKPOINT, TrainConfig, Trainer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a text file (default: the embedded stdlib corpus)")
    g = p.add_argument_group("model (GPTConfig)")
    defaults = nn.GPTConfig(block_size=64, n_layer=4, n_head=4, n_embd=128)
    for field in dataclasses.fields(nn.GPTConfig):
        if field.name == "vocab_size":  # set by the data's tokenizer
            continue
        value = getattr(defaults, field.name)
        kind = type(value) if value is not None else str
        if kind is bool:
            g.add_argument(f"--{field.name.replace('_', '-')}", type=_bool, default=value,
                           metavar="BOOL")
        else:
            g.add_argument(f"--{field.name.replace('_', '-')}", type=kind, default=value)
    t = p.add_argument_group("training")
    tdefaults = TrainConfig()
    for field in dataclasses.fields(TrainConfig):
        if field.name in ("out", "progress"):
            continue
        value = getattr(tdefaults, field.name)
        t.add_argument(f"--{field.name.replace('_', '-')}", type=type(value), default=value)
    t.add_argument("--out", help="directory for checkpoints (ckpt.safetensors)")
    t.add_argument("--resume", action="store_true", help="continue from --out's checkpoint")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def main(argv=None) -> Trainer:
    args = parse_args(argv)
    text = load_text(args.data) if args.data else default_corpus()
    tcfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                          if f.name not in ("progress",)},
                       progress=not args.no_progress)
    if args.resume:
        if not args.out:
            raise SystemExit("--resume needs --out DIR (where the checkpoint is)")
        path = os.path.join(args.out, CHECKPOINT)
        trainer = Trainer.from_checkpoint(path, text, steps=args.steps,
                                          progress=not args.no_progress)
        print(f"resumed from {path} at step {trainer.step}")
    else:
        gcfg = nn.GPTConfig(**{f.name: getattr(args, f.name)
                               for f in dataclasses.fields(nn.GPTConfig)
                               if f.name != "vocab_size"})
        trainer = Trainer(gcfg, tcfg, text)
    model = trainer.model
    print(f"corpus: {len(text):,} characters, vocabulary {trainer.tokenizer.vocab_size}; "
          f"model: {model.num_params():,} parameters, {trainer.gcfg}")
    print(f"unigram entropy of the validation text: {trainer.unigram_entropy():.3f} nats")
    trainer.run()
    val = trainer.evaluate()
    print(f"final validation loss {val:.4f} nats "
          f"(unigram entropy {trainer.unigram_entropy():.3f})")
    print("sample:\n" + trainer.sample())
    return trainer


if __name__ == "__main__":
    main()
