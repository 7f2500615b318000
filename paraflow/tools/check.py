"""What can this machine run? The report behind ``paraflow check`` (alias ``paraflow env``).

One pass over torch and its devices, torch.distributed's process groups, the MPI on PATH, the MPI
library that mpi4py and horovod each load (and whether they are the same one), horovod's build
(frameworks, controllers, tensor operations, the torch it was built for), the launcher that
started this process, and every registered backend with the reason it cannot run here.
:func:`collect` returns it as a dict (what ``--json`` prints); :func:`render` lays it out for
people. Nothing here starts communication or loads MPI in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from ..backends.horovod.info import build_report as horovod_build_report
from ..core.placement import cores
from ..environment.launchers import MPI_LAUNCHERS
from ..environment.mpi_library import first_line, launcher_family, mpi4py_library, mpi_family
from .check_report import render
from .launch import find_tool

__all__ = ["collect", "render", "main"]


def collect() -> dict[str, Any]:
    """Everything ``paraflow check`` reports, as plain JSON-ready values."""
    from .. import __version__

    horovod = horovod_build_report()
    return {
        "paraflow": {
            "version": __version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_cores": cores(),
        },
        "torch": _torch(),
        "mpi": _mpi(horovod),
        "horovod": horovod,
        "process": _process(),
        "backends": _backends(),
    }


# ---------------------------------------------------------------- sections
def _torch() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    if torch.version.cuda:
        build = f"CUDA {torch.version.cuda}"
    elif getattr(torch.version, "hip", None):
        build = f"ROCm {torch.version.hip}"
    else:
        build = "CPU"
    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "index": i,
                    "name": p.name,
                    "memory_gb": round(p.total_memory / 1e9, 1),
                    "capability": f"{p.major}.{p.minor}",
                }
            )
    distributed = dist.is_available()
    nccl = distributed and dist.is_nccl_available()
    nccl_version = None
    if nccl:
        try:
            version = torch.cuda.nccl.version()  # a tuple; an int in older torch
            nccl_version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # noqa: BLE001 - a version we cannot read is just not shown
            pass
    return {
        "version": torch.__version__,
        "build": build,
        "cuda_available": torch.cuda.is_available(),
        "cuda_devices": devices,
        "distributed": distributed,
        "gloo": distributed and dist.is_gloo_available(),
        "nccl": nccl,
        "nccl_version": nccl_version,
        "mpi": distributed and dist.is_mpi_available(),
    }


def _mpi(horovod: dict[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = {
        "mpirun": find_tool("mpirun"),
        "mpirun_family": None,
        "mpirun_version": None,
        "mpi4py": None,
        "mpi4py_mpi_standard": None,
        "mpi4py_library": None,
        "mpi4py_error": None,
        "horovod_library": horovod.get("mpi_library"),
        "mismatch": None,
    }
    if info["mpirun"]:
        out = (_run([info["mpirun"], "--version"]) or "").strip()
        info["mpirun_family"] = launcher_family(info["mpirun"])
        hydra = re.search(r"Version:\s*(\S+)", out) if out.startswith("HYDRA") else None
        info["mpirun_version"] = f"Hydra {hydra.group(1)} (MPICH)" if hydra else (out.splitlines() or [None])[0]
    if importlib.util.find_spec("mpi4py") is None:
        info["mpi4py_error"] = "mpi4py is not installed (`pip install mpi4py`)"
    else:
        # In a child process: importing mpi4py.MPI here would load MPI into this one.
        probe = mpi4py_library()
        if "error" in probe:
            info["mpi4py_error"] = probe["error"]
        else:
            info["mpi4py"] = probe["version"]
            info["mpi4py_mpi_standard"] = probe["standard"]
            info["mpi4py_library"] = first_line(probe["library"])
    info["mismatch"] = _mismatch(info)
    return info


def _mismatch(mpi: dict[str, Any]) -> Optional[str]:
    """Why mpi4py, horovod and mpirun would not form one job together; None when they agree."""
    families = {
        "mpi4py": mpi_family(mpi["mpi4py_library"]),
        "horovod": mpi_family(mpi["horovod_library"]),
        "mpirun": mpi["mpirun_family"],
    }
    known = {name: family for name, family in families.items() if family}
    libraries = {mpi["mpi4py_library"], mpi["horovod_library"]} - {None}
    if len(set(known.values())) <= 1 and len(libraries) <= 1:
        return None
    labels = {"openmpi": "Open MPI", "mpich": "MPICH"}
    said = ", ".join(f"{name}: {labels.get(family, family)}" for name, family in known.items())
    if len(set(known.values())) <= 1:
        said = f"mpi4py loads {mpi['mpi4py_library']}, horovod {mpi['horovod_library']}"
    return (
        f"they use different MPIs ({said}): processes started by one MPI's mpirun and running another's "
        "library each see a world of one. Reinstall with one MPI: `make install` (PARAFLOW_MPI=system or "
        "pypi), or `paraflow build-horovod --force` after changing the MPI on PATH."
    )


def _process() -> dict[str, Any]:
    from ..environment.launchers import detect_environment
    from ..errors import LauncherError

    info: dict[str, Any] = {"host": platform.node(), "pid": os.getpid()}
    try:
        env = detect_environment()
    except LauncherError as exc:
        return {**info, "launcher": None, "error": str(exc)}
    return {
        **info,
        "launcher": env.launcher,
        "rank": env.rank,
        "world_size": env.world_size,
        "local_rank": env.local_rank,
        "local_world_size": env.local_world_size,
        "master_addr": env.master_addr,
        "master_port": env.master_port,
        "horovod_controller": _horovod_controller(env.launcher),
        "error": None,
    }


def _horovod_controller(launcher: str) -> str:
    """The horovod controller paraflow starts under `launcher` (with controller="auto")."""
    return "mpi" if launcher in MPI_LAUNCHERS else "gloo"


def _backends() -> dict[str, Any]:
    from ..core.registry import available_backends, spec

    return {
        name: {"available": reason is None, "reason": reason, "description": spec(name).description}
        for name, reason in available_backends().items()
    }


# ---------------------------------------------------------------- helpers
def _run(command: list) -> Optional[str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def main(as_json: bool = False, json_dir: Optional[str] = None) -> int:
    """Print the report for this process; under a launcher, rank 0 prints it in full.

    With `as_json`, every process prints its own report as one line of JSON. With `json_dir`,
    every process writes it to `json_dir`/rank<R>.json instead: a launcher that forwards its
    processes' output in chunks (Open MPI's does) can interleave long lines printed at once.
    """
    report = collect()
    proc = report["process"]
    if json_dir is not None:
        folder = Path(json_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{proc.get('rank', 0)}.json"
        path.write_text(json.dumps(report, sort_keys=False) + "\n")
        sys.stdout.write(f"wrote {path}\n")
        sys.stdout.flush()
        return 0
    if as_json:
        text = json.dumps(report, sort_keys=False)
    elif proc.get("rank", 0) == 0:
        text = render(report)
    else:
        text = (
            f"rank {proc['rank']} of {proc['world_size']} (local {proc['local_rank']} of "
            f"{proc['local_world_size']}) on {proc['host']}, launcher {proc['launcher']}"
        )
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0
