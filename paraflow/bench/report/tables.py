"""Tables from the raw per-rank numbers: training, allreduce (with footer), memory copy, overhead.

Builders take the JSON-ready cell records (``CellResult.to_dict()``, as stored in results.json)
and return rows of plain numbers, rounded once here so every output shows the same values.
Rendering (tabulate) is separate and lazy.
"""

from __future__ import annotations

import statistics
from typing import Optional

from ..driver.config import ModelSpec
from . import metrics

__all__ = [
    "TRAINING_COLUMNS",
    "ALLREDUCE_COLUMNS",
    "ALLREDUCE_FOOTER_COLUMNS",
    "MEMCPY_COLUMNS",
    "OVERHEAD_COLUMNS",
    "OVERHEAD_TARGET",
    "build_tables",
    "training_rows",
    "allreduce_rows",
    "memcpy_rows",
    "overhead_rows",
    "render",
    "format_value",
]

#: Abstraction overhead paraflow aims to stay within (reported, never asserted).
OVERHEAD_TARGET = 0.01

# key -> header shown on the terminal and in Markdown; CSV uses the keys.
TRAINING_COLUMNS = {
    "model": "model",
    "backend": "backend",
    "launcher": "launcher",
    "transport": "transport",
    "device": "device",
    "processes": "procs",
    "threads_per_process": "threads/proc",
    "batch_per_rank": "batch/rank",
    "global_batch": "global batch",
    "parameters": "params",
    "grad_mb_per_step": "grad MB/step",
    "step_ms_median": "step ms median",
    "step_ms_p10": "p10 ms",
    "step_ms_p90": "p90 ms",
    "samples_per_s": "samples/s",
    "samples_per_s_per_process": "samples/s/proc",
    "weak_scaling_efficiency": "weak-scaling eff",
    "comm_overhead": "comm overhead",
    "peak_mem_mb": "peak mem MB",
    "model_state_mb": "model state MB",
    "final_loss": "final loss",
    "status": "status",
}
ALLREDUCE_COLUMNS = {
    "backend": "backend",
    "launcher": "launcher",
    "transport": "transport",
    "processes": "procs",
    "size_bytes": "size(B)",
    "count": "count",
    "dtype": "type",
    "time_us": "time(us)",
    "algbw_gbps": "algbw(GB/s)",
    "busbw_gbps": "busbw(GB/s)",
    "wrong": "#wrong",
    "memcpy_gbps": "memcpy(GB/s)",
    "busbw_vs_memcpy": "busbw/memcpy",
    "status": "status",
}
ALLREDUCE_FOOTER_COLUMNS = {
    "backend": "backend",
    "launcher": "launcher",
    "transport": "transport",
    "processes": "procs",
    "sizes": "sizes",
    "wrong": "#wrong",
    "avg_busbw_gbps": "avg busbw(GB/s)",
    "avg_busbw_vs_memcpy": "avg busbw/memcpy",
    "status": "status",
}
MEMCPY_COLUMNS = {
    "device": "device",
    "threads": "threads",
    "size_bytes": "size(B)",
    "time_us": "time(us)",
    "gbps": "copy(GB/s)",
}
OVERHEAD_COLUMNS = {
    "backend": "backend",
    "library": "raw library",
    "launcher": "launcher",
    "processes": "procs",
    "model": "model",
    "pairs": "pairs",
    "paraflow_step_ms_median": "paraflow step ms",
    "raw_step_ms_median": "raw step ms",
    "abstraction_overhead": "overhead",
    "paired_overhead": "paired overhead",
    "paired_ci_low": "95% CI low",
    "paired_ci_high": "95% CI high",
    "within_target": "within 1%",
    "status": "status",
}
PERCENT_KEYS = {
    "weak_scaling_efficiency",
    "comm_overhead",
    "busbw_vs_memcpy",
    "avg_busbw_vs_memcpy",
    "abstraction_overhead",
    "paired_overhead",
    "paired_ci_low",
    "paired_ci_high",
}
SIGNED_PERCENT_KEYS = {"abstraction_overhead", "paired_overhead", "paired_ci_low", "paired_ci_high"}


def _r(value: Optional[float], digits: int) -> Optional[float]:
    return None if value is None else round(value, digits)


def _device(text: str) -> str:
    return str(text).split(":")[0]


def _status(cell: dict) -> str:
    return f"{cell['status']}: {cell['error']}" if cell.get("error") else str(cell["status"])


def _task(cell: dict, name: str) -> Optional[list]:
    """Every rank's result for task `name`, or None when any rank lacks it."""
    ranks = cell.get("ranks") or []
    found = [r["tasks"][name] for r in ranks if name in r.get("tasks", {})]
    return found if len(found) == cell["nproc"] and found else None


def _step_stats(per_rank: list, key: str) -> dict:
    return metrics.step_summary(metrics.slowest_rank_per_step([r[key] for r in per_rank]))


def _train_row(cell: dict, spec: str, tasks: Optional[list]) -> dict:
    ranks = cell.get("ranks") or []
    first = ranks[0] if ranks else {}
    row = dict.fromkeys(TRAINING_COLUMNS)
    row.update(
        model=ModelSpec.parse(spec).label,
        backend=cell["backend"],
        launcher=cell["launcher"],
        processes=cell["nproc"],
        transport=first.get("transport"),
        device=_device(first["device"]) if first.get("device") else None,
        threads_per_process=first.get("torch_threads", cell["threads"]),
    )
    if tasks is None:
        row["status"] = _status(cell) if cell["status"] != "ok" else "failed: a rank has no result for this model"
        return row
    t0 = tasks[0]
    steps = t0["steps"]
    global_batch = t0["samples_per_step"] * cell["nproc"]
    window = max(t["window_s"] for t in tasks)
    x = metrics.throughput(steps * global_batch, window)
    sync = _step_stats(tasks, "step_s")
    comm = None
    if all("no_sync_step_s" in t for t in tasks):
        with_sync = _step_stats(tasks, "sync_pair_step_s")["median"]
        without = _step_stats(tasks, "no_sync_step_s")["median"]
        comm = metrics.communication_overhead(without, with_sync)
    held = [sum(t["model_state_bytes"].values()) for t in tasks if "model_state_bytes" in t]  # not in older results
    row.update(
        model=t0["model"],
        batch_per_rank=t0["batch_per_rank"],
        global_batch=global_batch,
        parameters=t0["parameters"],
        grad_mb_per_step=_r(t0["grad_bytes"] / 1e6, 3),
        step_ms_median=_r(sync["median"] * 1e3, 3),
        step_ms_p10=_r(sync["p10"] * 1e3, 3),
        step_ms_p90=_r(sync["p90"] * 1e3, 3),
        samples_per_s=_r(x, 1),
        samples_per_s_per_process=_r(x / cell["nproc"], 1),
        comm_overhead=_r(comm, 4),
        peak_mem_mb=_r(max(t["peak_memory_bytes"] for t in tasks) / 1e6, 1),
        model_state_mb=_r(max(held) / 1e6, 3) if len(held) == len(tasks) else None,
        final_loss=_r(statistics.fmean(t["losses"][t.get("loss_step", len(t["losses"])) - 1] for t in tasks), 4),
        status="ok",
    )
    row["_replicas"] = t0.get("replicas", cell["nproc"])
    row["_x"] = x
    return row


def training_rows(cells: list) -> list:
    """One row per model x backend x launcher x process count; the single baseline first per model.

    Weak-scaling efficiency is X / (replicas * X_single) against the single row of the same model
    and device (fixed per-rank batch).
    """
    rows = []
    for cell in cells:
        if cell["kind"] != "train":
            continue
        for spec in cell["models"]:
            rows.append(_train_row(cell, spec, _task(cell, f"train/{spec}")))
    baselines = {(r["model"], r["device"]): r["_x"] for r in rows if r["backend"] == "single" and r["status"] == "ok"}
    for row in rows:
        x_1 = baselines.get((row["model"], row["device"]))
        if row["status"] == "ok" and x_1:
            row["weak_scaling_efficiency"] = _r(metrics.weak_scaling_efficiency(row["_x"], row["_replicas"], x_1), 4)
        row.pop("_x", None)
        row.pop("_replicas", None)
    order = {spec: i for i, spec in enumerate(dict.fromkeys(r["model"] for r in rows))}
    rows.sort(key=lambda r: (order[r["model"]], r["backend"] != "single"))
    return rows


def memcpy_rows(cells: list) -> list:
    """Copy bandwidth per device and size, from the memcpy cell."""
    rows = []
    for cell in cells:
        tasks = _task(cell, "memcpy") if cell["kind"] == "memcpy" else None
        if not tasks:
            continue
        for device, sizes in tasks[0]["devices"].items():
            for s in sizes:
                rows.append(
                    {
                        "device": device,
                        "threads": tasks[0]["threads"],
                        "size_bytes": s["bytes"],
                        "time_us": _r(s["time_s"] * 1e6, 3),
                        "gbps": _r(s["bytes"] / s["time_s"] / 1e9, 4),
                    }
                )
    return rows


def allreduce_rows(cells: list, memcpy: Optional[list] = None) -> tuple[list, list]:
    """(rows, footers): one row per backend x launcher x size, one footer per backend x launcher.

    time = max over ranks of each rank's mean time per operation; algbw = size / time;
    busbw = algbw * 2(n-1)/n; #wrong sums every rank's mismatched elements.
    """
    copy_bw = {(r["device"], r["size_bytes"]): r["gbps"] for r in (memcpy or [])}
    rows, footers = [], []
    for cell in cells:
        if cell["kind"] != "train" or not cell.get("allreduce"):
            continue
        first = (cell.get("ranks") or [{}])[0]
        ident = {
            "backend": cell["backend"],
            "launcher": cell["launcher"],
            "transport": first.get("transport"),
            "processes": cell["nproc"],
        }
        tasks = _task(cell, "allreduce")
        if tasks is None:
            status = _status(cell) if cell["status"] != "ok" else "failed: a rank has no allreduce result"
            rows.append({**dict.fromkeys(ALLREDUCE_COLUMNS), **ident, "status": status})
            footers.append({**dict.fromkeys(ALLREDUCE_FOOTER_COLUMNS), **ident, "status": status})
            continue
        n = cell["nproc"]
        device = _device(tasks[0]["device"])
        busbws, ratios, wrong_total = [], [], 0
        for i, size in enumerate(tasks[0]["sizes"]):
            t = max(task["sizes"][i]["time_s"] for task in tasks)
            wrong = sum(task["sizes"][i]["wrong"] for task in tasks)
            bus = metrics.busbw(size["bytes"], t, n) / 1e9
            copy = copy_bw.get((device, size["bytes"]))
            ratio = bus / copy if copy else None
            busbws.append(bus)
            if ratio is not None:
                ratios.append(ratio)
            wrong_total += wrong
            rows.append(
                {
                    **ident,
                    "size_bytes": size["bytes"],
                    "count": size["count"],
                    "dtype": size["dtype"],
                    "time_us": _r(t * 1e6, 2),
                    "algbw_gbps": _r(metrics.algbw(size["bytes"], t) / 1e9, 4),
                    "busbw_gbps": _r(bus, 4),
                    "wrong": wrong,
                    "memcpy_gbps": copy,
                    "busbw_vs_memcpy": _r(ratio, 4),
                    "status": "ok",
                }
            )
        footers.append(
            {
                **ident,
                "sizes": len(busbws),
                "wrong": wrong_total,
                "avg_busbw_gbps": _r(metrics.mean(busbws), 4),
                "avg_busbw_vs_memcpy": _r(metrics.mean(ratios), 4),
                "status": "ok",
            }
        )
    return rows, footers


def overhead_rows(cells: list, busy: bool = False) -> list:
    """Abstraction overhead: median step through paraflow / median step by hand - 1.

    Also the paired estimate, median over pairs of (paraflow step / raw step) - 1: the two steps of
    a pair run back to back, so load that drifts during the run cancels out; with a ~95%
    confidence interval. Within target: "yes" when the interval lies at or below OVERHEAD_TARGET,
    "no" when it lies above, "unresolved" when noise is too large to tell, and always
    "unresolved: busy machine" when other work competed for the CPU (`busy`): load bursts make
    neighbouring pairs alike, and the interval would claim more than the data holds.
    """
    rows = []
    for cell in cells:
        if cell["kind"] != "overhead":
            continue
        ident = {
            "backend": cell["backend"],
            "launcher": cell["launcher"],
            "processes": cell["nproc"],
            "model": cell["models"][0] if cell["models"] else None,
        }
        tasks = _task(cell, "overhead")
        if tasks is None:
            status = _status(cell) if cell["status"] != "ok" else "failed: a rank has no overhead result"
            rows.append({**dict.fromkeys(OVERHEAD_COLUMNS), **ident, "status": status})
            continue
        pf = _step_stats(tasks, "paraflow_step_s")
        raw = _step_stats(tasks, "raw_step_s")
        ratio = metrics.abstraction_overhead(pf["median"], raw["median"])
        pairs = zip(
            metrics.slowest_rank_per_step([t["paraflow_step_s"] for t in tasks]),
            metrics.slowest_rank_per_step([t["raw_step_s"] for t in tasks]),
        )
        ratios = [metrics.abstraction_overhead(p, r) for p, r in pairs]
        low, high = metrics.median_confidence_interval(ratios)
        verdict = "yes" if high <= OVERHEAD_TARGET else "no" if low > OVERHEAD_TARGET else "unresolved"
        if busy:
            verdict = "unresolved: busy machine"
        rows.append(
            {
                **ident,
                "library": tasks[0]["library"],
                "model": tasks[0]["model"],
                "pairs": tasks[0]["pairs"],
                "paraflow_step_ms_median": _r(pf["median"] * 1e3, 4),
                "raw_step_ms_median": _r(raw["median"] * 1e3, 4),
                "abstraction_overhead": _r(ratio, 4),
                "paired_overhead": _r(statistics.median(ratios), 4),
                "paired_ci_low": _r(low, 4),
                "paired_ci_high": _r(high, 4),
                "within_target": verdict,
                "status": "ok",
            }
        )
    return rows


def build_tables(cells: list, header: Optional[dict] = None) -> dict:
    """Every table from the cell records: training, allreduce, allreduce_footer, memcpy, overhead.

    `header` (results.json's) tells whether the machine was busy, which withholds the abstraction
    overhead verdict.
    """
    from .header import busy_warning

    memcpy = memcpy_rows(cells)
    allreduce, footers = allreduce_rows(cells, memcpy)
    busy = header is not None and busy_warning(header) is not None
    return {
        "training": training_rows(cells),
        "allreduce": allreduce,
        "allreduce_footer": footers,
        "memcpy": memcpy,
        "overhead": overhead_rows(cells, busy),
    }


def format_value(key: str, value) -> str:
    """How a cell of a table reads on the terminal and in Markdown."""
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


def render(rows: list, columns: dict, fmt: str = "simple", drop: tuple = (), max_status: int = 60) -> str:
    """`rows` as text with tabulate (`fmt` "simple" for the terminal, "github" for Markdown)."""
    from .outputs import require_tabulate

    tabulate = require_tabulate()
    keys = [k for k in columns if k not in drop]
    body = []
    for row in rows:
        line = []
        for k in keys:
            text = format_value(k, row.get(k))
            if k == "status" and len(text) > max_status:
                text = text[: max_status - 1] + "…"
            if fmt == "github":
                text = text.replace("|", "\\|")
            line.append(text)
        body.append(line)
    return tabulate(body, headers=[columns[k] for k in keys], tablefmt=fmt, disable_numparse=True)
