"""An unmodified paraflow training script that would train for 10,000 epochs (`paraflow bench --script`).

python endless_train.py [--epochs N] [--batch-size B] [--no-wrap-optimizer] [--no-init]
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import paraflow


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10_000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--no-wrap-optimizer", action="store_true")
    p.add_argument("--no-init", action="store_true")
    args = p.parse_args()
    if args.no_init:
        return
    with paraflow.init() as backend:
        torch.manual_seed(0)
        model = backend.wrap_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if not args.no_wrap_optimizer:
            optimizer = backend.wrap_optimizer(optimizer, model)
        x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
        for _ in range(args.epochs):
            model.train()
            for i in range(0, len(y), args.batch_size):
                optimizer.zero_grad()
                F.cross_entropy(model(x[i : i + args.batch_size]), y[i : i + args.batch_size]).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():  # evaluation: not counted as training samples
                model(x)


if __name__ == "__main__":
    main()
