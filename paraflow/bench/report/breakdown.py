"""The step breakdown of a training row: compute, overlapped and exposed communication, optimizer, other.

Each rank records, per pair of interleaved steps with and without gradient sync, the parts of its
synced step (rank/breakdown.py); one process records them for every timed step and communicates
nothing. Per pair the slowest rank's synced step is the step (a step takes as long as its slowest
rank) and its parts are that rank's; other = step - compute - exposed - optimizer, so the parts
add up to that step pair by pair. Per launch each part is the median over pairs; the row shows the
median over launches with its interval across launches, as every other figure. Overlapped
communication lies inside compute's time and is not one of the summed parts.
"""

from __future__ import annotations

from typing import Optional

from . import intervals

__all__ = ["BREAKDOWN_COLUMNS", "SUMMED", "launch_parts", "breakdown_estimates", "breakdown_figure"]

BREAKDOWN_COLUMNS = {
    "compute_ms": "compute ms",
    "overlapped_comm_ms": "overlapped comm ms",
    "exposed_comm_ms": "exposed comm ms",
    "optimizer_ms": "optimizer ms",
    "other_ms": "other ms",
}
#: The parts that add up to the step (overlapped communication runs during compute).
SUMMED = ("compute_ms", "exposed_comm_ms", "optimizer_ms", "other_ms")
_RAW = {"compute_ms": "compute_s", "overlapped_comm_ms": "overlapped_comm_s", "exposed_comm_ms": "exposed_comm_s"}
_RAW["optimizer_ms"] = "optimizer_s"


def launch_parts(tasks: list) -> Optional[dict]:
    """Column key -> per-pair seconds of one launch (slowest rank per pair), or None without a breakdown."""
    parts = [t.get("breakdown") for t in tasks]
    if any(p is None or not p.get("step_s") for p in parts):
        return None
    pairs = len(parts[0]["step_s"])
    if any(len(p["step_s"]) != pairs for p in parts):
        raise ValueError(f"ranks recorded different numbers of breakdown pairs: {[len(p['step_s']) for p in parts]}")
    slowest = [max(parts, key=lambda p, i=i: p["step_s"][i]) for i in range(pairs)]
    out: dict = {"step": [p["step_s"][i] for i, p in enumerate(slowest)]}
    for key, raw in _RAW.items():
        out[key] = None if any(p[raw] is None for p in parts) else [p[raw][i] for i, p in enumerate(slowest)]
    out["other_ms"] = [
        step - out["compute_ms"][i] - out["exposed_comm_ms"][i] - out["optimizer_ms"][i]
        for i, step in enumerate(out["step"])
    ]
    return out


def breakdown_estimates(per_launch: list, *key) -> dict:
    """Column key -> Estimate (seconds) over launches, None for a part some launch could not measure."""
    if not per_launch or any(p is None for p in per_launch):
        return {}
    return {
        column: None
        if any(p[column] is None for p in per_launch)
        else intervals.estimate([p[column] for p in per_launch], "median", "breakdown", column, *key)
        for column in BREAKDOWN_COLUMNS
    }


_COLOURS = {"compute_ms": "#4878a8", "exposed_comm_ms": "#d0603a", "optimizer_ms": "#6aa56a", "other_ms": "#b0b0b0"}


def breakdown_figure(rows: list, header: dict):
    """Stacked bars per model: each row's compute, exposed communication, optimizer and other (ms),
    with overlapped communication as a hatched bar beside them (it runs during compute)."""
    from .plots import footer, require_pyplot

    plt = require_pyplot()
    ok = [r for r in rows if r["status"].startswith("ok") and r.get("compute_ms") is not None]
    models = list(dict.fromkeys((r["model"], r["scaling"]) for r in ok))
    fig, axes = plt.subplots(
        1, len(models), figsize=(max(5.2, 1.3 * len(ok) / max(1, len(models)) + 2.5) * len(models), 5.8), squeeze=False
    )
    for ax, (model, scaling) in zip(axes[0], models):
        mine = [r for r in ok if r["model"] == model and r["scaling"] == scaling]
        names = [
            f"{r['backend']}\n{r['launcher']} ×{r['processes']}"
            + (f"\n{r['setting']}" if r.get("setting", "default") != "default" else "")
            for r in mine
        ]
        xs = list(range(len(mine)))
        bottom = [0.0] * len(mine)
        for key, colour in _COLOURS.items():
            heights = [max(0.0, r[key] or 0.0) for r in mine]
            ax.bar(xs, heights, 0.55, bottom=bottom, color=colour, label=BREAKDOWN_COLUMNS[key])
            bottom = [b + h for b, h in zip(bottom, heights)]
        overlapped = [r.get("overlapped_comm_ms") or 0.0 for r in mine]
        ax.bar(
            [x + 0.36 for x in xs],
            overlapped,
            0.15,
            color="white",
            edgecolor="#d0603a",
            hatch="///",
            label="overlapped comm ms (during compute)",
        )
        ax.scatter(
            xs, [r["step_ms_median"] for r in mine], marker="_", s=400, color="black", zorder=3, label="step ms median"
        )
        ax.set_xticks(xs)
        ax.set_xticklabels(names, fontsize=7)
        ax.set_ylabel("ms per step (median over launches)")
        ax.set_title(f"{model}, {scaling} scaling", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.suptitle("Where a step's time goes (parts add up to the synced step of the interleaved pairs)")
    fig.tight_layout(rect=(0, footer(fig, header), 1, 0.95))
    return fig
