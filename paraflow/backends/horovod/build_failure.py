"""Why a horovod build failed, read from its log: the cause (CUDA, MPI, compiler, CMake) and the fix.

A failed ``pip wheel horovod`` prints hundreds of lines of CMake and compiler output; the build
keeps them in a log and ends with one short message from :func:`diagnose` naming that log.
"""

from __future__ import annotations

from typing import Optional

from ...errors import ParaflowError

__all__ = ["HorovodBuildError", "diagnose"]

_AGAIN = "then run `paraflow build-horovod --force` (or `make install`) again"

#: (cause, what marks it in the log, the fix), most specific first: a CUDA failure also says "CMake Error".
_CAUSES = (
    (
        "CUDA",
        (
            "Could NOT find CUDAToolkit",
            "No CMAKE_CUDA_COMPILER",
            "CUDA compiler identification",
            "nvcc fatal",
            "Could NOT find NCCL",
            "nccl.h",
            "cuda_runtime.h",
            "does not support CUDA",
        ),
        "build without GPU operations (`PARAFLOW_HOROVOD_GPU=0`), or point CUDA_HOME at a complete CUDA toolkit "
        f"and HOROVOD_NCCL_HOME at NCCL; {_AGAIN}",
    ),
    (
        "MPI",
        ("Could NOT find MPI", "mpi.h: No such file", "mpicc: not found"),
        "install an MPI with its compiler wrappers: `pip install mpich` into this environment (no root), or "
        f"`apt-get install openmpi-bin libopenmpi-dev` (or `module load openmpi`); {_AGAIN}",
    ),
    (
        "compiler",
        (
            "No CMAKE_CXX_COMPILER",
            "is not able to compile a simple test program",
            "Python.h: No such file",
            "internal compiler error",
            "cc1plus",
            "c++: fatal error",
            "g++: fatal error",
            ": error:",
        ),
        "install a C++ compiler and Python's headers: `apt-get install g++ python3-dev` (or `module load gcc`); "
        + _AGAIN,
    ),
    (
        "CMake",
        ("CMake Error", "Please update your CMake", "cmake: not found", "Could not find CMake"),
        f"use CMake 3.13 or newer: `python -m pip install cmake` in this environment (no root); {_AGAIN}",
    ),
)


class HorovodBuildError(ParaflowError, RuntimeError):
    """Horovod's build failed; the message names the cause, the fix and the build log."""


def diagnose(log: str) -> tuple[str, Optional[str], str]:
    """``(cause, the log line that shows it, fix)`` for a failed build's output; cause ``unknown`` when unseen."""
    lines = log.splitlines()
    for cause, marks, fix in _CAUSES:
        for line in lines:
            if any(mark in line for mark in marks):
                return cause, line.strip()[:300], fix
    return "unknown", None, f"read the log's last lines, {_AGAIN}"


def failure_message(log: str, log_path: str) -> str:
    """The short message a failed build ends with."""
    cause, line, fix = diagnose(log)
    seen = f": {line}" if line else ""
    return f"building horovod failed ({cause}){seen}\n  fix: {fix}\n  the whole log: {log_path}"
