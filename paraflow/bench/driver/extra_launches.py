"""More launches for the cells whose intervals are still wide, while the run's time budget lasts.

After the planned rounds, a training cell whose step-time or throughput interval is wider than
``--noisy`` on any of its models (its row's noisy mark) is launched once more, round after round
(the widest first), judged again after each round, until its intervals narrow, it has
``--max-repeat`` launches, or the run's time is spent: a launch starts only when the run's time
so far plus that cell's mean launch time stays within ``--time-budget``. Three launches give a t
interval 4.30 standard errors wide on each side; five give 2.78, over more launches. Extra
launches skip the collective sweep, whose rows keep the planned launches.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Callable

from ..report.tables import training_rows
from .config import BenchConfig
from .matrix import Cell

__all__ = ["wide_groups", "launch_cost", "run_extra_launches"]


def wide_groups(cells: list, noisy: float, scaling: tuple) -> list:
    """Groups (``backend-launcher-processes``) of default training rows whose step-time or
    throughput interval is wider than `noisy` (their noisy mark; the communication share is not a
    verdict's), the widest first, so a budget that runs short goes to the cells that need
    launches most."""
    rows, estimates = training_rows(cells, tuple(scaling), noisy)
    widths: dict = {}
    for row, est in zip(rows, estimates):
        if not est or row.get("setting", "default") != "default":
            continue
        width = max(est["step"].halfwidth, est["x"].halfwidth)
        if width > noisy:
            group = f"{row['backend']}-{row['launcher']}-{row['processes']}"
            widths[group] = max(widths.get(group, 0.0), width)
    return sorted(widths, key=lambda group: -widths[group])


def launch_cost(cells: list, group: str) -> float:
    """Mean seconds of the launches of `group` so far (not the one that also measured the abstraction overhead)."""
    spent = [
        c["elapsed_s"]
        for c in cells
        if c.get("group") == group and c["kind"] == "train" and not c.get("tag") and not c.get("overhead")
    ]
    return statistics.fmean(spent) if spent else 0.0


def run_extra_launches(
    planned: list, results: list, config: BenchConfig, started: float, launch: Callable[[Cell], list]
) -> list:
    """Launch the still-wide cells of `planned` again (see the module's docstring); returns the
    new launches' results. `launch(cell)` runs one cell and returns its results (run_cells);
    `started` is the run's time.monotonic() start."""
    cells = {c.group: c for c in planned if c.kind == "train" and c.repeat and not c.tag and not c.options}
    extra: list = []
    for repeat in range(config.repeat + 1, config.max_repeat + 1):
        done = [r.to_dict() for r in results + extra]
        launched = len(extra)
        for group in wide_groups(done, config.noisy, config.scaling):
            if group in cells and time.monotonic() - started + launch_cost(done, group) <= config.time_budget:
                extra += launch(replace(cells[group], repeat=repeat, sweep=False, overhead=None))
        if len(extra) == launched:  # nothing wide, or nothing that fits the time left
            break
    return extra
