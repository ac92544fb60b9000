"""Train a small GPT the way larger training scripts do: parameter groups with and without
weight decay, gradient accumulation, gradient clipping, a cosine learning-rate schedule with
warmup, and checkpoints that a later run resumes from.

    python gpt_trainer.py --out-dir out --max-iters 200
    python gpt_trainer.py --out-dir out --max-iters 400 --init-from resume
"""
import argparse
import inspect
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 96
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
            is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():  # scaled init of the residual projections
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (t,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # (b, t, vocab_size)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        print(f"decayed tensors: {len(decay_params)}, "
              f"{sum(p.numel() for p in decay_params):,} parameters; "
              f"non-decayed tensors: {len(nodecay_params)}, "
              f"{sum(p.numel() for p in nodecay_params):,} parameters")
        fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
        extra_args = dict(fused=True) if fused_available and device_type == "cuda" else dict()
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)


parser = argparse.ArgumentParser(description="a small GPT trainer with checkpoints")
parser.add_argument("--out-dir", default="out")
parser.add_argument("--init-from", choices=["scratch", "resume"], default="scratch")
parser.add_argument("--init-weights", help="scratch: load this state dict (safetensors)")
parser.add_argument("--save-init", help="write the initial state dict here (safetensors)")
parser.add_argument("--max-iters", type=int, default=200)
parser.add_argument("--ckpt-every", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--grad-accum", type=int, default=2)
parser.add_argument("--learning-rate", type=float, default=6e-3)
parser.add_argument("--min-lr", type=float, default=6e-4)
parser.add_argument("--warmup-iters", type=int, default=5)
parser.add_argument("--lr-decay-iters", type=int, default=40)
parser.add_argument("--weight-decay", type=float, default=0.1)
parser.add_argument("--grad-clip", type=float, default=1.0)
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
parser.add_argument("--device", default="cpu")
parser.add_argument("--compile", action="store_true")
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--fixed-batches", action="store_true",
                    help="batch i is a fixed function of i (no random offsets)")
args = parser.parse_args()

os.makedirs(args.out_dir, exist_ok=True)
torch.manual_seed(args.seed)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.set_default_dtype(getattr(torch, args.dtype))
device = args.device
device_type = "cuda" if "cuda" in device else "cpu"
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type)

# the data: the bytes of this file, as token ids below 96 (printable ASCII and newline)
with open(__file__, encoding="utf-8") as f:
    data = torch.tensor([min(max(ord(c) - 31, 0), 95) for c in f.read()], dtype=torch.long)
config = GPTConfig(dropout=args.dropout)


def get_batch(it):
    T = config.block_size
    if args.fixed_batches:
        ix = (torch.arange(args.batch_size) * 389 + it * 53) % (len(data) - T)
    else:
        ix = torch.randint(len(data) - T, (args.batch_size,))
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
    return x.to(device), y.to(device)


def get_lr(it):
    if it < args.warmup_iters:  # linear warmup
        return args.learning_rate * (it + 1) / (args.warmup_iters + 1)
    if it > args.lr_decay_iters:
        return args.min_lr
    decay_ratio = (it - args.warmup_iters) / (args.lr_decay_iters - args.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # from 1 to 0
    return args.min_lr + coeff * (args.learning_rate - args.min_lr)


iter_num = 0
ckpt_path = os.path.join(args.out_dir, "ckpt.pt")
if args.init_from == "scratch":
    model = GPT(config)
    if args.save_init:
        from safetensors.numpy import save_file
        save_file({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()},
                  args.save_init)
    if args.init_weights:
        from safetensors.numpy import load_file
        model.load_state_dict({k: torch.from_numpy(v) for k, v in
                               load_file(args.init_weights).items()})
else:
    checkpoint = torch.load(ckpt_path, map_location=device)
    config = GPTConfig(**checkpoint["model_args"])
    model = GPT(config)
    model.load_state_dict(checkpoint["model"])
    iter_num = checkpoint["iter_num"]
    print(f"resuming from iteration {iter_num} (config {checkpoint['config']})")
model.to(device)

scaler = torch.amp.GradScaler(device_type, enabled=False)
optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (0.9, 0.95),
                                       device_type)
if args.init_from == "resume":
    optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None
if args.compile:
    model = torch.compile(model)


def save_checkpoint():
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_args": asdict(config),
        "iter_num": iter_num,
        "config": vars(args),
    }
    print(f"saving checkpoint to {args.out_dir}")
    torch.save(checkpoint, ckpt_path)


X, Y = get_batch(iter_num * args.grad_accum)
t0 = time.time()
while iter_num < args.max_iters:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for micro_step in range(args.grad_accum):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / args.grad_accum
        X, Y = get_batch(iter_num * args.grad_accum + micro_step + 1)
        scaler.scale(loss).backward()
    if args.grad_clip != 0.0:
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    lossf = loss.item() * args.grad_accum
    dt, t0 = time.time() - t0, time.time()
    print(f"iter {iter_num} loss {lossf:.12e} lr {lr:.6e} norm {norm.item():.6e} "
          f"time {dt * 1000:.1f}ms")
    iter_num += 1
    if iter_num % args.ckpt_every == 0 or iter_num == args.max_iters:
        save_checkpoint()
