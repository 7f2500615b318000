"""Where a `--trace` launch writes its traces, and the variable that turns horovod's timeline on."""

from __future__ import annotations

from pathlib import Path

from ...core.registry import spec
from ..report.launches import TRACE_TAG
from .matrix import Cell

__all__ = ["trace_dir", "trace_args", "trace_env", "HOROVOD_PACKAGE"]

HOROVOD_PACKAGE = "paraflow.backends.horovod"


def trace_dir(cell: Cell, out_dir: Path) -> Path:
    """OUT/traces/<cell>/ for a trace launch whose raw numbers go to OUT/raw/<cell>/."""
    return out_dir.parent.parent / "traces" / cell.id


def trace_args(cell: Cell, out_dir: Path) -> list:
    """The worker's --trace argument for a trace launch, else nothing."""
    return ["--trace", str(trace_dir(cell, out_dir))] if cell.tag == TRACE_TAG else []


def trace_env(cell: Cell, out_dir: Path) -> dict:
    """HOROVOD_TIMELINE for a horovod trace launch (horovod writes it from start-up on), else nothing."""
    if cell.tag != TRACE_TAG or not spec(cell.backend).load().__module__.startswith(HOROVOD_PACKAGE):
        return {}
    trace_dir(cell, out_dir).mkdir(parents=True, exist_ok=True)
    return {"HOROVOD_TIMELINE": str(trace_dir(cell, out_dir) / "horovod-timeline.json")}
