"""The model and the data every porting example trains: the same global batch per step at any world size."""

import torch

GLOBAL_BATCH = 16


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def batch(step: int, rank: int, world: int):
    """This rank's rows of the global batch of `step`: the same data whatever the world size."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 20, generator=g)
    y = (x[:, :10].sum(dim=1) > 0).long()
    share = GLOBAL_BATCH // world
    return x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
