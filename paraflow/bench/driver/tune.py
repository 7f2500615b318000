"""`paraflow bench --tune`: each backend's communication knobs over a small grid, one launch per setting.

DDP's gradient buckets (``bucket_cap_mb``, ``gradient_as_bucket_view``) and horovod's tensor
fusion (``fusion_threshold_mb``, ``cycle_time_ms``) decide how gradients are batched into
messages; the best values depend on the model, the link and the process count, and horovod's
are read once at start-up, so every setting is a launch of its own. The grid is run at the
largest process count for every launcher of a tunable backend, after the default launches, in
rounds that visit every backend before the next setting of any, until the time budget is spent
(settings left out are listed as not run). The tables' tuned row is the setting with the lowest
median step time, per model.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Optional

from ...errors import ConfigurationError
from ..model_spec import option_value

__all__ = ["TUNE_GRID", "TUNE_TAG", "grid_for", "tune_cells", "parse_tune_values"]

TUNE_TAG = "tune"
#: Knob -> values tried, each library's default among them (DDP: 25 MB buckets, no bucket view;
#: horovod: 128 MB fusion buffer, 1 ms cycle); fusion 0 turns fusion off, a 5 ms cycle lets more
#: tensors gather before each batch is sent.
TUNE_GRID = {
    "bucket_cap_mb": (1, 25, 100),
    "gradient_as_bucket_view": (False, True),
    "fusion_threshold_mb": (0, 4, 128),
    "cycle_time_ms": (0.5, 1, 5),
}


def parse_tune_values(items: list) -> dict:
    """`["bucket_cap_mb=1,25", ...]` -> {"bucket_cap_mb": (1, 25)}; unknown knobs are an error."""
    grid = {}
    for item in items or []:
        key, eq, values = item.partition("=")
        key = key.strip()
        if not eq or key not in TUNE_GRID or not values.strip():
            raise ConfigurationError(
                f"--tune-values {item!r}: give KNOB=V1,V2 with KNOB one of {', '.join(TUNE_GRID)} "
                "(e.g. --tune-values bucket_cap_mb=1,25)."
            )
        grid[key] = tuple(option_value(v) for v in values.split(",") if v.strip())
    return grid


def grid_for(options: frozenset, values: Optional[dict] = None) -> list:
    """Every setting (a sorted tuple of (knob, value)) of the knobs a backend takes, [] if none."""
    grid = {**TUNE_GRID, **(values or {})}
    knobs = sorted(k for k in grid if k in options)
    return [tuple(zip(knobs, combo)) for combo in itertools.product(*(grid[k] for k in knobs))] if knobs else []


def tune_cells(train_cells: list, values: Optional[dict], options_of) -> list:
    """Launches of every setting at the largest process count of each tunable backend and launcher,
    interleaved across them; `options_of(backend)` gives the option names a backend takes."""
    multi = [c for c in train_cells if c.nproc >= 2]
    if not multi:
        return []
    widest = max(c.nproc for c in multi)
    per_cell = []
    for cell in (c for c in multi if c.nproc == widest):
        grid = grid_for(options_of(cell.backend), values)
        per_cell.append([replace(cell, sweep=False, tag=f"{TUNE_TAG}-{_slug(s)}", options=s, repeat=0) for s in grid])
    return [c for round_ in itertools.zip_longest(*per_cell) for c in round_ if c is not None]


def _slug(options) -> str:
    return "+".join(f"{k}={v}" for k, v in options)
