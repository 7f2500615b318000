"""Train a small model whose blocks sit in an nn.ModuleList, written as a ported DDP script is.

Usage: <launcher> python tests/workers/porting_gradients.py BACKEND OUTDIR MODE[,MODE...]
Each MODE trains a fresh model in the same job, one after the other:
    clip      backward, then backend.clip_grad_norm_(model, MAX_NORM), then optimizer.step()
    value     the same with backend.clip_grad_value_(model, MAX_VALUE)
    torch_clip  in float64: torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM), torch's own
              call on the gradients backward left, unchanged from a single-process script
    no_sync   two micro-batches per step; the first one's forward (only) under backend.no_sync
    plain     one backward per step, nothing else
Every global batch is drawn from the step number; rank r of n takes rows [r*B/n, (r+1)*B/n).
One process (single) accumulates the same global batch, each rank's share as one micro-batch
with its loss divided by the number of shares. Per MODE, rank 0 writes the final parameters to
OUTDIR/MODE.pt, and every rank writes OUTDIR/MODE.pt.rank<r>.json with the total norms clip_grad_norm_ returned and, for
no_sync, the gradient messages each of the two backward passes of a step started.
"""

import json
import sys

import torch
import torch.nn.functional as F
from equivalence import _count_gradient_messages  # this script's directory is on sys.path
from torch import nn

import paraflow

STEPS, GLOBAL_BATCH, SHARES, SEED = 4, 16, 2, 1234
WIDTH, BLOCKS = 128, 4  # 66,560 parameters in the ModuleList, 16,512 in each block
MAX_NORM, MAX_VALUE = 0.05, 0.002


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Net(nn.Module):
    """nanoGPT's shape in small: an input layer, blocks in an nn.ModuleList, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, WIDTH)
        self.h = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        x = self.embed(x)
        for block in self.h:
            x = block(x)
        return self.head(x)


def batch(step: int):
    g = torch.Generator().manual_seed(SEED + step)
    return torch.randn(GLOBAL_BATCH, 16, generator=g), torch.randint(0, 10, (GLOBAL_BATCH,), generator=g)


def train(backend, name: str, out: str, mode: str) -> None:
    norms, sent = [], []
    torch.manual_seed(SEED)
    dtype = torch.float64 if mode == "torch_clip" else torch.float32
    model = backend.wrap_model(Net().to(dtype))
    optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), model)
    messages = _count_gradient_messages(model, optimizer, name) if mode == "no_sync" else [0]
    n, r = backend.world_size, backend.rank
    share = GLOBAL_BATCH // SHARES
    for step in range(STEPS):
        x, y = batch(step)
        x = x.to(dtype)
        optimizer.zero_grad()
        if n == 1:  # the whole global batch, one share at a time
            for k in range(SHARES):
                rows = slice(k * share, (k + 1) * share)
                (F.cross_entropy(model(x[rows]), y[rows]) / SHARES).backward()
        elif mode == "no_sync":  # each rank's share in two micro-batches, the first not reduced
            half = share // 2
            xs, ys = x[r * share : (r + 1) * share], y[r * share : (r + 1) * share]
            with backend.no_sync(model):
                loss = F.cross_entropy(model(xs[:half]), ys[:half]) / 2
            before = messages[0]
            loss.backward()  # outside the context, as DDP code does it
            between = messages[0]
            (F.cross_entropy(model(xs[half:]), ys[half:]) / 2).backward()
            sent.append([between - before, messages[0] - between])
        else:
            rows = slice(r * share, (r + 1) * share)
            F.cross_entropy(model(x[rows]), y[rows]).backward()
        if mode == "clip":
            norms.append(backend.clip_grad_norm_(model, MAX_NORM).item())
        elif mode == "torch_clip":
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            norms.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item())
        elif mode == "value":
            backend.clip_grad_value_(model, MAX_VALUE)
        optimizer.step()
    state = backend.unwrap(model).state_dict()
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}
    if backend.is_main:
        torch.save({k: v.cpu() for k, v in state.items()}, out)
    with open(f"{out}.rank{r}.json", "w") as f:
        json.dump({"norms": norms, "sent": sent, "blocks": getattr(model, "paraflow_blocks", None)}, f)


def main(name: str, outdir: str, modes: str) -> None:
    with paraflow.init(name) as backend:
        for mode in modes.split(","):
            train(backend, name, f"{outdir}/{mode}.pt", mode)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
