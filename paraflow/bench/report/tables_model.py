"""The cost model's tables: the α-β fits, the projection to many hosts, the published comparison.

Computation only, on numbers the run already measured (the collective sweep, the training rows
and their no-sync steps): built with every run, and again by ``paraflow bench project DIR``
from a results folder.
"""

from __future__ import annotations

from typing import Optional

from .costmodel import ALGORITHMS, FIT_COLUMNS, fit_sweep
from .predict import predict_rows
from .projection import project, published_comparison

__all__ = ["FIT_COLUMNS", "PROJECTION_COLUMNS", "PUBLISHED_COLUMNS", "model_tables", "model_sections", "MODEL_NOTE"]

PROJECTION_COLUMNS = {
    "model": "model",
    "backend": "backend",
    "launcher": "launcher",
    "link": "link",
    "hosts": "hosts",
    "compute_ms": "compute ms",
    "comm_ms": "comm ms",
    "step_ms": "step ms",
    "samples_per_s": "samples/s",
    "efficiency": "weak-scaling eff",
}
PUBLISHED_COLUMNS = {
    "model": "model",
    "parameters": "params",
    "grad_mb": "grad MB",
    "messages": "fused buffers",
    "compute_ms": "compute ms (P100, batch 64)",
    "comm_ms": "allreduce ms",
    "latency_ms": "of which latency ms",
    "efficiency_no_overlap": "projected eff, no overlap",
    "efficiency_overlap": "projected eff, backward overlap",
    "published": "published eff",
}
MODEL_NOTE = (
    "PROJECTION, not measurement: one rank per host, the fitted latency α of each backend, the link's rate x "
    "1448/1514 (TCP payload) as bandwidth (or the fitted one), no overlap of communication with compute; "
    "efficiency = compute / projected step. Forms: " + "; ".join(f"{k}: {v}" for k, v in ALGORITHMS.items()) + "."
)


def model_tables(cells: list, training: list, sweep: list, header: Optional[dict] = None) -> dict:
    """costmodel_fit, predictions (what each training row's prediction used), projection, published.

    Adds predicted_step_ms and prediction_error to the multi-process rows of `training` in place.
    """
    fits = fit_sweep(sweep, header)
    details = predict_rows(training, fits, cells)
    return {
        "costmodel_fit": fits,
        "predictions": details,
        "projection": project(details),
        "published": published_comparison(),
    }


def model_sections(tables: dict, fmt: str) -> list:
    """(title, text) pairs for the terminal and results.md."""
    from .tables import render

    sections = []
    if tables.get("costmodel_fit"):
        sections.append(
            (
                "Cost model: allreduce latency α and bandwidth B fitted to the sweep (raw library's times)",
                render(tables["costmodel_fit"], FIT_COLUMNS, fmt),
            )
        )
    if tables.get("projection"):
        sections.append(
            (
                "PROJECTION to many hosts from the cost model (not measured)",
                render(tables["projection"], PROJECTION_COLUMNS, fmt) + "\n\n" + MODEL_NOTE,
            )
        )
    if tables.get("published"):
        first = tables["published"][0]
        sections.append(
            (
                f"PROJECTION against Horovod's published scaling ({first['gpus']} GPUs, {first['link']}, "
                f"α {first['alpha_us']:g} µs per ring step)",
                render(tables["published"], PUBLISHED_COLUMNS, fmt),
            )
        )
    return sections
