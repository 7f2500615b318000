"""pytorch/examples' DDP tutorial (distributed/ddp-tutorial-series/multigpu_torchrun.py), ported to
paraflow the way a newcomer ports it: the same Trainer, the same dataset of random rows, the
snapshot saved at the end of an epoch.

Usage: <launcher> python tests/reliability/workers/tutorial.py BACKEND EPOCHS SNAPSHOT [options]
    --samples N --batch-size B   the dataset size and per-rank batch (449 and 112 on 2 ranks:
                                 shards of 225 and 224 samples, 3 batches against 2)
    --save-on-rank0              keep the tutorial's `if self.gpu_id == 0 and ...: self._save_snapshot()`
                                 (torch.save there is local; backend.save is collective)
    --join / --drop-last         the two fixes for uneven shards
Prints ``EVENT {json}`` lines: ``save`` before each snapshot, ``error`` on the way out, ``done``.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from report import emit
from torch.utils.data import DataLoader, Dataset

import paraflow


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        g = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, backend, model, train_data, optimizer, save_every, snapshot_path, args):
        self.backend = backend
        self.gpu_id = backend.local_rank
        self.model = backend.wrap_model(model)
        self.optimizer = backend.wrap_optimizer(optimizer, self.model)
        self.train_data = train_data
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        self.args = args
        self.steps = 0

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        self.steps += 1

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}", flush=True)
        self.train_data.sampler.set_epoch(epoch)
        with self.backend.join(self.model, self.optimizer, enable=self.args.join):
            for source, targets in self.train_data:
                self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        emit({"rank": self.backend.rank, "save": epoch, "time": time.time()})
        self.backend.save(self.snapshot_path, {"model": self.model, "epochs_run": epoch})
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.args.save_on_rank0:
                if self.gpu_id == 0 and epoch % self.save_every == 0:
                    self._save_snapshot(epoch)
            elif epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("backend")
    p.add_argument("epochs", type=int)
    p.add_argument("snapshot")
    p.add_argument("--samples", type=int, default=448)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--save-on-rank0", action="store_true")
    p.add_argument("--join", action="store_true")
    p.add_argument("--drop-last", action="store_true")
    args = p.parse_args()
    rank = -1
    try:
        with paraflow.init(args.backend) as backend:
            rank = backend.rank
            torch.manual_seed(0)
            dataset = MyTrainDataset(args.samples)
            sampler = backend.distributed_sampler(dataset, drop_last=args.drop_last)
            loader = DataLoader(dataset, batch_size=args.batch_size, pin_memory=False, shuffle=False, sampler=sampler)
            model = torch.nn.Linear(20, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
            trainer = Trainer(backend, model, loader, optimizer, 1, args.snapshot, args)
            trainer.train(args.epochs)
            weight = backend.unwrap(trainer.model).weight.detach()
            emit({"rank": rank, "done": True, "steps": trainer.steps, "weight": weight.flatten().tolist()})
    except BaseException as exc:
        emit({"rank": rank, "error": type(exc).__name__, "message": str(exc), "time": time.time()})
        raise


if __name__ == "__main__":
    main()
