"""A small character-level GPT written for PyTorch, to run on this engine unmodified.

    python examples/pytorch_gpt.py                                        # with PyTorch
    python -m tinygrad_attn.compat --memory-report examples/pytorch_gpt.py   # on tinygrad_attn

Nothing in this file names tinygrad_attn: under the compat runner `import torch` is the
engine, and `--memory-report` prints where every byte of this model's training went.
"""
import argparse

parser = argparse.ArgumentParser(description="train a tiny GPT on this file's own text")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--block-size", type=int, default=32)
parser.add_argument("--n-embd", type=int, default=64)
parser.add_argument("--n-head", type=int, default=4)
parser.add_argument("--n-layer", type=int, default=2)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()  # before importing torch, so that --help is instant

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.manual_seed(args.seed)
with open(__file__, encoding="utf-8") as f:
    text = f.read()
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, args.n_embd)
        self.pos = nn.Embedding(args.block_size, args.n_embd)
        self.blocks = nn.Sequential(*[Block(args.n_embd, args.n_head)
                                      for _ in range(args.n_layer)])
        self.ln_f = nn.LayerNorm(args.n_embd)
        self.head = nn.Linear(args.n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.ln_f(self.blocks(x)))  # (B, T, vocab)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


model = GPT(len(chars))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")
for step in range(args.steps):
    ix = torch.randint(len(data) - args.block_size - 1, (args.batch_size,))
    x = torch.stack([data[i:i + args.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + args.block_size] for i in ix])
    loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 10 == 0 or step == args.steps - 1:
        print(f"step {step:3d}  loss {loss.item():.4f}")
