"""A short training run with checkpoints, into which one rank injects one fault (the fault campaign).

Usage: <launcher> python tests/reliability/workers/campaign.py BACKEND DIR FAULT PHASE RANK STEP

The run: a start-up broadcast of the data seed, STEPS steps (forward, backward, optimizer step, an
allreduce of the loss), a ``backend.save`` to DIR/checkpoint every SAVE_EVERY steps, an allreduce of
the last loss after the last step, then every rank writes its own parameters (its shards under
fsdp) to DIR/final-rank<R>.pt. Each step's batch comes from a generator seeded by the step and
the rank, so every run without a fault ends with the same parameters, bit for bit.

FAULT, done by rank RANK in PHASE (at step STEP where the phase has steps):
    sigkill, sigstop   the signal to itself
    raise              an exception
    exit3, exit0       sys.exit(3), os._exit(0)
    shape              the phase's collective with one element more than the other ranks'
    skip               the phase's collective left out
    none               no fault; rank 0 copies each checkpoint to DIR/saves/step-<S> after its save
PHASE:
    start-up           right after paraflow.init; the collective is the seed's broadcast
    mid-step           between the forward and the backward of step STEP; the collective is the
                       step's loss allreduce
    save               inside the save after step STEP: the writing rank (rank 0; every rank under
                       fsdp) right after it wrote its part, the others once they gathered the state;
                       the collective is the first one inside the save, and skip leaves out the save
    after-last-step    after the last save; the collective is the last loss's allreduce
Every rank writes DIR/rank<R>.pid, and prints ``EVENT {json}`` lines: the fault (with its time and
pid) right before it strikes, any error that leaves ``main``, and ``done``.
"""

import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy
import torch
import torch.nn.functional as F
from report import emit
from torch.distributed.elastic.multiprocessing.errors import record

import paraflow
from paraflow.examples.models import build_model

STEPS, SAVE_EVERY = 6, 2
PROCESS_FAULTS = ("sigkill", "sigstop", "raise", "exit3", "exit0")


class InjectedFailure(RuntimeError):
    """The exception a rank raises on purpose."""


class Injection:
    """Where and what this rank injects; `due(phase, step)` says whether this is the moment."""

    def __init__(self, rank: int, fault: str, phase: str, fault_rank: int, step: int) -> None:
        self.mine = rank == fault_rank and fault != "none"
        self.fault, self.phase, self.step, self.rank = fault, phase, step, rank
        self.done = False

    def due(self, phase: str, step: int = 0) -> bool:
        return self.mine and not self.done and phase == self.phase and step == self.step

    def announce(self) -> None:
        self.done = True
        fields = {"rank": self.rank, "fault": self.fault, "phase": self.phase, "step": self.step}
        emit({**fields, "pid": os.getpid(), "time": time.time()})

    def strike(self) -> None:
        """Do a process fault (the caller checked `due`)."""
        self.announce()
        if self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif self.fault == "raise":
            raise InjectedFailure(f"injected failure in {self.phase} at step {self.step}")
        elif self.fault == "exit3":
            sys.exit(3)
        elif self.fault == "exit0":
            sys.stdout.flush()
            os._exit(0)

    def collective(self, phase: str, step: int, call, tensor: torch.Tensor):
        """`call(tensor)`, or the fault due here: a process fault first, another shape, or no call."""
        if not self.due(phase, step):
            return call(tensor)
        if self.fault in PROCESS_FAULTS:
            self.strike()
            return call(tensor)
        self.announce()
        if self.fault == "skip":
            return tensor
        return call(_one_more(tensor))


def _one_more(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.reshape(-1)
    return torch.cat([flat, flat[:1] if flat.numel() else torch.zeros(1, dtype=tensor.dtype)])


def reshape_first_collective(backend, injection: Injection):
    """Make the next public collective of `backend` (inside the save) get one element more; returns an undo."""
    names = ("allreduce", "broadcast", "allgather")
    originals = {name: getattr(backend, name) for name in names}

    def undo() -> None:
        for name in names:
            backend.__dict__.pop(name, None)

    def make(name):
        def call(tensor, *args, **kwargs):
            undo()
            injection.announce()
            return originals[name](_one_more(tensor), *args, **kwargs)

        return call

    for name in names:
        setattr(backend, name, make(name))
    return undo


def strike_inside_save(backend, injection: Injection):
    """Make the process fault strike inside the next save, at this rank's point (see the module doc);
    returns an undo."""
    from paraflow.training import checkpoint

    if backend.name == "fsdp":
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        write = FileSystemWriter.write_data

        def writing(self, *args, **kwargs):
            result = write(self, *args, **kwargs)
            injection.strike()
            return result

        FileSystemWriter.write_data = writing
        return lambda: setattr(FileSystemWriter, "write_data", write)
    if backend.is_main:
        serialize = checkpoint._serialize

        def serializing(payload, f):
            serialize(payload, f)
            injection.strike()

        checkpoint._serialize = serializing
        return lambda: setattr(checkpoint, "_serialize", serialize)
    gather = backend._state_to_save

    def gathering(state):
        saved = gather(state)
        injection.strike()
        return saved

    backend._state_to_save = gathering
    return lambda: backend.__dict__.pop("_state_to_save", None)


def save(backend, injection: Injection, step: int, directory: Path, state: dict) -> None:
    path = str(directory / "checkpoint")
    undo = None
    if injection.due("save", step):
        if injection.fault == "skip":
            injection.announce()
            return
        if injection.fault == "shape":
            undo = reshape_first_collective(backend, injection)
        else:
            undo = strike_inside_save(backend, injection)
    try:
        backend.save(path, state)
    finally:
        if undo is not None:
            undo()
    if injection.fault == "none" and backend.is_main:
        copy = directory / "saves" / f"step-{step}"
        copy.parent.mkdir(exist_ok=True)
        (shutil.copytree if os.path.isdir(path) else shutil.copy2)(path, copy)


def local_parameters(model) -> dict:
    """This rank's parameters as plain tensors (its own shards under fsdp)."""
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone() for k, v in model.state_dict().items()}


@record
def main(name: str, directory: str, fault: str, phase: str, fault_rank: int, fault_step: int) -> None:
    directory = Path(directory)
    rank = -1
    try:
        with paraflow.init(name) as backend:
            rank = backend.rank
            (directory / f"rank{rank}.pid").write_text(str(os.getpid()))
            injection = Injection(rank, fault, phase, fault_rank, fault_step)
            seed = injection.collective("start-up", 0, backend.broadcast, torch.tensor([1000], dtype=torch.int64))
            torch.manual_seed(0)  # and the RNGs every checkpoint holds: equal in every run
            random.seed(0)
            numpy.random.seed(0)
            model = backend.wrap_model(build_model("mlp", width=16))
            optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
            state = {"model": model, "optimizer": optimizer, "step": 0}
            loss = torch.zeros(())
            for step in range(1, STEPS + 1):
                data = torch.Generator().manual_seed(int(seed[0]) * step + rank)
                x, y = torch.randn(8, 1, 8, 8, generator=data), torch.randint(0, 10, (8,), generator=data)
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                if injection.due("mid-step", step) and fault in PROCESS_FAULTS:
                    injection.strike()
                loss.backward()
                optimizer.step()
                injection.collective("mid-step", step, lambda t: backend.allreduce(t, op="mean"), loss.detach())
                state["step"] = step
                if step % SAVE_EVERY == 0:
                    save(backend, injection, step, directory, state)
            injection.collective("after-last-step", STEPS, lambda t: backend.allreduce(t, op="mean"), loss.detach())
            torch.save(local_parameters(backend.unwrap(model)), directory / f"final-rank{rank}.pt")
        emit({"rank": rank, "done": True, "time": time.time()})
    except BaseException as exc:
        emit({"rank": rank, "error": type(exc).__name__, "message": str(exc)[:2000], "time": time.time()})
        raise


if __name__ == "__main__":
    name, directory, fault, phase, fault_rank, fault_step = sys.argv[1:7]
    main(name, directory, fault, phase, int(fault_rank), int(fault_step))
