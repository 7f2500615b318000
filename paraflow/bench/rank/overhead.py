"""Abstraction overhead, per rank: the same step through paraflow and by hand, interleaved.

It runs after a launch's training, on the library paraflow started there (the process group,
or horovod): the hand-written loops use it as the tutorials' scripts use theirs. Three sides
train identical models (same seed) with the same step function: paraflow
(wrap_model, wrap_optimizer), raw (the backend's ``raw_loop``, by hand) and an A/A control (a
second raw loop: a measurement that must find no difference). Each side has INSTANCES models,
built in a shuffled order, and each round steps every instance once in a shuffled order (the
same shuffles on every rank, from the seed); every step is timed after a device sync. Instance
j of paraflow against instance j of raw in the same round is a pair: the rounds give paired
ratios (paraflow / raw, control / raw). Several instances per side, because identical models
step at different speeds by where their tensors landed in memory, and the first one built was
often the slowest: one per side, paraflow's built first, had put about 1-3 % on paraflow.
"""

from __future__ import annotations

import math
import random
import statistics
import time

import torch

from ...examples.models import build_model
from ..backends import raw_loop
from ..model_spec import ModelSpec
from .train_loop import LEARNING_RATE, device_sync, make_batches, make_step

__all__ = ["run_overhead", "pairs_within", "build_order", "step_orders", "SIDES", "INSTANCES", "MIN_PAIRS"]

SIDES = ("paraflow", "raw", "control")
#: Models per side (see the module docstring).
INSTANCES = 3

#: Fewest pairs a time budget may leave: 20 blocks of 3.
MIN_PAIRS = 60


def build_order(rng: random.Random) -> list:
    """(side, instance) of every model, in the order they are built."""
    order = [(side, j) for side in SIDES for j in range(INSTANCES)]
    rng.shuffle(order)
    return order


def step_orders(rng: random.Random, rounds: int) -> list:
    """Per round, (side, instance) of every model in the order they step."""
    return [build_order(rng) for _ in range(rounds)]


def pairs_within(backend, asked: int, pair_s: float, max_seconds: float) -> int:
    """Pairs to run: `asked`, or as many as fit in `max_seconds` at the slowest rank's `pair_s`
    (one step of each side; never fewer than MIN_PAIRS or more than asked); the same on every rank."""
    slowest = float(backend.allreduce(torch.tensor([pair_s], dtype=torch.float64), op="max").item())
    fit = int(max_seconds / max(slowest, 1e-6))
    return min(asked, max(MIN_PAIRS, fit))


def _model(spec: ModelSpec, in_shape, classes: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(spec.name, in_shape, classes, **spec.kwargs)


def run_overhead(
    backend,
    spec: ModelSpec,
    data: str,
    batch_size: int,
    warmup: int,
    pairs: int,
    seed: int,
    max_seconds: float = 20.0,
) -> dict:
    """Time `pairs` paraflow / raw / control steps of `spec` each on the started paraflow
    `backend` (fewer when they would take longer than about `max_seconds`, at least MIN_PAIRS;
    rounded up to whole rounds of INSTANCES), returns this rank's numbers."""
    from ...errors import ConfigurationError

    raw = raw_loop(backend.name)
    loops = {"raw": raw, "control": raw_loop(backend.name)}
    if raw is None:
        raise ConfigurationError(f"backend {backend.name!r} has no hand-written loop to compare with.")
    device = backend.device
    plan = random.Random(seed)  # the same builds and steps in the same order on every rank
    batches = {side: make_batches(backend, data, batch_size, seed) for side in SIDES}
    _, in_shape, classes = batches["raw"]
    steps, wrappers = {}, {}
    for side, j in build_order(plan):
        if side == "paraflow":
            model = backend.wrap_model(_model(spec, in_shape, classes, seed))
            optimizer = backend.wrap_optimizer(
                torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9), model
            )
        else:
            model, optimizer = loops[side].wrap(_model(spec, in_shape, classes, seed), device, LEARNING_RATE)
        steps[side, j] = make_step(model, optimizer, device)
        wrappers[side] = f"{type(model).__name__} / {type(optimizer).__name__}"

    def run(instance: tuple) -> float:
        t0 = time.perf_counter()
        steps[instance](*next(batches[instance[0]][0]))
        device_sync(device)
        return time.perf_counter() - t0

    warm_pairs = [sum(run(i) for i in order) / INSTANCES for order in step_orders(plan, max(warmup, 10))]
    count = pairs_within(backend, pairs, statistics.median(warm_pairs[len(warm_pairs) // 2 :]), max_seconds)
    backend.barrier()
    times = {side: [[] for _ in range(INSTANCES)] for side in SIDES}
    for order in step_orders(plan, math.ceil(count / INSTANCES)):
        for side, j in order:
            times[side][j].append(run((side, j)))
    backend.barrier()
    # pair k of a side: instance k % INSTANCES in round k // INSTANCES
    times = {side: [t for row in zip(*times[side]) for t in row] for side in SIDES}
    result = {
        "rank": backend.rank,
        "world_size": backend.world_size,
        "device": str(device),
        "library": raw.library,
        "model": spec.label,
        "model_spec": str(spec),
        "pairs": len(times["paraflow"]),
        "pairs_asked": pairs,
        "seconds_allowed": max_seconds,
        "instances": INSTANCES,
        "warmup_rounds": max(warmup, 10),
        "paraflow_step_s": times["paraflow"],
        "raw_step_s": times["raw"],
        "control_step_s": times["control"],
        "paraflow_wrapper": wrappers["paraflow"],
        "raw_wrapper": wrappers["raw"],
    }
    return result
