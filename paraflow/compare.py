"""Run train.py under each backend available here with its own launcher and compare them."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

from .launch import default_launcher, launch_command, run_launch
from .registry import available_backends

TRAIN = Path(__file__).resolve().parent.parent / "train.py"


def _cells(nproc: int) -> list[tuple[str, str, int]]:
    cells = []
    for name, reason in available_backends().items():
        if reason is not None or name == "ddp":  # ddp duplicates ddp-gloo or ddp-nccl
            continue
        n = 1 if name in ("single", "dp") else nproc
        cells.append((name, default_launcher(name, n), n))
    return cells


def compare(nproc: int = 2, epochs: int = 3, timeout: float = 300, train_args: Optional[list] = None) -> list[dict]:
    """Train under every available backend; return one summary row per run."""
    rows = []
    threads = str(max(1, (os.cpu_count() or 1) // nproc))
    with tempfile.TemporaryDirectory() as tmp:
        for name, launcher, n in _cells(nproc):
            out = Path(tmp) / f"{name}.json"
            script = [str(TRAIN), "--backend", name, "--epochs", str(epochs), "--json-out", str(out),
                      *(train_args or [])]
            env = {"PARAFLOW_NUM_THREADS": threads if n > 1 else str(os.cpu_count() or 1)}
            print(f"running {name} under {launcher} with {n} process(es) ...", file=sys.stderr, flush=True)
            result = run_launch(launch_command(launcher, n, script, env_keys=list(env)), timeout, env)
            row = {"backend": name, "launcher": launcher, "processes": n}
            if result.ok and out.exists():
                s = json.loads(out.read_text())
                times = s["step_times_s"][1:] or s["step_times_s"]
                median = statistics.median(times)
                row.update({"global batch": s["global_batch_size"], "steps": s["steps"],
                            "step ms (median)": round(median * 1e3, 3),
                            "samples/s": round(s["global_batch_size"] / median, 1),
                            "accuracy": round(s["accuracy"], 4), "status": "ok"})
            else:
                why = "timed out" if result.timed_out else (result.stderr.strip().splitlines() or ["failed"])[-1]
                row["status"] = f"failed: {why}"
            rows.append(row)
    return rows
