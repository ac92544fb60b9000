"""A small convolutional network on MNIST-shaped data, trained with Adadelta and a step
learning-rate schedule.

    python mnist_cnn.py --epochs 3
    python mnist_cnn.py --epochs 1 --save-model

The 28x28 "digits" are drawn by this script (a blob whose position depends on the class, plus
noise), so nothing is downloaded.
"""
import argparse
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, dropout1=0.25, dropout2=0.5):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(dropout1)
        self.dropout2 = nn.Dropout(dropout2)
        self.fc1 = nn.Linear(8 * 12 * 12, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def make_digits(n, seed):
    """n images (n, 1, 28, 28) and labels: class c is a blob centred on a point of a circle."""
    rng = random.Random(seed)
    images, labels = [], []
    for i in range(n):
        c = i % 10
        cy, cx = 14 + 8 * math.sin(c * 0.63), 14 + 8 * math.cos(c * 0.63)
        images.append([[math.exp(-((y - cy) ** 2 + (x - cx) ** 2) / 8.0) + 0.8 * rng.random()
                        for x in range(28)] for y in range(28)])
        labels.append(c)
    x = torch.tensor(images).unsqueeze(1)
    return (x - 0.1307) / 0.3081, torch.tensor(labels)


def train(args, model, device, train_loader, optimizer, epoch, step):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.12e}")
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}"
                  f" ({100. * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}")
        step += 1
        if step == args.max_steps:
            break
    return step


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/"
          f"{len(test_loader.dataset)} ({100. * correct / len(test_loader.dataset):.0f}%)\n")


def main():
    parser = argparse.ArgumentParser(description="small CNN on MNIST-shaped data")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-batch-size", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    parser.add_argument("--num-train", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7, help="learning rate step gamma")
    parser.add_argument("--dropout1", type=float, default=0.25)
    parser.add_argument("--dropout2", type=float, default=0.5)
    parser.add_argument("--no-shuffle", action="store_true", help="batches in dataset order")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=4)
    parser.add_argument("--init-weights", help="start from this state dict (safetensors)")
    parser.add_argument("--save-init", help="write the initial state dict here (safetensors)")
    parser.add_argument("--save-model", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_default_dtype(getattr(torch, args.dtype))
    device = torch.device(args.device)

    train_x, train_y = make_digits(args.num_train, args.seed)
    test_x, test_y = make_digits(100, args.seed + 1)
    train_loader = DataLoader(TensorDataset(train_x, train_y), batch_size=args.batch_size,
                              shuffle=not args.no_shuffle)
    test_loader = DataLoader(TensorDataset(test_x, test_y), batch_size=args.test_batch_size)

    model = Net(args.dropout1, args.dropout2).to(device)
    if args.save_init:
        from safetensors.numpy import save_file
        save_file({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()},
                  args.save_init)
    if args.init_weights:
        from safetensors.numpy import load_file
        model.load_state_dict({k: torch.from_numpy(v) for k, v in
                               load_file(args.init_weights).items()})
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    step = 0
    for epoch in range(1, args.epochs + 1):
        step = train(args, model, device, train_loader, optimizer, epoch, step)
        test(model, device, test_loader)
        scheduler.step()
        if step == args.max_steps:
            break

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == "__main__":
    main()
