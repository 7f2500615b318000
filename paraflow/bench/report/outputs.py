"""Write a run's results: terminal text, Markdown, CSV and JSON, all under one header."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ...errors import MissingDependencyError
from .header import header_lines
from .tables import (
    ALLREDUCE_COLUMNS,
    ALLREDUCE_FOOTER_COLUMNS,
    MEMCPY_COLUMNS,
    OVERHEAD_COLUMNS,
    OVERHEAD_TARGET,
    TRAINING_COLUMNS,
    render,
)

__all__ = [
    "require_tabulate",
    "terminal_report",
    "markdown_report",
    "write_csvs",
    "write_json",
    "CSV_TABLES",
    "DEFINITIONS",
]

INSTALL_HINT = "install the benchmark extras: `pip install 'paraflow[bench]'` (tabulate and matplotlib)"

#: CSV file -> (table key, columns).
CSV_TABLES = {
    "training.csv": ("training", TRAINING_COLUMNS),
    "allreduce.csv": ("allreduce", ALLREDUCE_COLUMNS),
    "allreduce_summary.csv": ("allreduce_footer", ALLREDUCE_FOOTER_COLUMNS),
    "memcpy.csv": ("memcpy", MEMCPY_COLUMNS),
    "overhead.csv": ("overhead", OVERHEAD_COLUMNS),
}

DEFINITIONS = [
    "step time: per rank, after a device sync; a step takes as long as its slowest rank; "
    "median and p10/p90 over the timed steps.",
    "samples/s: global samples in the timed window / the window's wall time (after warm-up and a barrier); "
    "per process = that / processes.",
    "weak-scaling eff: fixed batch per rank; X_n / (n * X_1), X_1 = the single backend "
    "(one process, no wrapper) on the same model.",
    "comm overhead: 1 - t_step(no gradient sync) / t_step(with it), medians of interleaved pairs of steps; the "
    "step without sync runs forward and backward under backend.no_sync and a local optimizer update "
    "(horovod's inside optimizer.skip_synchronize(), since its step() would reduce the skipped gradients).",
    "peak mem: peak resident set size of the process on CPU (max over ranks), torch's peak allocated memory on CUDA.",
    "model state: bytes of parameters, gradients and optimizer state one rank holds after a step, from the "
    "tensors (a sharded backend's local shards), max over ranks.",
    "final loss: the loss of timed step number --steps (every cell runs at least that many; windows "
    "may run longer), mean over ranks: rows with the same process count start from the same seed and "
    "data, so their losses should agree.",
    "allreduce: in-place float32 sum; time = max over ranks of the mean time per operation; algbw = size / time; "
    "busbw = algbw * 2(n-1)/n (nccl-tests); #wrong = elements differing from the exact expected sum; "
    "avg busbw = mean over sizes.",
    "memcpy: size / time of one buffer copy with the threads each rank uses (each byte counted once, like algbw).",
    "abstraction overhead: median step via paraflow / median step of the same loop set up by hand "
    "on the raw library - 1, "
    f"steps interleaved in one run; paired: median over back-to-back pairs of the step-time ratio - 1, with a "
    f"distribution-free 95% confidence interval; within {OVERHEAD_TARGET:.0%}: yes if the interval lies at or below "
    f"the target, no if above, unresolved if noise hides it, always on a busy machine (reported, not enforced).",
]


def require_tabulate():
    """tabulate's function, or a clear error saying how to install it."""
    try:
        from tabulate import tabulate
    except ImportError:
        raise MissingDependencyError(
            f"the benchmark tables need tabulate, which is not installed; {INSTALL_HINT}."
        ) from None
    return tabulate


def _by(rows: list, keys: tuple) -> dict:
    groups: dict = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups


def _sections(results: dict, fmt: str) -> list:
    """(title, text) pairs for every table, in reading order."""
    tables = results["tables"]
    sections = []
    for (model,), rows in _by(tables["training"], ("model",)).items():
        first = next((r for r in rows if r["parameters"] is not None), rows[0])
        about = (
            f"{first['parameters']:,} parameters, {first['grad_mb_per_step']} MB of gradients per step"
            if first["parameters"] is not None
            else "no result"
        )
        sections.append((f"Training: {model} ({about})", render(rows, TRAINING_COLUMNS, fmt, drop=("model",))))
    footers = {(f["backend"], f["launcher"], f["processes"]): f for f in tables["allreduce_footer"]}
    for key, rows in _by(tables["allreduce"], ("backend", "launcher", "processes")).items():
        footer = footers.get(key, {})
        text = render(rows, ALLREDUCE_COLUMNS, fmt, drop=("backend", "launcher", "processes"))
        if footer.get("avg_busbw_gbps") is not None:
            vs = footer.get("avg_busbw_vs_memcpy")
            text += (
                f"\n\n # Avg bus bandwidth : {footer['avg_busbw_gbps']:g} GB/s"
                + (f" ({vs * 100:.1f}% of memcpy)" if vs is not None else "")
                + f"   # Out of bounds values : {footer['wrong']} {'OK' if footer['wrong'] == 0 else 'WRONG'}"
            )
        sections.append((f"Allreduce: {key[0]} under {key[1]}, {key[2]} processes", text))
    if tables["memcpy"]:
        sections.append(("Memory-copy bandwidth of this machine", render(tables["memcpy"], MEMCPY_COLUMNS, fmt)))
    if tables["overhead"]:
        sections.append(
            (
                "Abstraction overhead: paraflow against the same loop on the raw library",
                render(tables["overhead"], OVERHEAD_COLUMNS, fmt),
            )
        )
    return sections


def _failures(results: dict) -> list:
    return [f"{c['id']}: {c['status']}: {c['error']}" for c in results["cells"] if c["status"] != "ok"]


def _skipped(results: dict) -> list:
    return [f"{name}: {why}" for name, why in results.get("skipped", {}).items()]


def terminal_report(results: dict) -> str:
    """What the command prints at the end: header, every table, failures, where the files are."""
    lines = ["", "=" * 100, *header_lines(results["header"], with_commands=False), "=" * 100]
    for title, text in _sections(results, "simple"):
        lines += ["", title, text]
    if _skipped(results):
        lines += ["", "Not run here:", *[f"  {s}" for s in _skipped(results)]]
    if _failures(results):
        lines += ["", "FAILED cells:", *[f"  {f}" for f in _failures(results)]]
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_report(results: dict, plots: list) -> str:
    """results.md: header, definitions, tables, plots, failures, the exact commands."""
    header = results["header"]
    lines = ["# paraflow benchmark", "", "```", *header_lines(header, with_commands=False), "```", ""]
    lines += ["## Definitions", "", *[f"- {d}" for d in DEFINITIONS], ""]
    for title, text in _sections(results, "github"):
        if "\n\n # Avg" in text:
            table, footer = text.split("\n\n", 1)
            text = f"{table}\n\n`{footer.strip()}`"
        lines += [f"## {title}", "", text, ""]
    for plot in plots:
        lines += [f"![{plot}]({plot})", ""]
    if _skipped(results):
        lines += ["## Not run here", "", *[f"- {_md_escape(s)}" for s in _skipped(results)], ""]
    if _failures(results):
        lines += ["## Failed cells", "", *[f"- {_md_escape(f)}" for f in _failures(results)], ""]
    lines += ["## Commands", "", "```", *header["commands"], "```", ""]
    return "\n".join(lines)


def write_csvs(results: dict, out: Path) -> list:
    """One CSV per table; `#` lines on top carry the header (pandas: read_csv(..., comment="#"))."""
    written = []
    comment = [f"# {line}" for line in header_lines(results["header"])]
    for name, (key, columns) in CSV_TABLES.items():
        rows = results["tables"][key]
        with open(out / name, "w", newline="") as f:
            f.write("\n".join(comment) + "\n")
            writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
        written.append(name)
    return written


def write_json(results: dict, out: Path) -> str:
    """results.json: header, config, every cell with its raw per-rank numbers, and the tables."""
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return "results.json"
