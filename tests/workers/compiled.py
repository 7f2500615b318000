"""Train a small float64 model compiled in each order a script may write.

Usage: <launcher> python tests/workers/compiled.py BACKEND OUTDIR ORDER[,ORDER...]
Each ORDER trains a fresh model in the same job:
    wrap_compiled    backend.wrap_model(torch.compile(model, backend=counting))
    compile_wrapped  torch.compile(backend.wrap_model(model), backend=counting)
    compile_option   backend.wrap_model(model, compile={"backend": counting})
    inductor         backend.wrap_model(model, compile=True): torch's own compiler, C++ included
    eager            backend.wrap_model(model)
    checkpoint       compile_option, then backend.save, and backend.load into a fresh compiled model
`counting` is a compile backend that counts the graphs it is given and runs them as traced.
Every global batch is drawn from the step number; rank r of n takes rows [r*B/n, (r+1)*B/n),
one process the whole batch. Per ORDER, rank 0 writes OUTDIR/ORDER.pt (the final parameters)
and every rank OUTDIR/ORDER.rank<r>.json: the graphs compiled, the gradient sums after each
backward, the type of the model wrap_model returned. DDP gets 1 MB buckets (bucket_cap_mb,
the least torch's compiler takes), so that the compiler splits the graph at them; other
backends ignore the option.
"""

import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

import paraflow

STEPS, GLOBAL_BATCH, WIDTH, BLOCKS, SEED = 3, 8, 256, 4, 4321  # 2.1 MB of float64 parameters


class Residual(nn.Linear):
    """A square linear layer whose forward, written here, adds tanh of its output to its input."""

    def forward(self, x):
        return x + torch.tanh(super().forward(x))


class Net(nn.Module):
    """An input layer, BLOCKS residual layers in a ModuleList (FSDP shards each), a head."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = nn.Linear(4, WIDTH), nn.Linear(WIDTH, 3)
        self.middle = nn.ModuleList(Residual(WIDTH, WIDTH) for _ in range(BLOCKS))

    def forward(self, x):
        x = self.first(x)
        for layer in self.middle:
            x = layer(x)
        return self.last(x)


def build(backend, order: str, graphs: list):
    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    model = Net().to(torch.float64)
    if order == "wrap_compiled":
        return backend.wrap_model(torch.compile(model, backend=counting))
    if order == "compile_wrapped":
        return torch.compile(backend.wrap_model(model), backend=counting)
    if order in ("compile_option", "checkpoint"):
        return backend.wrap_model(model, compile={"backend": counting})
    if order == "inductor":
        return backend.wrap_model(model, compile=True)
    return backend.wrap_model(model)


def train(backend, out: str, order: str) -> None:
    torch.manual_seed(SEED)
    graphs, grads = [], []
    model = build(backend, order, graphs)
    optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9), model)
    n, r = backend.world_size, backend.rank
    share = GLOBAL_BATCH // n
    for step in range(STEPS):
        g = torch.Generator().manual_seed(SEED + step)
        x = torch.randn(GLOBAL_BATCH, 4, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)
        rows = slice(r * share, (r + 1) * share)
        optimizer.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        grads.append(sum(float(p.grad.double().sum()) for p in model.parameters() if not hasattr(p, "full_tensor")))
        optimizer.step()
    state = full_state(backend, model)
    if backend.is_main:
        torch.save({k: v.cpu() for k, v in state.items()}, f"{out}.pt")
    report = {"graphs": graphs, "grads": grads, "type": type(model).__name__}
    if order == "checkpoint":  # the keys are the module's own, and a fresh compiled model loads them
        backend.save(f"{out}.ckpt", {"model": model, "optimizer": optimizer})
        fresh = build(backend, order, [])
        again = backend.wrap_optimizer(torch.optim.SGD(fresh.parameters(), lr=0.3, momentum=0.9), fresh)
        backend.load(f"{out}.ckpt", {"model": fresh, "optimizer": again})
        loaded = full_state(backend, fresh)
        report.update(keys=sorted(loaded), restored=all(torch.equal(loaded[k], state[k]) for k in state))
    with open(f"{out}.rank{r}.json", "w") as f:
        json.dump(report, f)


def full_state(backend, model) -> dict:
    state = backend.unwrap(model).state_dict()
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def main(name: str, outdir: str, orders: str) -> None:
    with paraflow.init(name, bucket_cap_mb=1) as backend:
        for order in orders.split(","):
            train(backend, f"{outdir}/{order}", order)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
