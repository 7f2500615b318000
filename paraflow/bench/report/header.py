"""The header every benchmark output starts with: versions, hardware, threads, launchers, commands."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
from typing import Optional

from ...backends.horovod.info import summary as horovod_summary
from ...tools.launch import find_tool

__all__ = [
    "collect_header",
    "header_lines",
    "busy_warning",
    "cluster_line",
    "extra_launches_line",
    "UNITS",
]

UNITS = "GB = 1e9 bytes, MB = 1e6 bytes; GB/s = 1e9 bytes per second; times are wall-clock"


def _mpi_version() -> str:
    mpirun = find_tool("mpirun")
    if not mpirun:
        return "not installed (no mpirun on PATH)"
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20)
        lines = [line.strip() for line in (out.stdout or out.stderr).splitlines() if line.strip()]
        return lines[0] if lines else "unknown"
    except Exception as exc:  # not installed, or refused to start
        return f"not available ({exc})"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_header(threads_per_process: dict, launchers: list) -> dict:
    """Everything a reader needs to reproduce or judge the numbers.

    Args:
        threads_per_process: process count -> torch threads each process used.
        launchers: the launchers the run used.
    """
    import torch
    import torch.distributed as dist

    from ... import __version__
    from ...core.placement import cores

    gpu = "none"
    nccl = "not available (no CUDA)"
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        gpu = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # a CUDA build without NCCL
            nccl = f"not available ({exc})"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "paraflow": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "horovod": horovod_summary(),
        "mpi": _mpi_version(),
        "gloo": f"bundled with torch {torch.__version__}"
        if dist.is_available() and dist.is_gloo_available()
        else "not available",
        "nccl": nccl,
        "cpu": _cpu_model(),
        "gpu": gpu,
        "cores": cores(),
        "threads_per_process": {str(k): v for k, v in sorted(threads_per_process.items())},
        "load_average_1min": {"start": round(os.getloadavg()[0], 2)},
        "launchers": launchers,
        "commands": [],  # the exact command of every launch, filled in once they have run
        "units": UNITS,
    }


def cluster_line(cluster: dict) -> str:
    """The emulated cluster a run used, in one line."""
    return (
        f"emulated cluster: {cluster['hosts']} hosts (network namespaces on this machine, sharing its "
        f"cores), {cluster['ranks_per_host']} rank per host, each host link {cluster['bandwidth']} both "
        f"ways ({cluster['link']})"
    )


def extra_launches_line(extra: dict) -> str:
    """Which cells got launches beyond --repeat because their intervals stayed wide
    (driver/runner.py's run_extra_launches)."""
    cells = ", ".join(f"{group} +{count}" for group, count in extra["cells"].items()) or "none"
    return (
        f"extra launches (a cell's interval still wider than --noisy after --repeat {extra['repeat']}; up to "
        f"--max-repeat {extra['max_repeat']} while the run's {extra['time_budget']:g} s lasted): {cells}"
    )


def busy_warning(header: dict) -> Optional[str]:
    """A warning when other work competed for the CPU: a 1-min load average above the core count."""
    load = header["load_average_1min"]
    busiest = max(v for v in (load.get("start"), load.get("end")) if v is not None)
    if busiest <= header["cores"]:
        return None
    return (
        f"WARNING: this machine was busy (1-min load average up to {busiest:g} on {header['cores']} cores): "
        "other processes competed for the CPU, so timings are noisy; rerun on a quiet machine to compare."
    )


def header_lines(header: dict, with_commands: bool = True) -> list[str]:
    """The header as plain lines (the caller prefixes them for Markdown, CSV or a plot)."""
    threads = ", ".join(f"{n} process{'es' * (int(n) > 1)}: {t}" for n, t in header["threads_per_process"].items())
    load = header["load_average_1min"]
    lines = [
        f"paraflow {header['paraflow']} · {header['date']} · host {header['host']}",
        f"torch {header['torch']} · horovod {header['horovod']} · MPI: {header['mpi']} · "
        f"gloo: {header['gloo']} · NCCL: {header['nccl']}",
        f"CPU: {header['cpu']} · {header['cores']} cores · GPU: {header['gpu']} · python {header['python']}",
        f"threads per process ({threads}) · launchers: {', '.join(header['launchers'])} · "
        f"1-min load average: {load.get('start')} at start, {load.get('end', '?')} at end",
        f"units: {header['units']}",
    ]
    if header.get("cluster"):
        lines.append(cluster_line(header["cluster"]))
    floor = header.get("noise_floor")
    if floor:
        spread = "n/a (a launch failed)" if floor.get("spread") is None else f"{floor['spread']:.1%}"
        medians = " and ".join(f"{m:g}" for m in floor.get("medians_ms", []))
        lines.append(
            f"noise floor (A/A check: {floor['cell']} launched twice on {floor['model']}, median step "
            f"{medians} ms): {spread}"
        )
    if header.get("extra_launches") is not None:
        lines.append(extra_launches_line(header["extra_launches"]))
    warning = busy_warning(header)
    if warning:
        lines.append(warning)
    if with_commands:
        lines.append("commands:")
        lines += [f"  {c}" for c in header["commands"]]
    return lines
