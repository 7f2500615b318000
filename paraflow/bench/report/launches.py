"""Cell records grouped into launches of the same cell, and the helpers every table uses."""

from __future__ import annotations

from typing import Optional

__all__ = [
    "TASK_PREFIX",
    "AA_TAG",
    "groups",
    "task_of",
    "status_of",
    "group_status",
    "rounded",
    "device_name",
]


#: Task name prefix per scaling mode in a rank's JSON: train/<model>, train-strong/<model>.
TASK_PREFIX = {"weak": "train", "strong": "train-strong"}


def rounded(value: Optional[float], digits: int) -> Optional[float]:
    """`value` rounded once, for every output alike (None stays None)."""
    return None if value is None else round(value, digits)


def device_name(text: str) -> str:
    """ "cuda:1" -> "cuda"."""
    return str(text).split(":")[0]


def status_of(cell: dict) -> str:
    """ "ok", or the cell's status with its error."""
    return f"{cell['status']}: {cell['error']}" if cell.get("error") else str(cell["status"])


def task_of(cell: dict, name: str) -> Optional[list]:
    """Every rank's result for task `name`, or None when any rank lacks it."""
    ranks = cell.get("ranks") or []
    found = [r["tasks"][name] for r in ranks if name in r.get("tasks", {})]
    return found if len(found) == cell["nproc"] and found else None


AA_TAG = "aa"


def groups(cells: list, kind: str, aa: bool = False) -> dict:
    """group name -> the launches of that cell (records of `kind`), in launch order; the A/A
    check's launches only with `aa`, and then only they; never an older run's tuning or trace launches."""
    found: dict = {}
    for cell in cells:
        older = cell.get("options") or cell.get("tag") == "trace"
        if cell["kind"] == kind and (cell.get("tag", "") == AA_TAG) == aa and not older:
            found.setdefault(cell.get("group", cell["id"]), []).append(cell)
    return found


def group_status(launches: list, used: int, what: str) -> str:
    """ "ok" when every launch gave `what`; else how many did and why the others did not."""
    if used == len(launches):
        return "ok"
    if len(launches) == 1:
        return status_of(launches[0]) if launches[0]["status"] != "ok" else f"failed: a rank has no {what}"
    failed = [
        f"launch {c.get('repeat') or i + 1}: {status_of(c)}" for i, c in enumerate(launches) if c["status"] != "ok"
    ]
    reason = "; ".join(failed) or f"a rank has no {what}"
    if used == 0:
        return reason if failed else f"failed: {reason}"
    return f"ok ({used} of {len(launches)} launches; {reason})"
