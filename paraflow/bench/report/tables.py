"""Every table of a run from the raw per-rank numbers, and how a table reads as text.

Builders take the JSON-ready cell records (``CellResult.to_dict()``, as stored in results.json)
and return rows of plain numbers, rounded once so every output shows the same values; a figure
with a 95% interval carries it as ``key_low`` / ``key_high`` beside ``key``. Rendering
(tabulate) is separate and lazy.

Training
--------

Each row pools the launches of one cell. Per launch: a step takes as long as its slowest rank;
the launch's step time is the median of its steps, its throughput the global samples of its
window over the window's wall time, its communication overhead 1 - median(no-sync steps) /
median(sync steps) over interleaved pairs. The row shows the median over launches with a 95%
interval across launches (Student's t, intervals.py); p10/p90 pool every launch's steps.

Compiled rows (``paraflow bench --compile no,yes``): each backend's cell launched again with
``wrap_model(model, compile=True)``, its row beside the eager one with the same figures and
intervals, efficiency against the compiled single row. Compile s is the slowest rank's first step,
where torch.compile compiles, run before warm-up and never timed: the median over launches, with
their lowest and highest.

Collectives
-----------

Per launch, a size's time is the median over rounds of the slowest rank's time for the round's
operation; across launches the row shows the median with a 95% interval across launches
(intervals.py), and bandwidths follow from the time (algbw = size / time, busbw = algbw x
nccl-tests' factor for the collective).
"""

from __future__ import annotations

import statistics
from typing import Optional

import torch

from ...errors import MissingDependencyError
from ..model_spec import ModelSpec
from . import intervals, metrics
from .costmodel import model_tables
from .launches import TASK_PREFIX, device_name, group_status, groups, rounded, task_of
from .verdict import DEFAULT_MARGIN, training_verdict

__all__ = [
    "TRAINING_COLUMNS",
    "SWEEP_FOOTER_COLUMNS",
    "SWEEP_COLUMNS",
    "build_tables",
    "training_rows",
    "sweep_rows",
    "noise_floor",
    "render",
    "require_tabulate",
    "INSTALL_HINT",
    "format_value",
    "format_cell",
    "csv_columns",
]

PERCENT_KEYS = {
    "scaling_efficiency",
    "comm_overhead",
    "prediction_error",
    "efficiency",
    "rms_residual",
    "max_residual",
}
SIGNED_PERCENT_KEYS = {"prediction_error"}
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
                medians.append(statistics.median(metrics.slowest_rank_per_step([t["step_s"] for t in tasks])))
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

    Tables: training, sweep (+ sweep_footer, sweep_unsupported); noise_floor
    (the A/A check); verdict (list of {claim, text}); the cost model's costmodel_fit, predictions,
    projection (costmodel.py). `config` (results.json's) gives the noisy
    bound, the verdict's margin and the scaling modes.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many small tensor operations: on a busy machine 2 threads took 20x longer
    try:
        return _build(cells, {**_options(config), "header": header})
    finally:
        torch.set_num_threads(threads)


def _build(cells: list, opts: dict) -> dict:
    sweep, footers, unsupported = sweep_rows(cells)
    training, estimates = training_rows(cells, opts["scaling"], opts["noisy"])
    floor = noise_floor(cells)
    spread = (floor or {}).get("spread") or 0.0
    verdict = training_verdict(training, estimates, spread, opts["margin"])
    return {
        "training": training,
        "sweep": sweep,
        "sweep_footer": footers,
        "sweep_unsupported": unsupported,
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


#: What a missing tabulate or matplotlib error says to do.
INSTALL_HINT = "install the benchmark extras: `pip install 'paraflow[bench]'` (tabulate and matplotlib)"


def require_tabulate():
    """tabulate's function, or a clear error saying how to install it."""
    try:
        from tabulate import tabulate
    except ImportError:
        raise MissingDependencyError(
            f"the benchmark tables need tabulate, which is not installed; {INSTALL_HINT}."
        ) from None
    return tabulate


def render(rows: list, columns: dict, fmt: str = "simple", drop: tuple = (), max_status: int = 60) -> str:
    """`rows` as text with tabulate (`fmt` "simple" for the terminal, "github" for Markdown)."""
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


# key -> header shown on the terminal and in Markdown; CSV uses the keys (and key_low / key_high).
TRAINING_COLUMNS = {
    "model": "model",
    "scaling": "scaling",
    "backend": "backend",
    "launcher": "launcher",
    "compiled": "compiled",
    "transport": "transport",
    "device": "device",
    "processes": "procs",
    "threads_per_process": "threads/proc",
    "launches": "launches",
    "batch_per_rank": "batch/rank",
    "global_batch": "global batch",
    "parameters": "params",
    "param_mb": "params MB",
    "grad_mb_per_step": "grad MB/step",
    "step_ms_median": "step ms median",
    "step_ms_p10": "p10 ms",
    "step_ms_p90": "p90 ms",
    "samples_per_s": "samples/s",
    "samples_per_s_per_process": "samples/s/proc",
    "speedup": "speedup",
    "scaling_efficiency": "scaling eff",
    "comm_overhead": "comm overhead",
    "warmup_steps": "warm-up steps",
    "compile_s": "compile s",
    "peak_cuda_mb": "peak CUDA MB/rank",
    "peak_mem_mb": "peak RSS MB/rank",
    "model_state_mb": "model state MB",
    "final_loss": "loss at step --warmup",
    "predicted_step_ms": "predicted step ms",
    "prediction_error": "prediction error",
    "noisy": "noisy",
    "status": "status",
}


def _launch(cell: dict, tasks: list) -> dict:
    """One launch's numbers, every rank's folded into one (slowest rank per step)."""
    numbers = {
        "steps": metrics.slowest_rank_per_step([t["step_s"] for t in tasks]),
        "samples": sum(t.get("window_samples", t["steps"] * t["samples_per_step"]) for t in tasks),
        "window": max(t["window_s"] for t in tasks),
        "sync": None,
    }
    if all("no_sync_step_s" in t for t in tasks):
        numbers["sync"] = metrics.slowest_rank_per_step([t["sync_pair_step_s"] for t in tasks])
        numbers["no_sync"] = metrics.slowest_rank_per_step([t["no_sync_step_s"] for t in tasks])
    return numbers


def _throughput(launches: list, gen) -> intervals.Estimate:
    per_launch = []
    for ln in launches:
        mean, replicates = intervals.within_launch(ln["steps"], "mean", gen)
        x = metrics.throughput(ln["samples"], ln["window"])
        per_launch.append((x, x * mean / replicates))  # a resampled window lasts as its resampled steps do
    return intervals.across_launches(per_launch, gen)


def _comm(launches: list, gen) -> Optional[intervals.Estimate]:
    if any(ln["sync"] is None for ln in launches):
        return None
    per_launch = []
    for ln in launches:
        point = metrics.communication_overhead(statistics.median(ln["no_sync"]), statistics.median(ln["sync"]))
        sync = intervals.blocks(torch.tensor(ln["sync"], dtype=torch.float64), "median")
        no_sync = intervals.blocks(torch.tensor(ln["no_sync"], dtype=torch.float64), "median")  # same blocks
        drawn = torch.randint(len(sync), (intervals.RESAMPLES, len(sync)), generator=gen)  # pairs stay pairs
        replicates = 1 - no_sync[drawn].quantile(0.5, dim=1) / sync[drawn].quantile(0.5, dim=1)
        per_launch.append((point, replicates))
    return intervals.across_launches(per_launch, gen)


def _put(row: dict, key: str, est: Optional[intervals.Estimate], scale: float, digits: int) -> None:
    if est is None:
        return
    row[key] = rounded(est.value * scale, digits)
    row[f"{key}_low"] = rounded(est.low * scale, digits)
    row[f"{key}_high"] = rounded(est.high * scale, digits)


def _row(group: str, launches: list, spec: str, scaling: str) -> tuple:
    """(row, estimates) for one cell group and model."""
    first = launches[0]
    ranks = next((c["ranks"] for c in launches if c.get("ranks")), [])
    meta = ranks[0] if ranks else {}
    row = dict.fromkeys(TRAINING_COLUMNS)
    row.update(
        model=ModelSpec.parse(spec).label,
        scaling=scaling,
        backend=first["backend"],
        launcher=first["launcher"],
        processes=first["nproc"],
        compiled="yes" if first.get("compiled") else "no",
        transport=meta.get("transport"),
        device=device_name(meta["device"]) if meta.get("device") else None,
        threads_per_process=meta.get("torch_threads", first["threads"]),
    )
    task = f"{TASK_PREFIX[scaling if first['nproc'] > 1 else 'weak']}/{spec}"
    found = [(c, t) for c in launches for t in [task_of(c, task)] if t is not None]
    row["launches"] = len(found)
    row["status"] = group_status(launches, len(found), f"result for {spec}")
    if not found:
        return row, {}
    numbers = [_launch(c, t) for c, t in found]
    t0 = found[0][1][0]
    key = (group, task)
    step = intervals.estimate([n["steps"] for n in numbers], "median", "step", *key)
    x = _throughput(numbers, intervals.generator("x", *key))
    comm = _comm(numbers, intervals.generator("comm", *key))
    pooled = [s for n in numbers for s in n["steps"]]
    _put(row, "step_ms_median", step, 1e3, 3)
    _put(row, "samples_per_s", x, 1, 1)
    _put(row, "samples_per_s_per_process", x, 1 / first["nproc"], 1)
    _put(row, "comm_overhead", comm, 1, 4)
    row.update(
        model=t0["model"],
        batch_per_rank=t0["batch_per_rank"],
        global_batch=t0["samples_per_step"] * first["nproc"],
        parameters=t0["parameters"],
        param_mb=None if t0.get("param_bytes") is None else rounded(t0["param_bytes"] / 1e6, 3),
        grad_mb_per_step=rounded(t0["grad_bytes"] / 1e6, 3),
        step_ms_p10=rounded(metrics.percentile(pooled, 10) * 1e3, 3),
        step_ms_p90=rounded(metrics.percentile(pooled, 90) * 1e3, 3),
        warmup_steps=max(t[0].get("warmup", 0) for _, t in found),
        **_compile_s(found),
        peak_mem_mb=_peak_mb([t for _, ts in found for t in ts], "peak_rss_bytes"),
        peak_cuda_mb=_peak_mb([t for _, ts in found for t in ts], "peak_cuda_bytes"),
        model_state_mb=_model_state_mb([t for _, ts in found for t in ts]),
        final_loss=_final_loss(found[0][1]),
    )
    row["_replicas"] = t0.get("replicas", first["nproc"])
    return row, {"step": step, "x": x, "comm": comm}


def _compile_s(found: list) -> dict:
    """Seconds of a compiled model's first step (its compile), the slowest rank's per launch: the
    median over launches, with their lowest and highest (none for an eager row)."""
    per_launch = [max(t.get("compile_s") or 0.0 for t in tasks) for _, tasks in found]
    if not any(t.get("compile_s") is not None for _, tasks in found for t in tasks):
        return {}
    return {
        "compile_s": rounded(statistics.median(per_launch), 3),
        "compile_s_low": rounded(min(per_launch), 3),
        "compile_s_high": rounded(max(per_launch), 3),
    }


def _peak_mb(tasks: list, key: str) -> Optional[float]:
    """The largest rank's peak memory (MB): resident set size, or torch's CUDA allocations."""
    peaks = [t[key] for t in tasks if t.get(key) is not None]
    return rounded(max(peaks) / 1e6, 1) if peaks else None


def _model_state_mb(tasks: list) -> Optional[float]:
    """Bytes of parameters, gradients and optimizer state one rank holds, max over ranks (MB)."""
    held = [sum(t["model_state_bytes"].values()) for t in tasks if "model_state_bytes" in t]  # not in older results
    return rounded(max(held) / 1e6, 3) if held and len(held) == len(tasks) else None


def _final_loss(tasks: list) -> Optional[float]:
    """The loss after --warmup steps, mean over ranks (same seed and data each launch); None for a
    --script, whose losses the benchmark does not see."""
    if any(not t.get("warmup_losses") and not t.get("losses") for t in tasks):
        return None
    return rounded(statistics.fmean(_loss(t) for t in tasks), 4)


def _loss(task: dict) -> float:
    """The loss after --warmup steps: every launch runs at least those, from the same seed and data
    (warm-up then goes on for as long as it needs, so later steps differ between launches)."""
    if "warmup_losses" in task:
        return task["warmup_losses"][task["loss_step"] - 1]
    return task["losses"][task.get("loss_step", len(task["losses"])) - 1]


def _noisy(est: dict, bound: float) -> str:
    """Which figures' intervals reach further than `bound` (relative; comm overhead in absolute points)."""
    wide = [name for name, e in (("step", est["step"]), ("samples/s", est["x"])) if e.halfwidth > bound]
    comm = est["comm"]
    if comm is not None and max(comm.value - comm.low, comm.high - comm.value) > bound:
        wide.append("comm")
    return ", ".join(wide) if wide else "no"


def _scale(rows: list, estimates: list, noisy: float) -> None:
    """Efficiency (and speedup for strong scaling) against the single row of the same model, device,
    scaling and compilation."""
    base = {
        (r["model"], r["device"], r["scaling"], r["compiled"]): e
        for r, e in zip(rows, estimates)
        if r["backend"] == "single" and e
    }
    for row, est in zip(rows, estimates):
        baseline = base.get((row["model"], row["device"], row["scaling"], row["compiled"]))
        replicas = row.pop("_replicas", row["processes"])
        if est:
            row["noisy"] = _noisy(est, noisy)
        if not est or not baseline:
            continue
        if row["scaling"] == "weak":
            _put(row, "scaling_efficiency", intervals.ratio(est["x"], baseline["x"], 1 / replicas), 1, 4)
        else:
            speedup = intervals.ratio(baseline["step"], est["step"])
            _put(row, "speedup", speedup, 1, 3)
            _put(row, "scaling_efficiency", speedup, 1 / replicas, 4)


def training_rows(cells: list, scalings: tuple = ("weak",), noisy: float = 0.10) -> tuple:
    """(rows, estimates): one row per model x scaling x cell group, the single baseline first per model.

    Efficiency: weak scaling (fixed batch per rank) X / (replicas * X_single); strong scaling
    (fixed global batch) speedup = t_single / t, efficiency = speedup / replicas, against the single
    row of the same model and device. `estimates` holds each row's interval estimates (for the verdict).
    """
    rows, estimates = [], []
    for group, launches in groups(cells, "train").items():
        for spec in launches[0]["models"]:
            for scaling in scalings:
                row, est = _row(group, launches, spec, scaling)
                rows.append(row)
                estimates.append(est)
    _scale(rows, estimates, noisy)
    order = {m: i for i, m in enumerate(dict.fromkeys(r["model"] for r in rows))}
    cell = {c: i for i, c in enumerate(dict.fromkeys((r["backend"], r["launcher"], r["processes"]) for r in rows))}
    ranked = sorted(  # a compiled row right after the eager one of its cell
        range(len(rows)),
        key=lambda i: (
            order[rows[i]["model"]],
            scalings.index(rows[i]["scaling"]),
            rows[i]["backend"] != "single",
            cell[rows[i]["backend"], rows[i]["launcher"], rows[i]["processes"]],
            rows[i]["compiled"] == "yes",
        ),
    )
    return [rows[i] for i in ranked], [estimates[i] for i in ranked]


#: The sweep's columns (float32 elements; GB = 1e9 bytes).
SWEEP_COLUMNS = {
    "backend": "backend",
    "launcher": "launcher",
    "transport": "transport",
    "processes": "procs",
    "collective": "collective",
    "impl": "call",
    "size_bytes": "size(B)",
    "count": "count",
    "time_us": "time(us)",
    "algbw": "algbw(GB/s)",
    "busbw": "busbw(GB/s)",
    "wrong": "#wrong",
    "launches": "launches",
    "status": "status",
}
SWEEP_FOOTER_COLUMNS = {
    "backend": "backend",
    "launcher": "launcher",
    "processes": "procs",
    "collective": "collective",
    "sizes": "sizes",
    "wrong": "#wrong",
    "avg_busbw": "avg busbw",
    "status": "status",
}


def _put_bw(row: dict, key: str, size: int, factor: float, time: intervals.Estimate) -> None:
    """Bandwidth (GB/s) from a time estimate: the interval's ends swap (a longer time is a lower bandwidth)."""
    bw = size * factor * 1e-9
    row[key], row[f"{key}_low"], row[f"{key}_high"] = (rounded(bw / t, 4) for t in (time.value, time.high, time.low))


def _rows_of(group: str, found: list, ident: dict) -> tuple[list, list]:
    n = ident["processes"]
    keyed: dict = {}
    for launch, tasks in enumerate(found):
        for rank_task in tasks:
            for r in rank_task["rows"]:
                if r.get("impl") == "public" or r.get("dtype", "float32") != "float32":
                    continue  # an older run's paraflow side of a size, or another element type
                slot = keyed.setdefault(r["collective"], {}).setdefault(r["bytes"], {"count": r["count"], "wrong": 0})
                slot.setdefault("time", {}).setdefault(launch, []).append(r.get("round_s") or [r["time_s"]])
                slot["impl"], slot["wrong"] = r.get("impl"), slot["wrong"] + r["wrong"]
    rows, footers = [], []
    for collective, sizes in keyed.items():
        body = []
        for size, slot in sorted(sizes.items()):
            row = {**dict.fromkeys(SWEEP_COLUMNS), **ident, "collective": collective, "impl": slot["impl"]}
            row.update(size_bytes=size, count=slot["count"], wrong=slot["wrong"], launches=len(found), status="ok")
            per_launch = [metrics.slowest_rank_per_step(ranks) for ranks in slot["time"].values()]  # per round
            est = intervals.estimate(per_launch, "median", "time", group, collective, size)
            _put(row, "time_us", est, 1e6, 2)
            _put_bw(row, "busbw", size, metrics.bus_factor(n, collective), est)
            _put_bw(row, "algbw", size, 1.0, est)
            body.append(row)
        rows += body
        busbw = [r["busbw"] for r in body if r["busbw"] is not None]
        footers.append(
            {
                **{k: ident[k] for k in ("backend", "launcher", "processes")},
                "collective": collective,
                "sizes": len(body),
                "wrong": sum(r["wrong"] for r in body),
                "avg_busbw": rounded(statistics.fmean(busbw), 4) if busbw else None,
                "status": "ok",
            }
        )
    return rows, footers


def sweep_rows(cells: list) -> tuple[list, list, list]:
    """(rows, footers, unsupported): one row per cell group x collective x size, one footer per
    group x collective, and the collectives a library refused."""
    rows, footers, unsupported = [], [], []
    for group, launches in groups(cells, "train").items():
        launches = [c for c in launches if c.get("sweep")]  # extra launches of a noisy cell skip it
        if not launches:
            continue
        first = launches[0]
        meta = next((c["ranks"][0] for c in launches if c.get("ranks")), {})
        ident = {
            "backend": first["backend"],
            "launcher": first["launcher"],
            "transport": meta.get("transport"),
            "processes": first["nproc"],
        }
        found = [t for c in launches for t in [task_of(c, "sweep")] if t is not None]
        status = group_status(launches, len(found), "sweep result")
        if not found:
            rows.append({**dict.fromkeys(SWEEP_COLUMNS), **ident, "status": status})
            footers.append({**dict.fromkeys(SWEEP_FOOTER_COLUMNS), **ident, "status": status})
            continue
        body, feet = _rows_of(group, found, ident)
        for row in body + feet:
            row["status"] = status
        rows += body
        footers += feet
        refused = {u["collective"]: u["error"] for t in found[0] for u in t.get("unsupported", [])}
        unsupported += [{**ident, "collective": c, "error": e} for c, e in refused.items()]
    return rows, footers, unsupported
