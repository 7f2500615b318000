"""Record which samples each rank's distributed_sampler hands out, epoch by epoch.

Usage: <launcher> python tests/workers/sharding.py BACKEND OUTDIR SIZE EPOCHS
Every rank writes OUTDIR/rank<r>.json: for drop_last false and true, one list of sample ids per
epoch, in the order a DataLoader over the sampler produced them.
"""

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import paraflow


def main(name: str, outdir: str, size: int, epochs: int) -> None:
    dataset = TensorDataset(torch.arange(size))
    seen = {}
    with paraflow.init(name) as backend:
        for drop_last in (False, True):
            sampler = backend.distributed_sampler(dataset, shuffle=True, seed=7, drop_last=drop_last)
            loader = DataLoader(dataset, batch_size=4, sampler=sampler)
            seen[str(drop_last).lower()] = []
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                seen[str(drop_last).lower()].append([int(i) for (batch,) in loader for i in batch])
        with open(os.path.join(outdir, f"rank{backend.rank}.json"), "w") as f:
            json.dump(seen, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
