"""Every table of a run from the raw per-rank numbers, and how a table reads as text.

Builders take the JSON-ready cell records (``CellResult.to_dict()``, as stored in results.json)
and return rows of plain numbers, rounded once so every output shows the same values; a figure
with a 95% interval carries it as ``key_low`` / ``key_high`` beside ``key``. Rendering
(tabulate) is separate and lazy.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..driver.config import DEFAULT_MARGIN
from . import intervals, metrics
from .launches import groups, task_of
from .tables_collectives import MEMCPY_COLUMNS, SWEEP_FOOTER_COLUMNS, memcpy_rows, sweep_columns, sweep_rows
from .tables_model import model_tables
from .tables_overhead import OVERHEAD_COLUMNS, OVERHEAD_TARGET, overhead_rows
from .tables_training import TRAINING_COLUMNS, training_rows
from .verdict import overhead_lines, sweep_lines, training_verdict

__all__ = [
    "TRAINING_COLUMNS",
    "SWEEP_FOOTER_COLUMNS",
    "MEMCPY_COLUMNS",
    "OVERHEAD_COLUMNS",
    "OVERHEAD_TARGET",
    "sweep_columns",
    "build_tables",
    "noise_floor",
    "render",
    "format_value",
    "format_cell",
    "csv_columns",
]

PERCENT_KEYS = {
    "scaling_efficiency",
    "comm_overhead",
    "busbw_vs_memcpy",
    "avg_busbw_vs_memcpy",
    "abstraction_overhead",
    "paired_overhead",
    "control_overhead",
    "aa_floor",
    "direct_overhead_low",
    "direct_overhead_high",
    "prediction_error",
    "efficiency",
    "efficiency_no_overlap",
    "efficiency_overlap",
    "published",
    "rms_residual",
    "max_residual",
}
SIGNED_PERCENT_KEYS = {"abstraction_overhead", "paired_overhead", "control_overhead", "prediction_error"}
#: Which figures a row's "noisy" names mark.
NOISY_KEYS = {
    "step": ("step_ms_median",),
    "samples/s": ("samples_per_s", "samples_per_s_per_process"),
    "comm": ("comm_overhead",),
}


def _options(config: Optional[dict]) -> dict:
    config = config or {}
    return {
        "noisy": config.get("noisy", 0.10),
        "margin": config.get("margin", DEFAULT_MARGIN),
        "units": config.get("units", "GB/s"),
        "scaling": tuple(config.get("scaling") or ("weak",)),
    }


def noise_floor(cells: list) -> Optional[dict]:
    """The A/A check: the same cell launched twice; spread = |m1 - m2| / mean of their median step times."""
    for group, launches in groups(cells, "train", aa=True).items():
        spec = launches[0]["models"][0]
        medians = []
        for cell in launches:
            tasks = task_of(cell, f"train/{spec}")
            if tasks:
                medians.append(intervals.median(metrics.slowest_rank_per_step([t["step_s"] for t in tasks])))
        if len(medians) < 2:
            return {"cell": group, "model": spec, "medians_ms": [m * 1e3 for m in medians], "spread": None}
        spread = abs(medians[0] - medians[1]) / ((medians[0] + medians[1]) / 2)
        return {
            "cell": group,
            "model": spec,
            "medians_ms": [round(m * 1e3, 3) for m in medians],
            "spread": round(spread, 4),
        }
    return None


def build_tables(cells: list, header: Optional[dict] = None, config: Optional[dict] = None) -> dict:
    """Every table from the cell records, and the verdict.

    Tables: training, sweep (+ sweep_footer, sweep_unsupported), memcpy, overhead; noise_floor
    (the A/A check); verdict (list of {claim, text}); the cost model's costmodel_fit, predictions,
    projection and published (tables_model.py). `config` (results.json's) gives the noisy
    bound, the verdict's margin, the bandwidth unit and the scaling modes.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many small tensor operations: on a busy machine 2 threads took 20x longer
    try:
        return _build(cells, {**_options(config), "header": header})
    finally:
        torch.set_num_threads(threads)


def _build(cells: list, opts: dict) -> dict:
    memcpy = memcpy_rows(cells, opts["units"])
    sweep, footers, unsupported = sweep_rows(cells, memcpy, opts["units"])
    tuning: list = []
    training, estimates = training_rows(cells, opts["scaling"], opts["noisy"], tuning)
    overhead = overhead_rows(cells)
    floor = noise_floor(cells)
    spread = (floor or {}).get("spread") or 0.0
    verdict = training_verdict(training, estimates, spread, opts["margin"])
    verdict += overhead_lines(overhead) + sweep_lines(footers)
    return {
        "training": training,
        "tuning": tuning,
        "sweep": sweep,
        "sweep_footer": footers,
        "sweep_unsupported": unsupported,
        "memcpy": memcpy,
        "overhead": overhead,
        "noise_floor": floor,
        "verdict": verdict,
        **model_tables(cells, training, sweep, opts.get("header")),
    }


def csv_columns(columns: dict, rows: list) -> list:
    """The CSV header: every column, each figure with an interval followed by its _low and _high."""
    keys = []
    for key in columns:
        keys.append(key)
        if any(f"{key}_low" in row for row in rows):
            keys += [f"{key}_low", f"{key}_high"]
    return keys


def format_value(key: str, value) -> str:
    """How a plain value reads on the terminal and in Markdown."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in PERCENT_KEYS:
        return f"{value * 100:+.2f}%" if key in SIGNED_PERCENT_KEYS else f"{value * 100:.1f}%"
    if key in ("parameters", "size_bytes", "count"):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def format_cell(key: str, row: dict) -> str:
    """A row's value for `key`, with its interval when it has one: `9.08 ±4%`, `42.1% [38.0–47.3]`."""
    value, low, high = row.get(key), row.get(f"{key}_low"), row.get(f"{key}_high")
    text = format_value(key, value)
    if value is None or low is None or high is None:
        return text
    if key in SIGNED_PERCENT_KEYS:
        text += f" [{low * 100:+.2f}, {high * 100:+.2f}]"
    elif key in PERCENT_KEYS:
        text += f" [{low * 100:.1f}–{high * 100:.1f}]"
    else:
        width = intervals.relative_halfwidth(value, low, high) * 100
        text += f" ±{width:.1f}%" if width < 9.95 else f" ±{width:.0f}%"
    noisy = str(row.get("noisy") or "")
    if any(key in NOISY_KEYS.get(name.strip(), ()) for name in noisy.split(",")):
        text += " noisy"
    return text


def render(rows: list, columns: dict, fmt: str = "simple", drop: tuple = (), max_status: int = 60) -> str:
    """`rows` as text with tabulate (`fmt` "simple" for the terminal, "github" for Markdown)."""
    from .outputs import require_tabulate

    tabulate = require_tabulate()
    keys = [k for k in columns if k not in drop]
    body = []
    for row in rows:
        line = []
        for k in keys:
            text = format_cell(k, row)
            if k == "status" and len(text) > max_status:
                text = text[: max_status - 1] + "…"
            if fmt == "github":
                text = text.replace("|", "\\|")
            line.append(text)
        body.append(line)
    return tabulate(body, headers=[columns[k] for k in keys], tablefmt=fmt, disable_numparse=True)
