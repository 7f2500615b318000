"""The timed training loop one rank runs for one model (the same loop for every backend).

Per rank it records: every step's wall time after synchronising the device, the wall time of the
whole timed window (started after a barrier), each step's loss, peak memory, the model state it
holds (parameters, gradients, optimizer state), and, for multi-process backends, interleaved pairs
of steps with and without gradient synchronisation. Everything across ranks (max per step,
throughput) is computed later from these raw numbers.

Warm-up ends when step times have settled, not after a fixed count. The first steps of a run are
slow for reasons that have nothing to do with the method measured: DDP rebuilds its buckets on the
first iteration, horovod negotiates each new tensor, the allocator and caches fill, and a launcher's
siblings may still be starting. Warm-up runs until the median of the last WINDOW steps is within
TOLERANCE of the median of the WINDOW before (at least `min_steps`, at most WARMUP_MAX_STEPS steps
or WARMUP_MAX_SECONDS of steps). Each step's time is the slowest rank's, shared by an allreduce, so
every rank stops after the same step.

Model state: bytes of parameters, gradients and optimizer state one rank holds. Counted from the
tensors themselves, not from the process's memory: a replicating backend (DDP, horovod) holds the
whole of each, a sharding one (fsdp) only its DTensor shards, so the ratio between them is what
sharding saves, free of the runtime's own memory. Buffers, gradient buckets and parameters gathered
for the duration of a forward are not model state held between steps and are left out.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
import time
from collections.abc import Iterable, Iterator
from typing import Callable, ContextManager, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ...examples.data import load_dataset
from ...examples.models import build_model
from ..model_spec import ModelSpec
from .factory import batch_samples, build_factory, call_model, model_facts, take, to_device

__all__ = [
    "run_training",
    "make_batches",
    "make_step",
    "local_update",
    "device_sync",
    "reset_peak_memory",
    "peak_memory",
    "peak_rss_bytes",
    "LEARNING_RATE",
    "warm_up",
    "settled",
    "model_state_bytes",
    "run_pairs",
]

LEARNING_RATE = 0.05
#: Upper bound on timed steps however fast a step is.
MAX_STEPS = 2000


def device_sync(device: torch.device) -> None:
    """Wait for queued GPU work so a timer reads the real end of a step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window: this process's peak resident set size (VmHWM; Linux: writing 5
    to clear_refs) and, on a GPU, torch's peak allocated memory."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux, or not allowed: the peak since the process started
        pass
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


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
    starts = range(0, len(y) - batch_size + 1, batch_size)  # whole batches only
    batches = itertools.cycle([(x[i : i + batch_size], y[i : i + batch_size]) for i in starts])
    return batches, tuple(x_all.shape[1:]), int(y_all.max()) + 1


def make_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    loss_fn: Optional[Callable] = None,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One training step as every backend runs it: to device, zero grads, forward, backward, step.

    The loss is `loss_fn(output, targets)`, cross-entropy by default.
    """
    loss_fn = loss_fn or F.cross_entropy

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = to_device(x, device), y.to(device)
        optimizer.zero_grad()  # torch >= 2: set_to_none=True
        loss = loss_fn(call_model(model, x), y)
        loss.backward()
        optimizer.step()
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

    `settings` carries the worker's task (BenchConfig's fields of driver/runner.py's TASK_FIELDS,
    and compile): data, batch_size, warmup (steps, at least), max_warmup (seconds), steps,
    min_window (seconds), seed, input_shape, classes. `scaling` "weak" gives every rank
    `batch_size` samples per step; "strong" splits a global batch of `batch_size` over the
    ranks. Warm-up runs until step times settle (warm_up, below). The timed window has at least
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
    step_batch = per_rank * (backend.replicas if backend.world_size == 1 else 1)
    loss_fn = None
    if spec.kind == "builtin":
        batches, in_shape, classes = make_batches(backend, data, step_batch, seed)
        reset_peak_memory(device)
        torch.manual_seed(seed)
        module = build_model(spec.name, in_shape, classes, **spec.kwargs)
    else:  # your factory: its own batch, or a synthetic one of --input-shape (factory.py)
        reset_peak_memory(device)
        input_shape, classes = settings.input_shape, settings.classes
        built = build_factory(spec, input_shape, classes, step_batch, seed, device)
        module, loss_fn = built.module, built.loss
        inputs, targets = built.inputs, built.targets
        if scaling == "strong" and input_shape is None:  # its example batch is the global one: this rank's share
            inputs, targets = take(inputs, targets, backend.rank, backend.world_size)
        step_batch = per_rank = batch_samples(inputs)
        batches = itertools.repeat((inputs, targets))
    facts = model_facts(module)
    compiled = bool(settings.compile)
    model = backend.wrap_model(module, **({"compile": True} if compiled else {}))  # a plugin may predate compile=
    optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9), model)
    step = make_step(model, optimizer, device, loss_fn)

    def one_step() -> float:
        loss = step(*next(batches))
        device_sync(device)
        return float(loss)

    compile_s, first_loss = first_step(one_step) if compiled else (None, None)  # compiles: apart from warm-up
    warm = warm_up(backend, one_step, max(1, warmup), max_warmup_s)
    if compiled:  # losses count steps from the first, as eager ones do
        warm["warmup_losses"].insert(0, first_loss)
    min_steps = steps
    steps = timed_steps(warm["warmup_s"], min_steps, min_window_s)
    backend.barrier()

    step_s, losses = [], []
    window_start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step(*next(batches))
        device_sync(device)
        step_s.append(time.perf_counter() - t0)
        losses.append(loss)
    window_s = time.perf_counter() - window_start
    result = {
        "model": spec.label,
        "model_spec": str(spec),
        "compiled": compiled,
        "compile_s": compile_s,
        **facts,
        "batch_per_rank": per_rank,
        "samples_per_step": step_batch,
        "replicas": backend.replicas,
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

    if backend.MULTI_PROCESS:  # the communication overhead: pairs of steps with and without gradient sync
        backend.barrier()
        result.update(run_pairs(backend, model, optimizer, step, batches, max(1, (steps + 1) // 2)))

    result.update(peak_memory(device))
    backend.barrier()
    return result


def first_step(run_step: Callable[[], float]) -> tuple[float, float]:
    """(seconds, loss) of the first step of a compiled model, where torch.compile traces and
    compiles it (a graph per DDP bucket, the backward's too): its compile time, kept out of
    warm-up and of the timed window."""
    start = time.perf_counter()
    loss = run_step()
    return time.perf_counter() - start, loss


WINDOW = 5
TOLERANCE = 0.10
WARMUP_MAX_STEPS = 200
WARMUP_MAX_SECONDS = 2.0


def settled(times: list, window: int = WINDOW, tolerance: float = TOLERANCE) -> bool:
    """True when the last `window` times' median is within `tolerance` of the `window` before's."""
    if len(times) < 2 * window:
        return False
    last = statistics.median(times[-window:])
    before = statistics.median(times[-2 * window : -window])
    return abs(last - before) <= tolerance * last


def warm_up(backend, run_step: Callable[[], float], min_steps: int, max_seconds: float = WARMUP_MAX_SECONDS) -> dict:
    """Run untimed steps until their times settle; returns the slowest rank's times, this rank's
    losses and whether the times settled.

    `run_step` runs one step, synchronises the device and returns the loss. The stopping rule
    only reads numbers every rank shares (the count and the slowest-rank times), so all ranks
    stop together.
    """
    times: list = []
    losses: list = []
    while True:
        start = time.perf_counter()
        losses.append(run_step())
        elapsed = time.perf_counter() - start
        if backend.world_size > 1:
            elapsed = float(backend.allreduce(torch.tensor([elapsed], dtype=torch.float64), op="max").item())
        times.append(elapsed)
        if len(times) >= min_steps and settled(times):
            return {"warmup_s": times, "warmup_losses": losses, "warmup_settled": True}
        if len(times) >= max(min_steps, WARMUP_MAX_STEPS) or sum(times) >= max_seconds and len(times) >= min_steps:
            return {"warmup_s": times, "warmup_losses": losses, "warmup_settled": False}


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of `tensor` stored on this rank: a DTensor's local shard, else the whole tensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _total(tensors: Iterable) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += local_bytes(t)
    return total


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """{"parameters", "gradients", "optimizer"}: bytes this rank holds of each (see module doc).

    Parameters are the optimizer's (a sharding backend's model may have gathered ones swapped in
    between a forward and its backward), else the model's.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]] or list(model.parameters())
    return {
        "parameters": _total(params),
        "gradients": _total(p.grad for p in params),
        "optimizer": _total(value for state in optimizer.state.values() for value in state.values()),
    }


def run_pairs(backend, model: torch.nn.Module, optimizer, step: Callable, batches: Iterator, pairs: int) -> dict:
    """`pairs` pairs of steps with and without gradient sync, order alternating; their times."""
    sync_s, no_sync_s = [], []
    for i in range(pairs):
        for synced in (True, False) if i % 2 == 0 else (False, True):
            t0 = time.perf_counter()
            if synced:
                step(*next(batches))
            else:
                with backend.no_sync(model), local_update(optimizer):
                    step(*next(batches))
            device_sync(backend.device)
            (sync_s if synced else no_sync_s).append(time.perf_counter() - t0)
    return {"sync_pair_step_s": sync_s, "no_sync_step_s": no_sync_s}
