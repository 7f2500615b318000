"""The tuned row of a training table: of a backend's tuning settings, the one with the lowest step time.

Every setting of `paraflow bench --tune` is a launch of its own (driver/tune.py); each gives a
candidate row built exactly as the default rows are. Per model and scaling the candidate with the
lowest median step time becomes the tuned row, named by its setting; every candidate is kept in
the `tuning` table. A setting measured once has an interval from its steps alone, and picking the
lowest of several noisy figures favours a lucky launch: the tuned row is optimistic by that much.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["TUNING_COLUMNS", "DEFAULT_SETTING", "tuned_row"]

DEFAULT_SETTING = "default"
TUNING_COLUMNS = {
    "model": "model",
    "scaling": "scaling",
    "backend": "backend",
    "launcher": "launcher",
    "processes": "procs",
    "setting": "setting",
    "launches": "launches",
    "step_ms_median": "step ms median",
    "samples_per_s": "samples/s",
    "chosen": "chosen",
    "status": "status",
}


def _label(options: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())


def tuned_row(settings: dict, spec: str, scaling: str, build: Callable) -> tuple:
    """(row, estimates, candidates) for one model and scaling from {setting group: launches};
    `build(group, launches, spec, scaling)` makes a row as the default rows are made. The row is
    None when no setting was measured."""
    candidates, best = [], None
    for group, launches in settings.items():
        row, est = build(group, launches, spec, scaling)
        row["setting"] = _label(launches[0]["options"])
        candidates.append(row)
        if row.get("step_ms_median") is not None and (
            best is None or row["step_ms_median"] < best[0]["step_ms_median"]
        ):
            best = (row, est)
    table = [{**{k: c.get(k) for k in TUNING_COLUMNS}, "chosen": best is not None and c is best[0]} for c in candidates]
    for entry, c in zip(table, candidates):
        for key in ("step_ms_median", "samples_per_s"):
            entry[f"{key}_low"], entry[f"{key}_high"] = c.get(f"{key}_low"), c.get(f"{key}_high")
    if best is None:
        return None, {}, table
    row, est = dict(best[0]), best[1]
    row["setting"] = f"tuned: {row['setting']} (best of {len(candidates)})"
    return row, est, table
