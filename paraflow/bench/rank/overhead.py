"""Abstraction overhead, per rank: the same step through paraflow and by hand, interleaved.

The raw library is set up first (init_process_group or hvd.init), then paraflow joins the job
it started. Three identical models (same seed) are trained in turn with the same step function:
one built by paraflow (wrap_model, wrap_optimizer) and two by hand (the backend's ``raw_loop``);
the second hand-built one is an A/A control, a measurement that must find no difference. Each
round runs one step of each side, in an order that cycles through all six, and every step is
timed after a device sync. The rounds give paired ratios (paraflow / raw, control / raw).

Then a few more paraflow steps run under a profiler that measures, directly, the time spent in
paraflow's own Python per step (ownprofile.py), and how late each bounded wait noticed that the
library had finished.
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Callable, Optional

import torch

from ...examples.models import build_model
from ..driver.config import ModelSpec
from .ownprofile import profile_own_code
from .train_loop import LEARNING_RATE, device_sync, make_batches, make_step

__all__ = ["run_overhead", "rounds_within", "SIDES", "ORDERS", "MIN_ROUNDS"]

SIDES = ("paraflow", "raw", "control")
ORDERS = list(itertools.permutations(SIDES))  # each side first, second and last equally often


#: Fewest rounds a time budget may leave: 20 blocks of 3.
MIN_ROUNDS = 60


def rounds_within(backend, asked: int, round_s: float, max_seconds: float) -> int:
    """Rounds to run: `asked`, or as many as fit in `max_seconds` at the slowest rank's `round_s`
    (never fewer than MIN_ROUNDS or more than asked); the same on every rank."""
    slowest = float(backend.allreduce(torch.tensor([round_s], dtype=torch.float64), op="max").item())
    fit = int(max_seconds / max(slowest, 1e-6))
    return min(asked, max(MIN_ROUNDS, fit))


def _model(spec: ModelSpec, in_shape, classes: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(spec.name, in_shape, classes, **spec.kwargs)


def run_overhead(
    backend_name: str,
    spec: ModelSpec,
    data: str,
    batch_size: int,
    warmup: int,
    pairs: int,
    seed: int,
    profile_steps: int = 20,
    max_seconds: float = 20.0,
    after_init: Optional[Callable[[], None]] = None,
) -> dict:
    """Time `pairs` rounds of paraflow / raw / control steps of `spec` (fewer when they would take
    longer than about `max_seconds`, at least MIN_ROUNDS); returns this rank's numbers.
    `after_init` runs once both the raw library and paraflow have started (the benchmark pins there)."""
    import paraflow

    from ...core.registry import spec as registered

    registration = registered(backend_name)
    raw = registration.load().raw_loop(**registration.presets)
    control = registration.load().raw_loop(**registration.presets)
    if raw is None:
        raise paraflow.ConfigurationError(f"backend {backend_name!r} has no hand-written loop to compare with.")
    raw.init()
    backend = paraflow.init(backend_name)
    if after_init is not None:
        after_init()
    try:
        device = backend.device
        batches = {side: make_batches(backend, data, batch_size, seed) for side in SIDES}
        _, in_shape, classes = batches["raw"]
        model_pf = backend.wrap_model(_model(spec, in_shape, classes, seed))
        opt_pf = backend.wrap_optimizer(
            torch.optim.SGD(model_pf.parameters(), lr=LEARNING_RATE, momentum=0.9), model_pf
        )
        model_raw, opt_raw = raw.wrap(_model(spec, in_shape, classes, seed), device, LEARNING_RATE)
        model_aa, opt_aa = control.wrap(_model(spec, in_shape, classes, seed), device, LEARNING_RATE)
        steps = {
            "paraflow": make_step(model_pf, opt_pf, device),
            "raw": make_step(model_raw, opt_raw, device),
            "control": make_step(model_aa, opt_aa, device),
        }

        def run(side: str) -> float:
            t0 = time.perf_counter()
            steps[side](*next(batches[side][0]))
            device_sync(device)
            return time.perf_counter() - t0

        warm_rounds = [sum(run(side) for side in SIDES) for _ in range(max(warmup, 10))]
        rounds = rounds_within(backend, pairs, statistics.median(warm_rounds[len(warm_rounds) // 2 :]), max_seconds)
        backend.barrier()
        times = {side: [] for side in SIDES}
        for i in range(rounds):
            for side in ORDERS[i % len(ORDERS)]:
                times[side].append(run(side))
        backend.barrier()
        own = profile_own_code(lambda: run("paraflow"), profile_steps)
        backend.barrier()
        result = {
            "rank": backend.rank,
            "world_size": backend.world_size,
            "device": str(device),
            "library": raw.library,
            "model": spec.label,
            "model_spec": str(spec),
            "pairs": rounds,
            "rounds_asked": pairs,
            "warmup": max(warmup, 10),
            "paraflow_step_s": times["paraflow"],
            "raw_step_s": times["raw"],
            "control_step_s": times["control"],
            **own,
            "paraflow_wrapper": f"{type(model_pf).__name__} / {type(opt_pf).__name__}",
            "raw_wrapper": f"{type(model_raw).__name__} / {type(opt_raw).__name__}",
        }
    finally:
        backend.shutdown()
        raw.shutdown()
    return result
