"""Where a step's time goes, per rank: timestamps on the interleaved sync / no-sync pairs.

The pairs the communication overhead already runs (a step with gradient sync beside one
without, order alternating) are timed in parts, so the breakdown costs no extra steps:

- clocks in the step itself: after zero_grad, after backward returns, after optimizer.step;
- gradient-ready hooks (``register_post_accumulate_grad_hook``): the first gradient ready is when
  communication can start, the last is the end of backward's compute;
- for an optimizer that waits for the gradients in ``step()`` (horovod's ``synchronize``), the
  start and end of that wait.

From one pair (s synced, n not): compute = n's forward + backward; optimizer = n's optimizer step
(a local update); exposed = what s waits for communication after its compute: (s's backward tail
after the last gradient - n's tail; DDP and fsdp wait for their buckets there) + s's wait in
``synchronize``; overlapped = s's backward from the first gradient ready to the last, while
communication is pending (an upper bound: the span in which it can run hidden); other = s's step
- compute - exposed - optimizer (to device, zero_grad, device sync, and compute slowed by
communication sharing the cores). Without gradient hooks (a backend whose parameters take their
gradients outside autograd's accumulation) the tail is the whole backward and overlapped is None.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Callable

import torch

from ..backends import no_sync_communicates

__all__ = ["PARTS", "run_pairs", "step_parts", "pair_breakdown", "window_breakdown", "gradient_clock"]

#: Per-pair lists a rank writes under "breakdown" (seconds); `step_s` is the synced step they split.
PARTS = ("compute_s", "overlapped_comm_s", "exposed_comm_s", "optimizer_s", "step_s")
clock = time.perf_counter


@contextlib.contextmanager
def gradient_clock(model: torch.nn.Module, marks: dict) -> Iterator[None]:
    """Record in `marks` the first ("first_grad") and last ("last_grad") gradient ready of each backward."""

    def ready(_param: torch.Tensor) -> None:
        now = clock()
        marks.setdefault("first_grad", now)
        marks["last_grad"] = now

    handles = [p.register_post_accumulate_grad_hook(ready) for p in model.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def timed_synchronize(optimizer, marks: dict) -> Iterator[None]:
    """Record the start and end of the optimizer's gradient wait (horovod's ``synchronize``), if it has one."""
    synchronize = getattr(optimizer, "synchronize", None)
    if not callable(synchronize):
        yield
        return

    def timed() -> None:
        marks["sync_start"] = clock()
        try:
            return synchronize()
        finally:
            marks["sync_end"] = clock()

    optimizer.synchronize = timed
    try:
        yield
    finally:
        optimizer.synchronize = synchronize


def step_parts(marks: dict, start: float, end: float) -> dict:
    """One step's durations (seconds) from its marks, taken between `start` and `end`."""
    zeroed, backward, optimizer = marks["zeroed"], marks["backward"], marks["optimizer"]
    last = marks.get("last_grad")
    first = marks.get("first_grad")
    return {
        "step": end - start,
        "forward_backward": backward - zeroed,
        "optimizer": optimizer - backward,
        "tail": backward - (last if last is not None else zeroed),
        "wait": marks["sync_end"] - marks["sync_start"] if "sync_end" in marks else 0.0,
        "overlap_window": None if first is None else last - first,
    }


def pair_breakdown(synced: dict, unsynced: dict, whole: bool = False) -> dict:
    """The breakdown (seconds) of a synced step, from it and the unsynced step of its pair.

    `whole`: the backend still communicates without gradient sync (fsdp gathers its parameters),
    so gradients are not ready at comparable moments: exposed communication is the whole
    forward + backward difference, and overlapped communication is not measured.
    """
    compute = unsynced["forward_backward"]
    optimizer = unsynced["optimizer"] - unsynced["wait"]
    if whole:
        exposed = synced["forward_backward"] - unsynced["forward_backward"] + synced["wait"] - unsynced["wait"]
    else:
        exposed = synced["tail"] - unsynced["tail"] + synced["wait"] - unsynced["wait"]
    return {
        "compute_s": compute,
        "overlapped_comm_s": None if whole else synced["overlap_window"],
        "exposed_comm_s": exposed,
        "optimizer_s": optimizer,
        "step_s": synced["step"],
    }


def window_breakdown(parts: list) -> dict:
    """The breakdown of steps that do not communicate (one process): no communication at all."""
    return {
        "compute_s": [p["forward_backward"] for p in parts],
        "overlapped_comm_s": [0.0] * len(parts),
        "exposed_comm_s": [0.0] * len(parts),
        "optimizer_s": [p["optimizer"] for p in parts],
        "step_s": [p["step"] for p in parts],
    }


def run_pairs(
    backend, model: torch.nn.Module, optimizer, step: Callable, marks: dict, batches: Iterator, pairs: int
) -> dict:
    """`pairs` pairs of steps with and without gradient sync, order alternating, timed in parts.

    `step` must fill `marks` (train_loop.make_step with marks). Returns sync_pair_step_s,
    no_sync_step_s and breakdown (lists of PARTS, one value per pair).
    """
    from .train_loop import device_sync, local_update  # the loop's own helpers (it imports this module)

    device = backend.device
    sync_s, no_sync_s = [], []
    breakdown: dict = {key: [] for key in PARTS}
    with gradient_clock(model, marks), timed_synchronize(optimizer, marks):
        for i in range(pairs):
            parts = {}
            for synced in (True, False) if i % 2 == 0 else (False, True):
                marks.clear()
                t0 = clock()
                if synced:
                    step(*next(batches))
                else:
                    with backend.no_sync(model), local_update(optimizer):
                        step(*next(batches))
                device_sync(device)
                t1 = clock()
                (sync_s if synced else no_sync_s).append(t1 - t0)
                parts[synced] = step_parts(marks, t0, t1)
            whole = no_sync_communicates(backend)
            for key, value in pair_breakdown(parts[True], parts[False], whole).items():
                breakdown[key].append(value)
    return {"sync_pair_step_s": sync_s, "no_sync_step_s": no_sync_s, "breakdown": _none_if_missing(breakdown)}


def _none_if_missing(breakdown: dict) -> dict:
    """A part no step could measure (no gradient hook fired) is None rather than a list of Nones."""
    return {k: (None if any(v is None for v in values) else values) for k, values in breakdown.items()}
