"""An elastic loop that logs every trained batch's sample ids, for the tests' sample accounting.

    accounting.py LOG_DIR EPOCHS [PAUSE_S]

Each process appends ``epoch step life world rank id,id,...`` per batch (life: the recoveries this
process has been through, so a step trained again after a rollback or restart has a higher one) to LOG_DIR/<pid>.log
(flushed at once, so a killed worker's batches are counted too), and rank 0 writes LOG_DIR/done.json
at the end. A marker file LOG_DIR/epoch-E appears when epoch E ends, for the test to act on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import paraflow
from paraflow.elastic import ElasticSampler, State, run

SAMPLES, BATCH, COMMIT_EVERY = 96, 4, 3

log_dir, epochs = Path(sys.argv[1]), int(sys.argv[2])
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05

with paraflow.init() as backend:
    torch.manual_seed(0)
    data = TensorDataset(torch.arange(SAMPLES), torch.randn(SAMPLES, 4))
    model = backend.wrap_model(torch.nn.Linear(4, 1))
    optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
    sampler = ElasticSampler(data, shuffle=True, seed=1, drop_last=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    state = State(model, optimizer, backend=backend, sampler=sampler, epoch=0, step=0)
    log = open(log_dir / f"{os.getpid()}.log", "a", buffering=1)
    sizes = []
    state.register_reset_callbacks([lambda world: sizes.append(world)])

    @run
    def train(state):
        for epoch in range(state.epoch, epochs):
            state.epoch = epoch
            sampler.set_epoch(epoch)
            for i, (ids, x) in enumerate(loader):
                model(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                state.step += 1
                sampler.record_batch(i, BATCH)
                ids = ",".join(str(int(v)) for v in ids)
                log.write(f"{epoch} {state.step} {state.recoveries} {backend.world_size} {backend.rank} {ids}\n")
                time.sleep(pause)
                if state.step % COMMIT_EVERY == 0:
                    state.commit()
            state.epoch = epoch + 1
            state.commit()
            if backend.is_main:
                (log_dir / f"epoch-{epoch + 1}").touch()

    train(state)
    if backend.is_main:
        summary = {"world_size": backend.world_size, "recoveries": state.recoveries, "resets": sizes}
        (log_dir / "done.json").write_text(json.dumps(summary))
