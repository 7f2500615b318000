"""What train.py reports about a run: per-step times (a step takes as long as its slowest rank)
and a JSON summary for tests and tools, kept out of the example loop itself."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any, Optional

import torch

from .models import count_parameters

__all__ = ["RunRecord"]


class RunRecord:
    """Times each training batch on this rank and summarises the run across ranks.

    Args:
        backend: the initialised backend.
        settings: what the run was asked to do (model, data, batch_size, resume, ...), copied
            into the summary as they are.
    """

    def __init__(self, backend, **settings: Any) -> None:
        self.backend = backend
        self.settings = settings
        self.step_times: list[float] = []
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Time one batch's forward, backward and (maybe) optimizer step, after a device sync."""
        t0 = time.perf_counter()
        yield
        if self.backend.device.type == "cuda":
            torch.cuda.synchronize()
        self.step_times.append(time.perf_counter() - t0)

    def elapsed(self) -> float:
        """Seconds since the record started."""
        return time.perf_counter() - self.start

    def finish(self, model: torch.nn.Module, json_out: Optional[str] = None, **outcome: Any) -> dict:
        """The run's summary (call on every rank: it reduces step times); rank 0 writes `json_out`."""
        backend = self.backend
        elapsed = self.elapsed()
        # A step takes as long as its slowest rank (over the batches every rank ran).
        common = int(backend.allreduce(torch.tensor([len(self.step_times)]), op="min").item())
        per_rank = backend.allgather(torch.tensor(self.step_times[:common], dtype=torch.float64))
        slowest = torch.stack(per_rank).max(dim=0).values.tolist() if common else []
        batch_size = self.settings.get("batch_size", 0)
        result = {
            "backend": backend.name,
            "launcher": backend.launcher,
            "world_size": backend.world_size,
            "device": str(backend.device),
            **self.settings,
            "parameters": count_parameters(backend.unwrap(model)),
            "global_batch_size": batch_size * backend.world_size,
            "accumulation_steps": backend.accumulation_steps,
            "precision": backend.precision,
            "compression": backend.compression,
            **outcome,
            "elapsed_s": elapsed,
            "step_times_s": slowest,
        }
        if backend.is_main and json_out:
            with open(json_out, "w") as f:
                json.dump(result, f, indent=2)
        return result
