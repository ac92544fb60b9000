"""Sample text from a GPT that examples/train_gpt.py saved, without training it.

    python examples/sample.py --ckpt runs/a                         # 200 characters
    python examples/sample.py --ckpt runs/a --start "def " --tokens 500 --temperature 0.6
    python examples/sample.py --ckpt runs/a/ckpt.safetensors --top-k 0 --seed 7

The checkpoint carries the model's config and its tokenizer, so no data is needed. The
same checkpoint, start and seed give the same text. train_gpt.py names its directory at
the start and at each save (without --out, a new runs/DATE-TIME), and ends with the
command that samples from it. A checkpoint whose tensors disagree with its recorded config
stops with one line naming the tensors and shapes.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import tinygrad_attn as ta
from nn.trainer import CHECKPOINT, load_model


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _int(lo: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {value}")
        return value

    return parse


def _device(text: str) -> str:
    if text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"invalid device {text!r}: use cpu, cuda, or cuda:N "
                                     "for GPU number N (cuda:0, cuda:1, ...)")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown after each flag's help, but not the required --ckpt's "None"."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sample.py", description=__doc__.split("\n")[0],
                                formatter_class=_HelpFormatter)
    p.add_argument("--ckpt", required=True, metavar="DIR_OR_FILE",
                   help=f"a train_gpt.py --out directory (its {CHECKPOINT}) or the file itself")
    p.add_argument("--start", default="\n",
                   help="the text the sample continues (default: %(default)r)")
    p.add_argument("--tokens", type=_int(0), default=200, help="characters to sample")
    p.add_argument("--temperature", type=_positive_float, default=0.8,
                   help="divides the logits: below 1 sharper, above 1 flatter")
    p.add_argument("--top-k", type=_int(0), default=20,
                   help="sample among the k likeliest characters only (0: all of them)")
    p.add_argument("--seed", type=_int(0), default=1337, help="seed of the sampling")
    p.add_argument("--device", type=_device, default="cpu", help="cpu, cuda or cuda:N")
    return p


def _fail(message: str) -> None:
    print(f"sample.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv=None) -> str:
    args = build_parser().parse_args(argv)
    path = os.path.join(args.ckpt, CHECKPOINT) if os.path.isdir(args.ckpt) else args.ckpt
    if args.device != "cpu" and not ta.cuda.is_available():
        _fail(f"--device {args.device}: no CUDA GPU here (CuPy missing or no device); "
              "use --device cpu")
    try:
        model, tokenizer, meta = load_model(path, device=args.device)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    if not args.start:
        _fail("--start must hold at least one character")
    unknown = sorted(set(args.start) - set(tokenizer.chars))
    if unknown:
        _fail(f"--start has characters the model's vocabulary lacks: {unknown!r}; its "
              f"vocabulary is {''.join(tokenizer.chars)!r}")
    ta.manual_seed(args.seed)
    idx = ta.tensor([tokenizer.encode(args.start)], dtype=ta.int64, device=args.device)
    out = model.generate(idx, args.tokens, temperature=args.temperature,
                         top_k=args.top_k or None)
    text = tokenizer.decode(out[0].tolist())
    print(text)
    return text


if __name__ == "__main__":
    try:
        main()
    except MemoryError as e:  # one line, not NumPy's traceback
        _fail(f"out of memory: {e}")
