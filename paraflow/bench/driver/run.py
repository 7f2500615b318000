"""One benchmark run from start to finish: matrix, launches, tables, files."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from ..report.header import cluster_line, collect_header
from ..report.outputs import CSV_TABLES, markdown_report, write_csvs, write_json
from ..report.screen import screen_report
from ..report.tables import build_tables, require_tabulate
from .config import BenchConfig
from .matrix import Matrix, build_matrix
from .on_cluster import bench_cluster, cluster_header
from .progress import LaunchProgress
from .runner import run_cells, run_extra_launches, worker_entry

__all__ = ["run_bench", "check_models", "start_line", "OUTPUT_FILES"]

OUTPUT_FILES = (
    "results.json",
    "results.md",
    *CSV_TABLES,
    "throughput.png",
)
#: Files an earlier version of the benchmark wrote; removed so they cannot pass for this run's.
STALE_FILES = tuple(
    "allreduce.csv allreduce_summary.csv memcpy.csv overhead.csv tuning.csv published.csv busbw.png "
    "breakdown.png projection.png".split()
)


def _prepare(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES + STALE_FILES:  # no stale file from an earlier run may pass for this one's
        (out / name).unlink(missing_ok=True)
    raw = out / "raw"
    shutil.rmtree(raw, ignore_errors=True)  # cells of an earlier run would pass for this one's
    raw.mkdir()
    return raw


def run_bench(config: BenchConfig, progress=True, matrix: Optional[Matrix] = None, entry=worker_entry) -> dict:
    """Run every cell of `config` (or of `matrix`), write the results folder, return the results.

    `progress`: True prints progress and tables to standard output, a stream prints them there,
    False prints nothing.

    Returns the dict stored as results.json: header, config, skipped backends, every cell with its
    exact command and raw per-rank numbers, and the tables built from them.
    """
    progress = sys.stdout if progress is True else (progress or None)
    require_tabulate()
    if config.plots:
        from ..report.plots import require_pyplot

        require_pyplot()
    check_models(config)
    matrix = matrix or build_matrix(config)
    out = Path(config.out)
    raw = _prepare(out)
    threads = {c.nproc: c.threads for c in matrix.cells if c.kind == "train"}
    launchers = list(dict.fromkeys(c.launcher for c in matrix.cells))
    header = collect_header(threads, launchers)
    if progress:
        print(start_line(header, matrix, config), file=progress, flush=True)

    start = time.monotonic()
    tracker = LaunchProgress(progress, len(matrix.cells), start)
    with bench_cluster(config) as cluster:
        if cluster is not None:
            header["cluster"] = cluster_header(cluster)
            tracker.note(cluster_line(header["cluster"]))
        cell_results = run_cells(matrix.cells, config, raw, tracker, entry, cluster)
        if config.max_repeat > config.repeat:

            def launch(cell):
                tracker.add(1)
                heading = "[extra: intervals still wide]"
                return run_cells([cell], config, raw, tracker, entry, cluster, heading)

            extra = run_extra_launches(matrix.cells, cell_results, config, start, launch)
            cell_results += extra
            header["extra_launches"] = {
                "repeat": config.repeat,
                "max_repeat": config.max_repeat,
                "time_budget": config.time_budget,
                "cells": dict(Counter(r.cell.group for r in extra)),
            }
    cells = [r.to_dict() for r in cell_results]
    header["commands"] = [c["command"] for c in cells]
    header["load_average_1min"]["end"] = round(os.getloadavg()[0], 2)
    header["wall_time_s"] = round(time.monotonic() - start, 1)
    tables = build_tables(cells, header, config.to_dict())
    header["noise_floor"] = tables["noise_floor"]
    results = {
        "header": header,
        "config": config.to_dict(),
        "skipped": dict(matrix.skipped),
        "cells": cells,
        "tables": tables,
        "verdict": tables["verdict"],
    }

    plots = []
    if config.plots:
        from ..report.plots import write_plots

        plots = write_plots(results, out)
    written = [write_json(results, out), *write_csvs(results, out), *plots]
    (out / "results.md").write_text(markdown_report(results, plots))
    written.insert(1, "results.md")
    if progress:
        print(screen_report(results), file=progress)
        print(
            f"\n{len(cells)} launches in {header['wall_time_s']:.0f} s; wrote {', '.join(written)} "
            f"and raw/<cell>/rank<R>.json to {out}/",
            file=progress,
            flush=True,
        )
    return results


def start_line(header: dict, matrix: Matrix, config: BenchConfig) -> str:
    """The one line printed before the launches: what runs, what does not, where the results go
    (the machine's whole description is in results.md)."""
    line = (
        f"paraflow bench: {len(matrix.cells)} launches, {config.timeout:.0f} s timeout each, on {header['cores']} "
        f"cores ({header['cpu']}, GPU: {header['gpu']}); results go to {config.out}/"
    )
    if matrix.skipped:
        line += "\nnot run: " + "; ".join(f"{name} ({why})" for name, why in matrix.skipped.items())
    return line


def check_models(config: BenchConfig) -> None:
    """Build each of your factories once here, before any launch (factory.check_factory)."""
    from ..rank.factory import check_factory

    for spec in config.models:
        if spec.kind == "factory":
            check_factory(spec, config.input_shape, config.classes)
