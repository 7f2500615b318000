"""The text ``paraflow check`` prints from :func:`paraflow.tools.check.collect`'s report."""

from __future__ import annotations

from typing import Any

from ..environment.launchers import MPI_LAUNCHERS

__all__ = ["render"]


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
        own = proc["launcher"] not in (*MPI_LAUNCHERS, "horovodrun")
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
