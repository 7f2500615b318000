"""The training table: one row per model x scaling x backend x launcher x process count.

Each row pools the launches of one cell. Per launch: a step takes as long as its slowest rank;
the launch's step time is the median of its steps, its throughput the global samples of its
window over the window's wall time, its communication overhead 1 - median(no-sync steps) /
median(sync steps) over interleaved pairs. The row shows the median over launches with a 95%
interval across launches (Student's t, intervals.py); p10/p90 pool every launch's steps.
"""

from __future__ import annotations

import statistics
from typing import Optional

import torch

from ..driver.config import ModelSpec
from . import intervals, metrics
from .breakdown import BREAKDOWN_COLUMNS, breakdown_estimates, launch_parts
from .launches import device_name, group_status, groups, rounded, task_of, tuning_groups
from .tables_tuning import DEFAULT_SETTING, tuned_row

__all__ = ["TRAINING_COLUMNS", "training_rows", "TASK_PREFIX"]

TASK_PREFIX = {"weak": "train", "strong": "train-strong"}

# key -> header shown on the terminal and in Markdown; CSV uses the keys (and key_low / key_high).
TRAINING_COLUMNS = {
    "model": "model",
    "scaling": "scaling",
    "backend": "backend",
    "launcher": "launcher",
    "setting": "setting",
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
    **BREAKDOWN_COLUMNS,
    "warmup_steps": "warm-up steps",
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
        sync = torch.tensor(ln["sync"], dtype=torch.float64)
        no_sync = torch.tensor(ln["no_sync"], dtype=torch.float64)
        point = metrics.communication_overhead(intervals.median(no_sync), intervals.median(sync))
        sync, no_sync = intervals.blocks(sync, "median"), intervals.blocks(no_sync, "median")  # same blocks
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
        setting=DEFAULT_SETTING,
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
    for column, est in breakdown_estimates([launch_parts(t) for _, t in found], *key).items():
        _put(row, column, est, 1e3, 3)
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
        peak_mem_mb=_peak_mb([t for _, ts in found for t in ts], "peak_rss_bytes"),
        peak_cuda_mb=_peak_mb([t for _, ts in found for t in ts], "peak_cuda_bytes"),
        model_state_mb=_model_state_mb([t for _, ts in found for t in ts]),
        final_loss=_final_loss(found[0][1]),
    )
    row["_replicas"] = t0.get("replicas", first["nproc"])
    return row, {"step": step, "x": x, "comm": comm}


def _peak_mb(tasks: list, key: str) -> Optional[float]:
    """The largest rank's peak memory (MB): resident set size, or torch's CUDA allocations; results
    written before both were kept hold one peak_memory_bytes (the RSS on a CPU)."""
    if key == "peak_rss_bytes":
        peaks = [t.get(key, t.get("peak_memory_bytes")) for t in tasks]
    else:
        peaks = [t.get(key) for t in tasks]
    peaks = [p for p in peaks if p is not None]
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
    """Efficiency (and speedup for strong scaling) against the single row of the same model, device and scaling."""
    base = {
        (r["model"], r["device"], r["scaling"]): e for r, e in zip(rows, estimates) if r["backend"] == "single" and e
    }
    for row, est in zip(rows, estimates):
        baseline = base.get((row["model"], row["device"], row["scaling"]))
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


def training_rows(cells: list, scalings: tuple = ("weak",), noisy: float = 0.10, tuning: list = None) -> tuple:
    """(rows, estimates): one row per model x scaling x cell group, the single baseline first per model.

    Efficiency: weak scaling (fixed batch per rank) X / (replicas * X_single); strong scaling
    (fixed global batch) speedup = t_single / t, efficiency = speedup / replicas, against the single
    row of the same model and device. `estimates` holds each row's interval estimates (for the verdict).
    """
    rows, estimates = [], []
    tuned = tuning_groups(cells)
    for group, launches in groups(cells, "train").items():
        for spec in launches[0]["models"]:
            for scaling in scalings:
                row, est = _row(group, launches, spec, scaling)
                rows.append(row)
                estimates.append(est)
                if group in tuned:  # the tuned row beside the default one
                    best, best_est, candidates = tuned_row(tuned[group], spec, scaling, _row)
                    if tuning is not None:
                        tuning.extend(candidates)
                    if best is not None:
                        rows.append(best)
                        estimates.append(best_est)
    for row in rows:
        row.setdefault("_replicas", row["processes"])
    _scale(rows, estimates, noisy)
    for row in rows:
        row.pop("_replicas", None)
    order = {m: i for i, m in enumerate(dict.fromkeys(r["model"] for r in rows))}
    ranked = sorted(
        range(len(rows)),
        key=lambda i: (order[rows[i]["model"]], scalings.index(rows[i]["scaling"]), rows[i]["backend"] != "single"),
    )
    return [rows[i] for i in ranked], [estimates[i] for i in ranked]
