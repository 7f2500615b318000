"""Train with checkpoints; on the first attempt rank 1 kills itself, and a restart resumes.

Usage: torchrun --max-restarts 1 ... restart.py BACKEND CHECKPOINT OUT STEPS SAVE_EVERY KILL_STEP
Every step's batch comes from a generator seeded by the step and the rank, so an interrupted
run sees exactly the batches an uninterrupted one does. Each start resumes from CHECKPOINT
when it exists. On attempt 0 (TORCHELASTIC_RESTART_COUNT) rank 1 SIGKILLs itself right after
step KILL_STEP (0: never). Rank 0 saves the final parameters to OUT. Every rank prints
``EVENT {json}`` records: the attempt and the step it resumed from, the kill, the end.
"""

import os
import signal
import sys

import torch
import torch.nn.functional as F
from report import emit

import paraflow
from paraflow.examples.models import build_model


def main(name: str, checkpoint: str, out: str, steps: int, save_every: int, kill_step: int) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with paraflow.init(name) as backend:
        torch.manual_seed(0)
        model = backend.wrap_model(build_model("mlp", width=16))
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
        state = {"model": model, "optimizer": optimizer, "step": 0}
        if os.path.exists(checkpoint):
            backend.load(checkpoint, state)
        emit({"rank": backend.rank, "attempt": attempt, "resumed_from": state["step"]})
        for step in range(state["step"] + 1, steps + 1):
            data = torch.Generator().manual_seed(1000 * step + backend.rank)
            x, y = torch.randn(8, 1, 8, 8, generator=data), torch.randint(0, 10, (8,), generator=data)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            if attempt == 0 and backend.rank == 1 and step == kill_step:
                emit({"rank": backend.rank, "attempt": attempt, "killed_at": step})
                os.kill(os.getpid(), signal.SIGKILL)
            state["step"] = step
            if step % save_every == 0:
                backend.save(checkpoint, state)
        if backend.is_main:
            torch.save({k: v.detach().cpu() for k, v in backend.unwrap(model).state_dict().items()}, out)
        emit({"rank": backend.rank, "attempt": attempt, "done": steps})


if __name__ == "__main__":
    name, checkpoint, out, *numbers = sys.argv[1:]
    main(name, checkpoint, out, *map(int, numbers))
