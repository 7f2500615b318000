"""Abstraction overhead, per rank: the same step through paraflow and by hand, interleaved.

The raw library is set up first (init_process_group or hvd.init), then paraflow joins the job
it started. Two identical models (same seed) are trained alternately with the same step
function, one built by paraflow (wrap_model, wrap_optimizer), one by hand (the backend's ``raw_loop``), the
order flipping every pair so neither side always runs first. Each step is timed after a device sync.
"""

from __future__ import annotations

import time

import torch

from ...examples.models import build_model
from ..driver.config import ModelSpec
from .train_loop import LEARNING_RATE, device_sync, make_batches, make_step

__all__ = ["run_overhead"]


def run_overhead(
    backend_name: str, spec: ModelSpec, data: str, batch_size: int, warmup: int, pairs: int, seed: int
) -> dict:
    """Time `pairs` paraflow/raw step pairs of `spec`; returns (rank, this rank's numbers)."""
    import paraflow

    from ...core.registry import spec as registered

    registration = registered(backend_name)
    raw = registration.load().raw_loop(**registration.presets)
    if raw is None:
        raise paraflow.ConfigurationError(f"backend {backend_name!r} has no hand-written loop to compare with.")
    raw.init()
    backend = paraflow.init(backend_name)
    try:
        device = backend.device
        batches_pf, in_shape, classes = make_batches(backend, data, batch_size, seed)
        batches_raw, _, _ = make_batches(backend, data, batch_size, seed)

        torch.manual_seed(seed)
        module_pf = build_model(spec.name, in_shape, classes, **spec.kwargs)
        torch.manual_seed(seed)
        module_raw = build_model(spec.name, in_shape, classes, **spec.kwargs)

        model_pf = backend.wrap_model(module_pf)
        opt_pf = backend.wrap_optimizer(
            torch.optim.SGD(model_pf.parameters(), lr=LEARNING_RATE, momentum=0.9), model_pf
        )
        model_raw, opt_raw = raw.wrap(module_raw, device, LEARNING_RATE)
        steps = {
            "paraflow": (make_step(model_pf, opt_pf, device), batches_pf),
            "raw": (make_step(model_raw, opt_raw, device), batches_raw),
        }

        for _ in range(warmup):
            for step, batches in steps.values():
                step(*next(batches))
        device_sync(device)
        backend.barrier()
        times = {"paraflow": [], "raw": []}
        for i in range(pairs):
            for side in ("paraflow", "raw") if i % 2 == 0 else ("raw", "paraflow"):
                step, batches = steps[side]
                t0 = time.perf_counter()
                step(*next(batches))
                device_sync(device)
                times[side].append(time.perf_counter() - t0)
        backend.barrier()
        result = {
            "rank": backend.rank,
            "world_size": backend.world_size,
            "device": str(device),
            "library": raw.library,
            "model": spec.label,
            "model_spec": str(spec),
            "pairs": pairs,
            "warmup": warmup,
            "paraflow_step_s": times["paraflow"],
            "raw_step_s": times["raw"],
            "paraflow_wrapper": f"{type(model_pf).__name__} / {type(opt_pf).__name__}",
            "raw_wrapper": f"{type(model_raw).__name__} / {type(opt_raw).__name__}",
        }
    finally:
        backend.shutdown()
        raw.shutdown()
    return result
