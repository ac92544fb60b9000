"""Make more names: a character-level model that reads the last few characters of a name and
predicts the next one, trained from a Dataset through a DataLoader.

    python char_mlp.py --model mlp --epochs 5
    python char_mlp.py --model gru --block-size 8

The names are made up by this script from a fixed list of syllables, so nothing is
downloaded.
"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

parser = argparse.ArgumentParser(description="next-character model on made-up names")
parser.add_argument("--model", choices=["mlp", "gru", "lstm"], default="mlp")
parser.add_argument("--block-size", type=int, default=4)
parser.add_argument("--n-embd", type=int, default=16)
parser.add_argument("--n-hidden", type=int, default=64)
parser.add_argument("--num-names", type=int, default=400)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--weight-decay", type=float, default=0.01)
parser.add_argument("--no-shuffle", action="store_true", help="batches in dataset order")
parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
parser.add_argument("--device", default="cpu")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--init-weights", help="start from this state dict (a safetensors file)")
parser.add_argument("--save-init", help="write the initial state dict here (safetensors)")
args = parser.parse_args()

torch.manual_seed(args.seed)
torch.set_default_dtype(getattr(torch, args.dtype))

syllables = ["ka", "ri", "mo", "la", "an", "el", "to", "su", "vi", "ne", "or", "ja", "de", "y"]
rng = random.Random(args.seed)
names = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
         for _ in range(args.num_names)]


class CharDataset(Dataset):
    """Every (context, next character) pair of every name; '.' starts and ends a name."""

    def __init__(self, words, block_size):
        self.chars = ["."] + sorted(set("".join(words)))
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        xs, ys = [], []
        for w in words:
            context = [0] * block_size
            for ch in w + ".":
                xs.append(context)
                ys.append(self.stoi[ch])
                context = context[1:] + [self.stoi[ch]]
        self.X, self.Y = torch.tensor(xs), torch.tensor(ys)

    def __len__(self):
        return len(self.Y)

    def __getitem__(self, i):
        return self.X[i], self.Y[i]

    def vocab_size(self):
        return len(self.chars)


n_train = int(0.9 * len(names))
train_set = CharDataset(names[:n_train], args.block_size)
test_words = CharDataset(names[n_train:], args.block_size)
test_set = TensorDataset(test_words.X, test_words.Y)
vocab_size = train_set.vocab_size()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, args.n_embd)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(args.block_size * args.n_embd, args.n_hidden),
            nn.Tanh(),
            nn.Linear(args.n_hidden, vocab_size),
        )

    def forward(self, idx):
        return self.net(self.wte(idx))  # (B, vocab)


class RNN(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, args.n_embd)
        rnn_class = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = rnn_class(args.n_embd, args.n_hidden, batch_first=True)
        self.lm_head = nn.Linear(args.n_hidden, vocab_size)

    def forward(self, idx):
        out, _ = self.rnn(self.wte(idx))  # (B, T, n_hidden)
        return self.lm_head(out[:, -1, :])


model = (MLP() if args.model == "mlp" else RNN(args.model)).to(args.device)
if args.save_init:
    from safetensors.numpy import save_file
    save_file({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()},
              args.save_init)
if args.init_weights:
    from safetensors.numpy import load_file
    model.load_state_dict({k: torch.from_numpy(v) for k, v in
                           load_file(args.init_weights).items()})
print(f"{len(train_set)} training examples, {vocab_size} characters, "
      f"{sum(p.numel() for p in model.parameters())} parameters")

g = torch.Generator().manual_seed(args.seed)
train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=not args.no_shuffle,
                          generator=g, drop_last=True)
test_loader = DataLoader(test_set, batch_size=256)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
total_steps = args.epochs * len(train_loader)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - 0.9 * s / total_steps)


@torch.inference_mode()
def evaluate():
    model.eval()
    total, count = 0.0, 0
    for X, Y in test_loader:
        X, Y = X.to(args.device), Y.to(args.device)
        total += F.cross_entropy(model(X), Y, reduction="sum").item()
        count += Y.numel()
    model.train()
    return total / count


step = 0
for epoch in range(args.epochs):
    for X, Y in train_loader:
        X, Y = X.to(args.device), Y.to(args.device)
        loss = F.cross_entropy(model(X), Y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"step {step} loss {loss.item():.12e} lr {scheduler.get_last_lr()[0]:.6e}")
        step += 1
        if step == args.max_steps:
            break
    print(f"epoch {epoch}: test loss {evaluate():.4f}")
    if step == args.max_steps:
        break
