"""The answer on one screen: the verdict first, one line per model, then a compact table.

Everything else (every table, the collectives sweep, the cost model, the
commands) is in results.md, the CSV files, results.json and the plots.

    mlp, 2 processes: horovod·mpirun 1.18× [1.10, 1.26] the throughput of ddp-gloo·torchrun;
    fastest here: horovod·mpirun            (one line on the screen)
"""

from __future__ import annotations

from typing import Optional

__all__ = ["screen_report", "headline", "headlines", "compact_rows", "interval_text", "COMPACT_COLUMNS"]

#: The compact table's columns: key -> header.
COMPACT_COLUMNS = {
    "model": "model",
    "run": "backend·launcher",
    "processes": "procs",
    "samples": "samples/s [95%]",
    "step": "step ms",
    "efficiency": "scaling eff",
    "rss": "peak RSS MB/rank",
    "cuda": "peak CUDA MB/rank",
    "params": "params",
}


def _name(text: str) -> str:
    """`backend · launcher` as `backend·launcher`."""
    return text.replace(" · ", "·")


def _run(row: dict) -> str:
    """A training row's `backend · launcher`, with `· compiled` for a compiled model's (as the verdict names it)."""
    return f"{row['backend']} · {row['launcher']}" + (" · compiled" if row.get("compiled") == "yes" else "")


def _backend(name: str) -> str:
    return name.split(" · ")[0]


def headline(entry: dict, baseline: Optional[dict] = None) -> str:
    """One verdict entry (verdict.training_verdict) as one line: the fastest against the best of
    another backend, with the interval of the throughput ratio, and who is fastest here; alone at
    its process count, against the one-process baseline (`baseline`: its training row)."""
    n = entry["processes"]
    where = f"{entry['model']}, {n} process{'es' * (n > 1)}"
    others = entry["slower"] + entry["no_significant_difference"]
    others.sort(key=lambda o: o["factor"])  # the closest first
    ties = entry["fastest"]
    fastest = ties[0] if len(ties) == 1 else None
    first = entry.get("first") or ties[0]
    rival = next((o for o in others if _backend(o["name"]) != _backend(first)), others[0] if others else None)
    if rival is None:
        return f"{where}: {_name(first)} {_against_single(baseline, n)}"
    factor = f"{rival['factor']:.2f}× [{rival['low']:.2f}, {rival['high']:.2f}]"
    called = "" if rival["slower"] else " (no significant difference)"
    here = _name(fastest) if fastest else " = ".join(_name(t) for t in ties) + " (within noise of each other)"
    return f"{where}: {_name(first)} {factor} the throughput of {_name(rival['name'])}{called}; fastest here: {here}"


def _against_single(row: Optional[dict], n: int) -> str:
    """The only configuration at `n` processes against single: its throughput ratio (scaling
    efficiency x n, with the efficiency's interval), or that nothing compares."""
    if not row or row.get("scaling_efficiency") is None or n == 1:
        return "only, nothing to compare with here"
    eff, low, high = (row.get(f"scaling_efficiency{k}") for k in ("", "_low", "_high"))
    ratio = f"{eff * n:.2f}×" + (f" [{low * n:.2f}, {high * n:.2f}]" if low is not None and high is not None else "")
    return f"only; {ratio} the throughput of single·python (1 process): scaling efficiency {eff:.0%}"


def headlines(verdict: list, training: Optional[list] = None) -> list:
    """One line per model: weak scaling, at the model's largest process count
    (`training`: the training rows, for a configuration alone at its process count)."""
    entries = [v for v in verdict if "processes" in v and v.get("scaling") == "weak"]
    widest: dict = {}
    for entry in entries:
        if entry["processes"] >= widest.get(entry["model"], {"processes": 0})["processes"]:
            widest[entry["model"]] = entry
    rows = {(r["model"], _run(r), r["processes"]): r for r in training or [] if r.get("scaling", "weak") == "weak"}
    return [headline(e, rows.get((e["model"], e.get("first"), e["processes"]))) for e in widest.values()]


def interval_text(value, low=None, high=None, fmt: str = "g") -> str:
    """`value [low–high]` in `fmt`: the value alone without both ends, — without a value."""
    if value is None:
        return "—"
    if low is None or high is None:
        return format(value, fmt)
    return f"{format(value, fmt)} [{format(low, fmt)}–{format(high, fmt)}]"


def _params(row: dict) -> str:
    count, mb = row.get("parameters"), row.get("param_mb")
    if count is None:
        return "—"
    size = f"{count / 1e6:.2f} M" if count >= 1e5 else f"{count:,}"
    return size + (f" / {mb:g} MB" if mb is not None else "")


def compact_rows(training: list) -> list:
    """The compact table's rows: weak scaling, one per model x backend x launcher x processes."""
    rows = []
    for row in training:
        if row.get("scaling", "weak") != "weak":
            continue
        interval = [row.get(k) for k in ("samples_per_s", "samples_per_s_low", "samples_per_s_high")]
        samples = interval_text(*interval, ",.0f") if row.get("status") == "ok" else row.get("status")
        rows.append(
            {
                "model": row["model"],
                "run": _name(_run(row)),
                "processes": row["processes"],
                "samples": samples,
                "step": interval_text(row.get("step_ms_median"), fmt=".3g"),
                "efficiency": interval_text(row.get("scaling_efficiency"), fmt=".0%"),
                "rss": interval_text(row.get("peak_mem_mb"), fmt=",.0f"),
                "cuda": interval_text(row.get("peak_cuda_mb"), fmt=",.0f"),
                "params": _params(row),
            }
        )
    return rows


def _table(rows: list) -> str:
    from tabulate import tabulate

    columns = dict(COMPACT_COLUMNS)
    if all(r["cuda"] == "—" for r in rows):
        columns.pop("cuda")
    return tabulate([[r[k] for k in columns] for r in rows], headers=list(columns.values()), tablefmt="simple")


def _machine(header: dict) -> str:
    load = header.get("load_average_1min", {})
    return (
        f"torch {header.get('torch')} · horovod {header.get('horovod')} · {header.get('cpu')}, {header.get('cores')} "
        f"cores · GPU: {header.get('gpu')} · 1-min load {load.get('start')} → {load.get('end', '?')}"
    )


def screen_report(results: dict, out: Optional[str] = None) -> str:
    """What a run prints at its end: verdict lines, the compact table, the machine, failures, where the rest is."""
    from .header import busy_warning

    out = out or results.get("config", {}).get("out", "the results folder")
    lines = ["", f"Verdict (throughput, median over launches with its 95% interval; every figure: {out}/results.md)"]
    found = headlines(results["tables"].get("verdict", []), results["tables"].get("training", []))
    lines += [f"  {line}" for line in found] or ["  no training row was measured"]
    rows = compact_rows(results["tables"].get("training", []))
    if rows:
        lines += ["", _table(rows)]
    lines += ["", _machine(results["header"])]
    warning = busy_warning(results["header"])
    if warning:
        lines.append(warning)
    skipped = results.get("skipped", {})
    if skipped:
        lines.append("not run here: " + "; ".join(f"{name} ({why})" for name, why in skipped.items()))
    failed = [f"  {c['id']}: {c['status']}: {c['error']}" for c in results["cells"] if c["status"] != "ok"]
    if failed:
        lines += ["FAILED cells:", *failed]
    return "\n".join(lines)
