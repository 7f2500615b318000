"""Write a run's results: terminal text, Markdown, CSV and JSON, all under one header."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .costmodel import FIT_COLUMNS, MODEL_NOTE, PROJECTION_COLUMNS
from .header import header_lines
from .tables import (
    SWEEP_COLUMNS,
    SWEEP_FOOTER_COLUMNS,
    TRAINING_COLUMNS,
    csv_columns,
    render,
)

__all__ = [
    "markdown_report",
    "write_csv",
    "write_csvs",
    "write_json",
    "CSV_TABLES",
    "DEFINITIONS",
]


#: CSV file -> (table key, columns); a CSV header names the columns by key, so no unit enters it.
CSV_TABLES = {
    "training.csv": ("training", TRAINING_COLUMNS),
    "sweep.csv": ("sweep", SWEEP_COLUMNS),
    "sweep_summary.csv": ("sweep_footer", SWEEP_FOOTER_COLUMNS),
    "costmodel.csv": ("costmodel_fit", FIT_COLUMNS),
    "projection.csv": ("projection", PROJECTION_COLUMNS),
}

DEFINITIONS = [
    "every figure with ± or [low–high] is the median over independent launches of the same cell with a 95% "
    "confidence interval across launches: Student's t interval of the launches' own figures (mean ± "
    "t(n-1)·s/√n, on the log scale for positive figures); a ratio of two such figures (efficiency, speedup, "
    "the verdict's factors) gets Welch's t interval of the log ratio (Welch-Satterthwaite degrees of freedom); "
    "other derived figures are computed draw by draw from 8000 draws of each estimate's t distribution; "
    "a figure from one launch only gets "
    "the bootstrap interval of its steps, which says nothing of a rerun. ±x% is the farther end's distance from "
    "the value. A figure whose interval reaches further than the noisy bound (relative; in points for comm "
    "overhead) is marked noisy.",
    "step time: per rank, after a device sync; a step takes as long as its slowest rank; a launch's step time "
    "is the median of its timed steps; p10/p90 pool every launch's steps.",
    "warm-up: untimed steps until the median of the last 5 is within 10% of the 5 before (at least --warmup, "
    "at most --max-warmup seconds of steps).",
    "samples/s: global samples in the timed window / the window's wall time (after warm-up and a barrier); "
    "per process = that / processes.",
    "scaling eff: weak scaling (fixed batch per rank): X_n / (n * X_1); strong scaling (fixed global batch): "
    "speedup t_1 / t_n, eff = speedup / n; X_1 and t_1 = the single backend (one process, no wrapper) on the "
    "same model.",
    "comm overhead: 1 - t_step(no gradient sync) / t_step(with it), medians of interleaved pairs of steps; the "
    "step without sync runs forward and backward under backend.no_sync and a local optimizer update "
    "(horovod's inside optimizer.skip_synchronize(), since its step() would reduce the skipped gradients).",
    "peak mem: peak resident set size of the process on CPU (max over ranks), torch's peak allocated memory on CUDA.",
    "model state: bytes of parameters, gradients and optimizer state one rank holds after a step, from the "
    "tensors (a sharded backend's local shards), max over ranks.",
    "loss at step --warmup: the loss after --warmup steps, mean over ranks: every launch runs at least those from "
    "the same seed and data, so rows with the same process count should agree.",
    "sweep: nccl-tests style; per size the backend's library call (call: raw; paraflow's public call for a "
    "backend with no raw library named), one operation per round (12 at least, up to 40 below 1 MB and 200 "
    "from 1 MB up), float32 elements; time = median over rounds of the slowest rank's time; algbw = size / "
    "time; busbw = algbw * 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter; size = the whole "
    "gathered or scattered buffer), 1 (broadcast); #wrong = elements differing from the exact expected result.",
    "cost model: per backend, launcher and process count, allreduce time T = a(n)·α + b(n)·S/B fitted to the "
    "raw library's sweep times (weighted least squares on relative error; ring for gloo, Open MPI's "
    "Rabenseifner for horovod under mpirun); predicted step = compute (the median no-sync "
    "step) + the modelled time of the messages the backend sends (DDP buckets, horovod fusion buffers, fsdp "
    "all-gathers and reduce-scatters), no overlap; prediction error = predicted / measured median - 1. The "
    "projection carries the same to N hosts: it is computed, not measured.",
    "verdict: per model and process count, the backend and launcher with the highest samples/s; another is "
    "slower when the 95% interval of the throughput ratio lies above 1 and the ratio exceeds 1 + the larger of "
    "the margin (--margin, default 5%) and the A/A noise floor; else it shares the first place (no significant "
    "difference, or a significant one within that threshold).",
]


def _by(rows: list, keys: tuple) -> dict:
    groups: dict = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups


#: Columns left out of the terminal and Markdown tables (they stay in the CSV and JSON).
TRAINING_HIDDEN = ("model", "scaling", "transport", "device", "batch_per_rank", "parameters", "grad_mb_per_step")
SWEEP_HIDDEN = ("backend", "launcher", "transport", "processes", "collective")


def _sweep_footer(footer: dict) -> str:
    busbw = "—" if footer.get("avg_busbw") is None else f"{footer['avg_busbw']:g} GB/s"
    wrong = footer["wrong"]
    return f"# Avg bus bandwidth : {busbw}   # Out of bounds values : {wrong} {'OK' if wrong == 0 else 'WRONG'}"


def _sections(results: dict, fmt: str) -> list:
    """(title, text) pairs for every table of results.md, in reading order."""
    tables = results["tables"]
    sections = []
    for (model, scaling), rows in _by(tables["training"], ("model", "scaling")).items():
        first = next((r for r in rows if r["parameters"] is not None), rows[0])
        about = (
            f"{first['parameters']:,} parameters, {first['grad_mb_per_step']} MB of gradients per step"
            if first["parameters"] is not None
            else "no result"
        )
        hidden = TRAINING_HIDDEN + (("speedup",) if scaling == "weak" else ())
        hidden += ("compiled", "compile_s") if all(r.get("compiled", "no") == "no" for r in rows) else ()
        hidden += ("peak_cuda_mb",) if all(r.get("peak_cuda_mb") is None for r in rows) else ()
        title = f"Training: {model}, {scaling} scaling ({about})"
        sections.append((title, render(rows, TRAINING_COLUMNS, fmt, drop=hidden)))
    keys = ("backend", "launcher", "processes", "collective")
    footers = {tuple(f[k] for k in keys): f for f in tables["sweep_footer"]}
    for key, rows in _by(tables["sweep"], keys).items():
        text = render(rows, SWEEP_COLUMNS, fmt, drop=SWEEP_HIDDEN)
        if footers.get(key, {}).get("sizes"):
            text += f"\n\n`{_sweep_footer(footers[key])}`"
        backend, launcher, n, collective = key
        title = f"{collective or 'Sweep'} float32: {backend} under {launcher}, {n} processes"
        sections.append((title[0].upper() + title[1:], text))
    for u in tables.get("sweep_unsupported", []):
        sections.append(
            (
                f"Not measured: {u['collective']} under {u['backend']} · {u['launcher']}",
                _md_escape(u["error"]),
            )
        )
    return sections + model_sections(tables, fmt)


def _failures(results: dict) -> list:
    return [f"{c['id']}: {c['status']}: {c['error']}" for c in results["cells"] if c["status"] != "ok"]


def _skipped(results: dict) -> list:
    return [f"{name}: {why}" for name, why in results.get("skipped", {}).items()]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_report(results: dict, plots: list) -> str:
    """results.md: header, definitions, tables, plots, failures, the exact commands."""
    header = results["header"]
    lines = ["# paraflow benchmark", "", "```", *header_lines(header, with_commands=False), "```", ""]
    lines += ["## Definitions", "", *[f"- {d}" for d in DEFINITIONS], ""]
    for title, text in _sections(results, "github"):
        lines += [f"## {title}", "", text, ""]
    for plot in plots:
        lines += [f"![{plot}]({plot})", ""]
    if _skipped(results):
        lines += ["## Not run here", "", *[f"- {_md_escape(s)}" for s in _skipped(results)], ""]
    if _failures(results):
        lines += ["## Failed cells", "", *[f"- {_md_escape(f)}" for f in _failures(results)], ""]
    lines += ["## Commands", "", "```", *header["commands"], "```", ""]
    verdicts = [entry["text"] for entry in results["tables"].get("verdict", [])]  # training, collectives
    if verdicts:
        lines += ["## Verdict", "", *[f"- {_md_escape(v)}" for v in verdicts], ""]
    return "\n".join(lines)


def write_csv(path: Path, rows: list, columns: dict, header: dict) -> None:
    """One table as CSV, every column with its interval ends; `#` lines on top carry the header
    (pandas: read_csv(..., comment="#"))."""
    keys = csv_columns(columns, rows)
    with open(path, "w", newline="") as f:
        f.write("".join(f"# {line}\n" for line in header_lines(header)))
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in keys})


def write_csvs(results: dict, out: Path) -> list:
    """One CSV per table (write_csv)."""
    for name, (key, columns) in CSV_TABLES.items():
        write_csv(out / name, results["tables"].get(key, []), columns, results["header"])
    return list(CSV_TABLES)


def write_json(results: dict, out: Path) -> str:
    """results.json: header, config, every cell with its raw per-rank numbers, and the tables."""
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return "results.json"


def model_sections(tables: dict, fmt: str) -> list:
    """(title, text) pairs for the terminal and results.md."""
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
    return sections
