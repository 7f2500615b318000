"""`paraflow bench --trace`: a few steps under torch.profiler, written as a Chrome trace per rank.

The trace launches are extra launches of their own (their numbers stay out of the tables), so
the profiler never slows a timed step. Open a file in chrome://tracing or https://ui.perfetto.dev.
Horovod's own timeline (HOROVOD_TIMELINE, set by the benchmark for horovod's trace launches)
shows its negotiation, fusion and allreduces beside it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

__all__ = ["TRACE_STEPS", "write_trace", "trace_name"]

#: Steps recorded: enough to show a steady step between its neighbours, small enough to open quickly.
TRACE_STEPS = 3


def trace_name(model_label: str, rank: int) -> str:
    """ "mlp(width=16)", 1 -> "mlp-width-16-rank1.json" (a plain file name)."""
    return f"{re.sub(r'[^A-Za-z0-9]+', '-', model_label).strip('-')}-rank{rank}.json"


def write_trace(backend, step: Callable, batches: Iterator, directory: Path, model_label: str) -> str:
    """Profile TRACE_STEPS steps of `step` and write this rank's Chrome trace under `directory`."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if backend.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    backend.barrier()
    with profile(activities=activities) as prof:
        for i in range(TRACE_STEPS):
            with record_function(f"paraflow step {i}"):
                step(*next(batches))
                if backend.device.type == "cuda":
                    torch.cuda.synchronize(backend.device)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / trace_name(model_label, backend.rank)
    prof.export_chrome_trace(str(path))
    return str(path)
