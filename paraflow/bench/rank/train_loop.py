"""The timed training loop one rank runs for one model (the same loop for every backend).

Per rank it records: every step's wall time after synchronising the device, the wall time of
the whole timed window (started after a barrier), each step's loss, peak memory, the model state
it holds (parameters, gradients, optimizer state), and, for
multi-process backends, interleaved pairs of steps with and without gradient synchronisation.
Everything across ranks (max per step, throughput) is computed later from these raw numbers.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
import time
from collections.abc import Iterator
from typing import Callable, ContextManager, Optional

import torch
import torch.nn.functional as F

from ...examples.data import load_dataset
from ...examples.models import build_model, count_parameters
from ..driver.config import ModelSpec
from .breakdown import run_pairs, step_parts, window_breakdown
from .factory import batch_samples, build_factory, call_model, model_facts, take, to_device
from .model_state import model_state_bytes
from .warmup import WINDOW, warm_up

__all__ = [
    "run_training",
    "make_batches",
    "make_step",
    "local_update",
    "device_sync",
    "reset_peak_memory",
    "peak_memory_bytes",
    "peak_memory",
    "peak_rss_bytes",
    "LEARNING_RATE",
]

LEARNING_RATE = 0.05
#: Upper bound on timed steps however fast a step is.
MAX_STEPS = 2000


def device_sync(device: torch.device) -> None:
    """Wait for queued GPU work so a timer reads the real end of a step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clear_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets this process's peak resident set size (VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def reset_peak_memory(device: torch.device) -> str:
    """Start a new peak-memory window; returns what peak_memory_bytes measures ("cuda-allocated",
    "rss", "rss-since-start"). The peak resident set size restarts on a GPU too, where the clock allows."""
    cleared = _clear_peak_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda-allocated"
    return "rss" if cleared else "rss-since-start"


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM; getrusage where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak CUDA memory allocated by torch on `device`, else this process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def peak_memory(device: torch.device) -> dict:
    """{"peak_rss_bytes"} of this process, and {"peak_cuda_bytes"} allocated by torch on a GPU."""
    peaks = {"peak_rss_bytes": peak_rss_bytes()}
    if device.type == "cuda":
        peaks["peak_cuda_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return peaks


def make_batches(backend, data: str, batch_size: int, seed: int) -> tuple[Iterator, tuple, int]:
    """An endless iterator over this rank's batches, the sample shape and the class count.

    Each rank takes its shard with the backend's distributed sampler and cycles through it in
    fixed-size batches, so data loading is not part of what is timed.
    """
    train_set, _ = load_dataset(data, seed=seed)
    x_all, y_all = train_set.tensors
    indices = torch.tensor(list(backend.distributed_sampler(train_set, shuffle=True, seed=seed)))
    x, y = x_all[indices], y_all[indices]
    if len(y) < batch_size:
        repeat = -(-batch_size // len(y))
        x, y = x.repeat(repeat, *([1] * (x.dim() - 1))), y.repeat(repeat)

    def cycle() -> Iterator:
        start = 0
        while True:
            if start + batch_size > len(y):
                start = 0
            yield x[start : start + batch_size], y[start : start + batch_size]
            start += batch_size

    return cycle(), tuple(x_all.shape[1:]), int(y_all.max()) + 1


def make_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    marks: Optional[dict] = None,
    loss_fn: Optional[Callable] = None,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One training step as every backend runs it: to device, zero grads, forward, backward, step.

    With `marks`, each step stores in it the clock after zero_grad ("zeroed"), after backward
    ("backward") and after the optimizer step ("optimizer"), for the step breakdown. The loss is
    `loss_fn(output, targets)`, cross-entropy by default.
    """
    clock = time.perf_counter
    loss_fn = loss_fn or F.cross_entropy

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = to_device(x, device), y.to(device)
        optimizer.zero_grad()  # torch >= 2: set_to_none=True
        if marks is not None:
            marks["zeroed"] = clock()
        loss = loss_fn(call_model(model, x), y)
        loss.backward()
        if marks is not None:
            marks["backward"] = clock()
        optimizer.step()
        if marks is not None:
            marks["optimizer"] = clock()
        return loss.detach()

    return step


def local_update(optimizer: torch.optim.Optimizer) -> ContextManager:
    """Context in which ``optimizer.step()`` updates from this rank's gradients without communicating.

    DDP's optimizer is torch's own and never communicates. Horovod's DistributedOptimizer
    allreduces in ``step()`` every gradient its hooks left out, no_sync or not, unless inside its
    ``skip_synchronize()``.
    """
    skip = getattr(optimizer, "skip_synchronize", None)
    return skip() if callable(skip) else contextlib.nullcontext()


def replicas(backend) -> int:
    """Model replicas one step trains: the processes, or every GPU DataParallel splits over."""
    return backend.replicas


def timed_steps(warm_step_s: list, min_steps: int, min_window_s: float) -> int:
    """Steps for the timed window: at least `min_steps`, and enough to last about `min_window_s`.

    Estimated from the median of the last warm-up steps (the slowest rank's, the same on every
    rank), so every rank runs the same count.
    """
    if min_window_s <= 0 or not warm_step_s:
        return min_steps
    typical = statistics.median(warm_step_s[-WINDOW:])
    return int(max(min_steps, min(MAX_STEPS, math.ceil(min_window_s / max(typical, 1e-6)))))


def run_training(backend, spec: ModelSpec, settings, scaling: str = "weak") -> dict:
    """Time the steps of `spec` under `backend` after a warm-up; this rank's numbers.

    `settings` carries the worker's arguments: data, batch_size, warmup (steps, at least),
    max_warmup (seconds), steps, min_window (seconds), seed. `scaling` "weak" gives every rank
    `batch_size` samples per step; "strong" splits a global batch of `batch_size` over the
    ranks. Warm-up runs until step times settle (warmup.py). The timed window has at least
    `steps` steps and lasts at least about `min_window`; then, for multi-process backends, half
    as many pairs of steps with and without gradient sync.
    """
    data, batch_size, seed = settings.data, settings.batch_size, settings.seed
    warmup, steps, min_window_s, max_warmup_s = (
        settings.warmup,
        settings.steps,
        settings.min_window,
        settings.max_warmup,
    )
    device = backend.device
    if scaling == "strong":
        if batch_size % backend.world_size:
            raise ValueError(f"strong scaling splits --batch-size {batch_size} over {backend.world_size} ranks")
        per_rank = batch_size // backend.world_size
    else:
        per_rank = batch_size
    step_batch = per_rank * (replicas(backend) if backend.world_size == 1 else 1)
    loss_fn = None
    if spec.kind == "builtin":
        batches, in_shape, classes = make_batches(backend, data, step_batch, seed)
        memory_kind = reset_peak_memory(device)
        torch.manual_seed(seed)
        module = build_model(spec.name, in_shape, classes, **spec.kwargs)
    else:  # your factory: its own batch, or a synthetic one of --input-shape (factory.py)
        memory_kind = reset_peak_memory(device)
        input_shape, classes = getattr(settings, "input_shape", None), getattr(settings, "classes", 10)
        built = build_factory(spec, input_shape, classes, step_batch, seed, device)
        module, loss_fn = built.module, built.loss
        inputs, targets = built.inputs, built.targets
        if scaling == "strong" and input_shape is None:  # its example batch is the global one: this rank's share
            inputs, targets = take(inputs, targets, backend.rank, backend.world_size)
        step_batch = per_rank = batch_samples(inputs)
        batches = itertools.repeat((inputs, targets))
    parameters = count_parameters(module)
    param_bytes = model_facts(module)["param_bytes"]
    grad_bytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    model = backend.wrap_model(module)
    optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9), model)
    marks: dict = {}
    step = make_step(model, optimizer, device, marks, loss_fn)

    def one_step() -> float:
        loss = step(*next(batches))
        device_sync(device)
        return float(loss)

    warm = warm_up(backend, one_step, max(1, warmup), max_warmup_s)
    min_steps = steps
    steps = timed_steps(warm["warmup_s"], min_steps, min_window_s)
    backend.barrier()

    step_s, losses, parts = [], [], []
    window_start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step(*next(batches))
        device_sync(device)
        t1 = time.perf_counter()
        step_s.append(t1 - t0)
        losses.append(loss)
        parts.append(step_parts(marks, t0, t1))
    window_s = time.perf_counter() - window_start
    result = {
        "model": spec.label,
        "model_spec": str(spec),
        "parameters": parameters,
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "batch_per_rank": per_rank,
        "samples_per_step": step_batch,
        "replicas": replicas(backend),
        "scaling": scaling,
        "warmup": len(warm["warmup_s"]),
        "warmup_settled": warm["warmup_settled"],
        "warmup_s": warm["warmup_s"],
        "warmup_losses": warm["warmup_losses"],
        "steps": steps,
        "min_window_s": min_window_s,
        "step_s": step_s,
        "window_s": window_s,
        "losses": [float(loss) for loss in losses],
        "loss_step": max(1, warmup),  # the loss compared across rows: after --warmup steps, which every launch runs
        "model_state_bytes": model_state_bytes(model, optimizer),  # after a step: gradients and state exist
    }

    if backend.MULTI_PROCESS:
        # Communication overhead and the step breakdown: pairs of steps with and without gradient
        # sync, order alternating, timed in parts (breakdown.py).
        backend.barrier()
        result.update(run_pairs(backend, model, optimizer, step, marks, batches, max(1, (steps + 1) // 2)))
    else:
        result["breakdown"] = window_breakdown(parts)  # one process: nothing to communicate

    result.update(peak_memory_bytes=peak_memory_bytes(device), memory_kind=memory_kind, **peak_memory(device))
    if getattr(settings, "trace", None):  # after every measurement: the profiler slows what it records
        from .trace import write_trace

        name = spec.label if scaling == "weak" else f"{spec.label} {scaling}"
        result["trace"] = write_trace(backend, step, batches, settings.trace, name)
    backend.barrier()
    return result
