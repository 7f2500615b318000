"""The collective sweep table (nccl-tests style, paraflow's call beside the raw library's) and memcpy.

Per launch, a size's time is the median over rounds of the slowest rank's time for the round's
operation; across launches the row shows the median with a 95% interval across launches
(intervals.py), bandwidths follow from the time (algbw = size / time, busbw = algbw x nccl-tests'
factor for the collective), and paraflow / raw pairs each round's paraflow operation with the raw
one beside it (median over rounds, then over launches), so both sides of a ratio come from the
same moments of the same processes.
"""

from __future__ import annotations

from typing import Optional

from . import intervals, metrics
from .launches import device_name, group_status, groups, rounded, task_of

__all__ = ["sweep_columns", "SWEEP_FOOTER_COLUMNS", "MEMCPY_COLUMNS", "sweep_rows", "memcpy_rows", "UNIT_SCALE"]

#: Bandwidth unit -> factor from bytes per second.
UNIT_SCALE = {"GB/s": 1e-9, "Gbit/s": 8e-9}
LARGE = 1024**2  # paraflow's target: within 1.1x of raw from 1 MB up


def sweep_columns(unit: str = "GB/s") -> dict:
    """Sweep columns with `unit` in the bandwidth headers."""
    return {
        "backend": "backend",
        "launcher": "launcher",
        "transport": "transport",
        "processes": "procs",
        "collective": "collective",
        "dtype": "type",
        "size_bytes": "size(B)",
        "count": "count",
        "raw_time_us": "raw time(us)",
        "raw_busbw": f"raw busbw({unit})",
        "time_us": "paraflow time(us)",
        "algbw": f"paraflow algbw({unit})",
        "busbw": f"paraflow busbw({unit})",
        "vs_raw": "paraflow/raw",
        "wrong": "#wrong",
        "memcpy": f"memcpy({unit})",
        "busbw_vs_memcpy": "busbw/memcpy",
        "launches": "launches",
        "status": "status",
    }


SWEEP_FOOTER_COLUMNS = {
    "backend": "backend",
    "launcher": "launcher",
    "processes": "procs",
    "collective": "collective",
    "dtype": "type",
    "sizes": "sizes",
    "wrong": "#wrong",
    "avg_raw_busbw": "avg raw busbw",
    "avg_busbw": "avg paraflow busbw",
    "avg_busbw_vs_memcpy": "avg busbw/memcpy",
    "worst_vs_raw_large": "worst paraflow/raw >= 1 MB",
    "vs_raw_smallest": "paraflow/raw smallest",
    "status": "status",
}
MEMCPY_COLUMNS = {
    "device": "device",
    "threads": "threads",
    "size_bytes": "size(B)",
    "time_us": "time(us)",
    "bw": "copy",
}


def memcpy_rows(cells: list, unit: str = "GB/s") -> list:
    """Copy bandwidth per device and size, from the memcpy cell."""
    rows = []
    for cell in cells:
        tasks = task_of(cell, "memcpy") if cell["kind"] == "memcpy" else None
        for device, sizes in tasks[0]["devices"].items() if tasks else ():
            for s in sizes:
                rows.append(
                    {
                        "device": device,
                        "threads": tasks[0]["threads"],
                        "size_bytes": s["bytes"],
                        "time_us": rounded(s["time_s"] * 1e6, 3),
                        "bw": rounded(s["bytes"] / s["time_s"] * UNIT_SCALE[unit], 4),
                    }
                )
    return rows


def _put_bw(row: dict, key: str, size: int, factor: float, time: intervals.Estimate, scale: float) -> None:
    """Bandwidth from a time estimate: the interval's ends swap (a longer time is a lower bandwidth)."""
    bw = size * factor * scale
    row[key], row[f"{key}_low"], row[f"{key}_high"] = (rounded(bw / t, 4) for t in (time.value, time.high, time.low))


def _put(row: dict, key: str, est: intervals.Estimate, scale: float, digits: int) -> None:
    row[key], row[f"{key}_low"], row[f"{key}_high"] = (
        rounded(v * scale, digits) for v in (est.value, est.low, est.high)
    )


def _rows_of(group: str, found: list, ident: dict, copy_bw: dict, unit: str) -> tuple[list, list]:
    n = ident["processes"]
    device = device_name(found[0][0]["device"])
    keyed: dict = {}
    for launch, tasks in enumerate(found):
        for rank_task in tasks:
            for r in rank_task["rows"]:
                slot = keyed.setdefault((r["collective"], r["dtype"], r["bytes"]), {"count": r["count"]})
                side = slot.setdefault(r["impl"], {})
                side.setdefault("time", {}).setdefault(launch, []).append(r.get("round_s") or [r["time_s"]])
                side["wrong"] = side.get("wrong", 0) + r["wrong"]
    rows, footers = [], []
    for (collective, dtype), sizes in _by_collective(keyed).items():
        body = []
        for size, slot in sizes:
            row = {**dict.fromkeys(sweep_columns(unit)), **ident, "collective": collective, "dtype": dtype}
            row.update(size_bytes=size, count=slot["count"], launches=len(found), status="ok")
            factor = metrics.bus_factor(n, collective)
            times = {}
            for side, data in slot.items():
                if side == "count":
                    continue
                per_launch = [metrics.slowest_rank_per_step(ranks) for ranks in data["time"].values()]  # per round
                times[side] = per_launch
                est = intervals.estimate(per_launch, "median", "time", group, collective, dtype, size, side)
                prefix = "raw_" if side == "raw" else ""
                _put(row, f"{prefix}time_us", est, 1e6, 2)
                _put_bw(row, f"{prefix}busbw", size, factor, est, UNIT_SCALE[unit])
                if side == "public":
                    _put_bw(row, "algbw", size, 1.0, est, UNIT_SCALE[unit])
            row["wrong"] = sum(d["wrong"] for k, d in slot.items() if k != "count")
            if "public" in times and "raw" in times:  # paired: a round's paraflow time over its raw time
                ratios = [[p / r for p, r in zip(pub, raw)] for pub, raw in zip(times["public"], times["raw"])]
                _put(row, "vs_raw", intervals.estimate(ratios, "median", "ratio", group, collective, dtype, size), 1, 3)
            busbw = row["busbw"] if row["busbw"] is not None else row["raw_busbw"]
            copy = copy_bw.get((device, size))
            row["memcpy"] = copy
            row["busbw_vs_memcpy"] = rounded(busbw / copy, 4) if copy and busbw is not None else None
            body.append(row)
        rows += body
        footers.append(_footer(ident, collective, dtype, body))
    return rows, footers


def _by_collective(keyed: dict) -> dict:
    out: dict = {}
    for (collective, dtype, size), slot in keyed.items():
        out.setdefault((collective, dtype), []).append((size, slot))
    return {k: sorted(v) for k, v in out.items()}


def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return rounded(metrics.mean(values), 4) if values else None


def _footer(ident: dict, collective: str, dtype: str, body: list) -> dict:
    large = [r for r in body if r["vs_raw"] is not None and r["size_bytes"] >= LARGE]
    first = body[0] if body else {}
    return {
        **{k: ident[k] for k in ("backend", "launcher", "processes")},
        "collective": collective,
        "dtype": dtype,
        "sizes": len(body),
        "wrong": sum(r["wrong"] for r in body),
        "avg_raw_busbw": _mean([r["raw_busbw"] for r in body]),
        "avg_busbw": _mean([r["busbw"] for r in body]),
        "avg_busbw_vs_memcpy": _mean([r["busbw_vs_memcpy"] for r in body]),
        "worst_vs_raw_large": max((r["vs_raw"] for r in large), default=None),
        # the interval ends that decide the verdict: the highest low end and the highest high end
        "worst_vs_raw_large_low": max(
            (r["vs_raw_low"] for r in large if r.get("vs_raw_low") is not None), default=None
        ),
        "worst_vs_raw_large_high": max(
            (r["vs_raw_high"] for r in large if r.get("vs_raw_high") is not None), default=None
        ),
        "vs_raw_smallest": first.get("vs_raw"),
        "vs_raw_smallest_low": first.get("vs_raw_low"),
        "vs_raw_smallest_high": first.get("vs_raw_high"),
        "status": "ok",
    }


def sweep_rows(cells: list, memcpy: Optional[list] = None, unit: str = "GB/s") -> tuple[list, list, list]:
    """(rows, footers, unsupported): one row per cell group x collective x dtype x size, one footer per
    group x collective x dtype, and the collectives or dtypes a library refused."""
    copy_bw = {(r["device"], r["size_bytes"]): r["bw"] for r in (memcpy or [])}
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
            rows.append({**dict.fromkeys(sweep_columns(unit)), **ident, "status": status})
            footers.append({**dict.fromkeys(SWEEP_FOOTER_COLUMNS), **ident, "status": status})
            continue
        body, feet = _rows_of(group, found, ident, copy_bw, unit)
        for row in body + feet:
            row["status"] = status
        rows += body
        footers += feet
        refused = {(u["collective"], u["dtype"]): u["error"] for t in found[0] for u in t.get("unsupported", [])}
        unsupported += [{**ident, "collective": c, "dtype": d, "error": e} for (c, d), e in refused.items()]
    return rows, footers, unsupported
