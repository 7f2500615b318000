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
import sys
from pathlib import Path
from typing import Any, Optional

from ..backends.horovod.info import build_report as horovod_build_report
from ..core.placement import cores
from ..environment.launchers import get_launcher
from ..environment.mpi_library import command_output, first_line, launcher_family, mpi4py_library, mpi_family
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
        out = command_output([info["mpirun"], "--version"]).strip()
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
        # the horovod controller paraflow starts under this launcher (with controller="auto")
        "horovod_controller": "mpi" if env.is_mpi else "gloo",
        "error": None,
    }


def _backends() -> dict[str, Any]:
    from ..core.registry import available_backends, spec

    return {
        name: {"available": reason is None, "reason": reason, "description": spec(name).description}
        for name, reason in available_backends().items()
    }


# ---------------------------------------------------------------- the text
def _mark(value: Any) -> str:
    return "[x]" if value else "[ ]"


def _boxes(flags: dict, labels: dict) -> str:
    return "  ".join(f"{_mark(flags.get(key))} {label}" for key, label in labels.items())


def render(report: dict[str, Any]) -> str:
    """The report as aligned text, one section per component."""
    pf, t, mpi, hvd, proc = (report[k] for k in ("paraflow", "torch", "mpi", "horovod", "process"))
    lines = [f"paraflow {pf['version']}   Python {pf['python']}   {pf['platform']}   {pf['cpu_cores']} CPU cores", ""]

    lines.append(f"torch        {t['version']} ({t['build']} build)")
    if t["cuda_devices"]:
        for d in t["cuda_devices"]:
            lines.append(
                f"  GPU {d['index']}        {d['name']}, {d['memory_gb']} GB, compute capability {d['capability']}"
            )
    else:
        lines.append("  GPUs       none visible" + (" (CPU build of torch)" if t["build"] == "CPU" else ""))
    if t["distributed"]:
        nccl = "NCCL" + (f" {t['nccl_version']}" if t["nccl_version"] else "")
        lines.append(f"  distributed  {_boxes(t, {'gloo': 'gloo', 'nccl': nccl, 'mpi': 'MPI'})}")
    else:
        lines.append("  distributed  not built into this torch")
    lines.append("")

    lines.append("MPI")
    missing = "not found (apt-get install openmpi-bin libopenmpi-dev, or pip install mpich)"
    lines.append(
        f"  mpirun     {mpi['mpirun'] or missing}" + (f"   {mpi['mpirun_version']}" if mpi["mpirun_version"] else "")
    )
    if mpi["mpi4py"]:
        lines.append(
            f"  mpi4py     {mpi['mpi4py']}, MPI {mpi['mpi4py_mpi_standard']} standard, library: {mpi['mpi4py_library']}"
        )
    else:
        lines.append(f"  mpi4py     {mpi['mpi4py_error']}")
    if mpi.get("horovod_library"):
        lines.append(f"  horovod    library: {mpi['horovod_library']}")
    if mpi.get("mismatch"):
        lines.append(f"  MISMATCH   {mpi['mismatch']}")
    lines.append("")

    if not hvd["installed"]:
        lines.append(f"horovod      not installed: {hvd['reason']}")
    else:
        built_for = hvd["built_for_torch"]
        mismatch = built_for and built_for != t["version"]
        lines.append(
            f"horovod      {hvd['version']}, built for torch {built_for or '?'}"
            + ("  <-- this is torch " + t["version"] if mismatch else "")
        )
        lines.append(
            "  frameworks   "
            + _boxes(hvd["frameworks"], {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "mxnet": "MXNet"})
        )
        if hvd["usable"]:
            lines.append("  controllers  " + _boxes(hvd["controllers"], {"mpi": "MPI", "gloo": "Gloo"}))
            lines.append(
                "  tensor ops   "
                + _boxes(
                    hvd["tensor_operations"],
                    {
                        "nccl": "NCCL",
                        "ddl": "DDL",
                        "ccl": "CCL",
                        "mpi": "MPI",
                        "gloo": "Gloo",
                        "cuda": "CUDA",
                        "rocm": "ROCm",
                    },
                )
            )
        else:
            lines.append(f"  unusable: {hvd['reason']}")
    lines.append("")

    lines.append("this process")
    if proc["error"]:
        lines.append(f"  launcher   cannot tell: {proc['error']}")
    else:
        lines.append(
            f"  launcher   {proc['launcher']}: rank {proc['rank']} of {proc['world_size']}, "
            f"local rank {proc['local_rank']} of {proc['local_world_size']}, on {proc['host']}"
        )
        if proc["master_addr"]:
            lines.append(f"  rank 0 at  {proc['master_addr']}:{proc['master_port'] or '?'}")
        launcher = get_launcher(proc["launcher"])
        own = not (launcher.mpi or launcher.runs_horovod_rendezvous)
        lines.append(
            f"  horovod    would use its {proc['horovod_controller'].replace('mpi', 'MPI')} controller "
            "here" + (" (rank 0 starts horovod's rendezvous server)" if own else "")
        )
    lines.append("")

    lines.append("backends")
    width = max(map(len, report["backends"]))
    for name, b in report["backends"].items():
        status = "available   " if b["available"] else "unavailable "
        lines.append(f"  {name.ljust(width)}  {status} {b['description'] if b['available'] else b['reason']}")
    return "\n".join(lines)


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
