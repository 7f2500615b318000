"""What can this machine run? The report behind ``paraflow check`` (alias ``paraflow env``).

One pass over torch and its devices, torch.distributed's process groups, the MPI on PATH and
mpi4py's, horovod's build (frameworks, controllers, tensor operations, the torch it was built
for), the launcher that started this process, and every registered backend with the reason it
cannot run here. :func:`collect` returns it as a dict (what ``--json`` prints); :func:`render`
lays it out for people. Nothing here starts communication or initialises MPI in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Optional

from ..core.placement import cores

__all__ = ["collect", "render", "main"]

_MPI4PY_PROBE = """
import json, mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
print(json.dumps({"version": mpi4py.__version__, "standard": "%d.%d" % MPI.Get_version(),
                  "library": MPI.Get_library_version().strip()}))
"""


def collect() -> dict[str, Any]:
    """Everything ``paraflow check`` reports, as plain JSON-ready values."""
    from .. import __version__

    return {
        "paraflow": {
            "version": __version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_cores": cores(),
        },
        "torch": _torch(),
        "mpi": _mpi(),
        "horovod": _horovod(),
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


def _mpi() -> dict[str, Any]:
    info: dict[str, Any] = {
        "mpirun": shutil.which("mpirun"),
        "mpirun_version": None,
        "mpi4py": None,
        "mpi4py_mpi_standard": None,
        "mpi4py_library": None,
        "mpi4py_error": None,
    }
    if info["mpirun"]:
        out = _run([info["mpirun"], "--version"])
        info["mpirun_version"] = out.splitlines()[0].strip() if out else None
    if importlib.util.find_spec("mpi4py") is None:
        info["mpi4py_error"] = "mpi4py is not installed (`pip install mpi4py`)"
        return info
    # In a child process: importing mpi4py.MPI here would start MPI in this one.
    out = _run([sys.executable, "-c", _MPI4PY_PROBE])
    try:
        probe = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError, AttributeError):
        info["mpi4py_error"] = "mpi4py is installed but `from mpi4py import MPI` fails"
        return info
    info["mpi4py"] = probe["version"]
    info["mpi4py_mpi_standard"] = probe["standard"]
    info["mpi4py_library"] = probe["library"].splitlines()[0].split(", package:")[0].strip()
    return info


def _horovod() -> dict[str, Any]:
    from ..backends.horovod.imports import horovod_missing_reason

    spec = importlib.util.find_spec("horovod")
    info: dict[str, Any] = {
        "installed": spec is not None,
        "version": None,
        "usable": False,
        "reason": None,
        "built_for_torch": None,
        "frameworks": {},
        "controllers": {},
        "tensor_operations": {},
    }
    if spec is None:
        info["reason"] = horovod_missing_reason()
        return info
    root = list(spec.submodule_search_locations or [])[0]
    info["version"] = _distribution_version("horovod")
    info["built_for_torch"] = _read_json(os.path.join(root, "metadata.json")).get("pytorch")
    info["frameworks"] = {
        name: _extension_built(root, sub, lib)
        for name, sub, lib in (
            ("pytorch", "torch", "mpi_lib_v2"),
            ("tensorflow", "tensorflow", "mpi_lib"),
            ("mxnet", "mxnet", "mpi_lib"),
        )
    }
    info["reason"] = horovod_missing_reason()
    if info["reason"] is None:
        import horovod.torch as hvd

        info["usable"] = True
        info["controllers"] = {"mpi": bool(hvd.mpi_built()), "gloo": bool(hvd.gloo_built())}
        info["tensor_operations"] = {
            "nccl": bool(hvd.nccl_built()),
            "ddl": bool(hvd.ddl_built()),
            "ccl": bool(hvd.ccl_built()),
            "mpi": bool(hvd.mpi_built()),
            "gloo": bool(hvd.gloo_built()),
            "cuda": bool(hvd.cuda_built()),
            "rocm": bool(hvd.rocm_built()),
        }
    return info


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
    return "mpi" if launcher in ("openmpi", "mpich", "mvapich2") else "gloo"


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


def _distribution_version(name: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _extension_built(root: str, subpackage: str, library: str) -> bool:
    import sysconfig

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return os.path.exists(os.path.join(root, subpackage, library + suffix))


# ---------------------------------------------------------------- layout
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
    lines.append(
        f"  mpirun     {mpi['mpirun'] or 'not found (apt-get install openmpi-bin libopenmpi-dev)'}"
        + (f"   {mpi['mpirun_version']}" if mpi["mpirun_version"] else "")
    )
    if mpi["mpi4py"]:
        lines.append(
            f"  mpi4py     {mpi['mpi4py']}, MPI {mpi['mpi4py_mpi_standard']} standard, library: {mpi['mpi4py_library']}"
        )
    else:
        lines.append(f"  mpi4py     {mpi['mpi4py_error']}")
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
        own = proc["launcher"] not in ("openmpi", "mpich", "mvapich2", "horovodrun")
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


def main(as_json: bool = False) -> int:
    """Print the report for this process; under a launcher, rank 0 prints it in full.

    With `as_json`, every process prints its own report as one line of JSON.
    """
    report = collect()
    proc = report["process"]
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
