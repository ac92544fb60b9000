"""A character-level language model, from a bigram table to a small GPT.

    python char_gpt.py --model gpt --steps 200
    python char_gpt.py --model bigram --steps 500 --generate 300

Trains on a text file (by default this script's own source), prints the training loss and
an estimate of train/val loss, then samples from the model.
"""
import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

parser = argparse.ArgumentParser(description="character-level bigram / GPT")
parser.add_argument("--model", choices=["bigram", "gpt"], default="gpt")
parser.add_argument("--data", default=__file__, help="a text file to train on")
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--block-size", type=int, default=16)
parser.add_argument("--n-embd", type=int, default=32)
parser.add_argument("--n-head", type=int, default=4)
parser.add_argument("--n-layer", type=int, default=2)
parser.add_argument("--dropout", type=float, default=0.1)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--eval-every", type=int, default=100)
parser.add_argument("--eval-iters", type=int, default=10)
parser.add_argument("--generate", type=int, default=100, help="characters to sample at the end")
parser.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
parser.add_argument("--fixed-batches", action="store_true",
                    help="batch i is a fixed function of i (no random offsets)")
parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
parser.add_argument("--device", default="cpu")
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--init-weights", help="start from this state dict (a safetensors file)")
parser.add_argument("--save-init", help="write the initial state dict here (safetensors)")
args = parser.parse_args()

torch.manual_seed(args.seed)
torch.set_default_dtype(getattr(torch, args.dtype))
device = args.device

with open(args.data, encoding="utf-8") as f:
    text = f.read()
chars = sorted(set(text))
vocab_size = len(chars)
stoi = {ch: i for i, ch in enumerate(chars)}
itos = {i: ch for i, ch in enumerate(chars)}
def encode(s): return [stoi[c] for c in s]  # noqa: E704
def decode(ids): return "".join(itos[i] for i in ids)  # noqa: E704

data = torch.tensor(encode(text), dtype=torch.long)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]
block_size, batch_size = args.block_size, args.batch_size


def get_batch(split, it=0):
    data = train_data if split == "train" else val_data
    if args.fixed_batches:
        ix = (torch.arange(batch_size) * 997 + it * 61) % (len(data) - block_size)
    else:
        ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + block_size + 1] for i in ix])
    return x.to(device), y.to(device)


class Head(nn.Module):
    """one head of causal self-attention"""

    def __init__(self, head_size):
        super().__init__()
        self.key = nn.Linear(args.n_embd, head_size, bias=False)
        self.query = nn.Linear(args.n_embd, head_size, bias=False)
        self.value = nn.Linear(args.n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(args.dropout)

    def forward(self, x):
        B, T, C = x.shape
        k = self.key(x)    # (B, T, hs)
        q = self.query(x)  # (B, T, hs)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = F.softmax(wei, dim=-1)
        wei = self.dropout(wei)
        return wei @ self.value(x)  # (B, T, hs)


class MultiHeadAttention(nn.Module):
    def __init__(self, num_heads, head_size):
        super().__init__()
        self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
        self.proj = nn.Linear(head_size * num_heads, args.n_embd)
        self.dropout = nn.Dropout(args.dropout)

    def forward(self, x):
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        return self.dropout(self.proj(out))


class FeedForward(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.ReLU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(args.dropout),
        )

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.sa = MultiHeadAttention(n_head, n_embd // n_head)
        self.ffwd = FeedForward(n_embd)
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        x = x + self.ffwd(self.ln2(x))
        return x


class LanguageModel(nn.Module):
    def generate(self, idx, max_new_tokens, greedy=False):
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -block_size:])
            probs = F.softmax(logits[:, -1, :], dim=-1)  # (B, C)
            if greedy:
                idx_next = torch.argmax(probs, dim=-1, keepdim=True)
            else:
                idx_next = torch.multinomial(probs, num_samples=1)  # (B, 1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    def loss(self, logits, targets):
        B, T, C = logits.shape
        return F.cross_entropy(logits.view(B * T, C), targets.view(B * T))


class BigramLanguageModel(LanguageModel):
    def __init__(self):
        super().__init__()
        self.token_embedding_table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.token_embedding_table(idx)  # (B, T, vocab)
        return logits, None if targets is None else self.loss(logits, targets)


class GPTLanguageModel(LanguageModel):
    def __init__(self):
        super().__init__()
        self.token_embedding_table = nn.Embedding(vocab_size, args.n_embd)
        self.position_embedding_table = nn.Embedding(block_size, args.n_embd)
        self.blocks = nn.Sequential(*[Block(args.n_embd, args.n_head)
                                      for _ in range(args.n_layer)])
        self.ln_f = nn.LayerNorm(args.n_embd)
        self.lm_head = nn.Linear(args.n_embd, vocab_size)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        tok_emb = self.token_embedding_table(idx)  # (B, T, C)
        pos_emb = self.position_embedding_table(torch.arange(T, device=idx.device))  # (T, C)
        x = self.blocks(tok_emb + pos_emb)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        return logits, None if targets is None else self.loss(logits, targets)


@torch.no_grad()
def estimate_loss(model):
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(split, k)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


model = (BigramLanguageModel() if args.model == "bigram" else GPTLanguageModel()).to(device)
if args.save_init:
    from safetensors.numpy import save_file
    save_file({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()},
              args.save_init)
if args.init_weights:
    from safetensors.numpy import load_file
    model.load_state_dict({k: torch.from_numpy(v) for k, v in
                           load_file(args.init_weights).items()})
print(f"{sum(p.numel() for p in model.parameters()) / 1e3:.1f}K parameters")

optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
for it in range(args.steps):
    if args.eval_every and it % args.eval_every == 0:
        losses = estimate_loss(model)
        print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    xb, yb = get_batch("train", it)
    logits, loss = model(xb, yb)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    print(f"iter {it} loss {loss.item():.12e}")

context = torch.zeros((1, 1), dtype=torch.long, device=device)
tokens = model.generate(context, max_new_tokens=args.generate, greedy=args.greedy)[0].tolist()
print("tokens", " ".join(map(str, tokens)))
print(decode(tokens))
