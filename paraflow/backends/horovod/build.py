"""Build horovod against the installed torch with MPI and gloo, once, and install it.

``paraflow build-horovod`` (``scripts/build_horovod.sh`` in a checkout runs it). A plain
``pip install horovod==0.28.1`` fails against torch >= 2.1: horovod asks CMake for C++14 while
torch's headers need C++17. Here CMake runs through a small wrapper whose project-include file maps
CMake's C++14 flag to ``-std=c++17``. The wheel is cached outside any checkout, keyed by the
horovod, torch and Python versions and the MPI it is built against, so the next install of the
same combination takes seconds and a horovod built for one MPI is never installed against another.
GPU operations are built only where torch, the CUDA toolkit and a GPU allow them (gpu_build.py); a
failed build ends with its cause and fix and the path of its log (build_failure.py).

Needs a C++ compiler, CMake, Python headers and an MPI with its compiler wrappers. The MPI is the
one whose ``mpicc`` sits beside the target Python (a PyPI MPI: ``pip install mpich``), else the
one on PATH (Debian's: ``apt-get install openmpi-bin libopenmpi-dev``, or a ``module load``-ed
one); CMake likewise (``pip install cmake`` needs no root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from ...environment.cache import cache_dir
from ...environment.mpi_library import find_tool, linked_library, mpi_family, wrapper_mpi
from .build_failure import HorovodBuildError, failure_message
from .gpu_build import GpuChoice, cmake_include, gpu_choice
from .info import HOROVOD_VERSION

__all__ = [
    "wheel_cache",
    "cache_key",
    "build_gpu",
    "missing_tools",
    "linked_mpi_problem",
    "build_and_install",
    "add_arguments",
]

#: What horovod needs at run time (its install_requires) and its setup.py imports.
RUNTIME_REQUIREMENTS = ("cloudpickle", "psutil", "pyyaml", "packaging", "cffi")
#: Installed before a build without build isolation.
BUILD_REQUIREMENTS = ("setuptools", "wheel", *RUNTIME_REQUIREMENTS)

_APT = {"mpicc": "openmpi-bin libopenmpi-dev", "cmake": "cmake", "c++": "g++", "Python.h": "python3-dev"}
#: What pip installs into the target Python instead, without root.
_PIP = {"mpicc": "mpich", "cmake": "cmake"}

# CMake's C++14 flag becomes C++17 for every target (torch >= 2.1 headers need it).
_CXX17 = (
    'set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17")\nset(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++17")\n'
)

# Reports, as JSON, what horovod in the target Python can do; run there, not here.
_PROBE = """
import json, os
try:
    import torch, horovod, horovod.torch as hvd
    meta = json.load(open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")))
    ok = hasattr(hvd, "init")
    print(json.dumps({"version": horovod.__version__, "torch": torch.__version__,
                      "built_for": meta.get("pytorch"), "extension": ok,
                      "mpi": ok and bool(hvd.mpi_built()), "gloo": ok and bool(hvd.gloo_built())}))
except Exception as exc:
    print(json.dumps({"version": None, "error": str(exc)}))
"""


def wheel_cache() -> Path:
    """Where built wheels are kept: PARAFLOW_WHEEL_CACHE, else ~/.cache/paraflow/wheels."""
    if os.environ.get("PARAFLOW_WHEEL_CACHE"):
        return Path(os.environ["PARAFLOW_WHEEL_CACHE"])
    return cache_dir() / "wheels"


def _python_facts(python: str) -> dict:
    code = (
        "import json, sys, sysconfig, os, torch; print(json.dumps({"
        "'torch': torch.__version__, 'tag': 'cp%d%d' % sys.version_info[:2], "
        "'cuda': torch.version.cuda, 'gpu': torch.cuda.is_available(), "
        "'headers': os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))}))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"error: {python} cannot import torch; install torch first "
            f"(`{python} -m pip install torch`).\n{done.stderr.strip()[-500:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_gpu(python: str = sys.executable) -> GpuChoice:
    """Whether horovod for `python` is built with GPU operations, and why (gpu_build.py)."""
    facts = _python_facts(python)
    return gpu_choice(facts["cuda"], facts["gpu"])


def cache_key(python: str = sys.executable, version: str = HOROVOD_VERSION, gpu: Optional[GpuChoice] = None) -> str:
    """``horovod-<version>-torch<torch>-<cpXY>-<MPI>[-<GPU operations>]`` for `python`'s torch, Python, MPI.

    The torch part is its whole version (``2.13.0+cpu``, ``2.13.0+cu130``): horovod is built for one of
    them. A build with GPU operations ends in them (``-nccl``; ``-cuda`` with horovod's defaults). The MPI part
    (``openmpi4.1.4-system-<hash>``, ``mpich5.0.2-pypi-<hash>``; ``nompi`` without an ``mpicc``) names
    the MPI family, version, where it comes from and a hash of its ``mpicc``'s path:
    horovod links that MPI's library, and under another MPI's launcher it would run as a world of one.
    """
    facts = _python_facts(python)
    gpu = gpu or gpu_choice(facts["cuda"], facts["gpu"])
    mpi = wrapper_mpi(python)
    suffix = f"-{gpu.operations.lower() or 'cuda'}" if gpu.enabled else ""
    return f"horovod-{version}-torch{facts['torch']}-{facts['tag']}-{mpi.key if mpi else 'nompi'}{suffix}"


def _tool_path(python: str) -> str:
    """PATH for the build: `python`'s environment's bin first, so its mpicc and cmake (PyPI) win."""
    return os.pathsep.join([os.path.dirname(os.path.abspath(python)), os.environ.get("PATH", "")])


def missing_tools(python: str = sys.executable) -> list[str]:
    """The build prerequisites absent here (keys of the apt package table)."""
    missing = [] if find_tool("mpicc", python) else ["mpicc"]
    if find_tool("cmake", python) is None:
        missing.append("cmake")
    if not (shutil.which("c++") or shutil.which("g++")):
        missing.append("c++")
    if not _python_facts(python)["headers"]:
        missing.append("Python.h")
    return missing


def probe(python: str = sys.executable) -> dict:
    """What the horovod installed in `python` is: version, built-for torch, MPI and gloo."""
    done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"version": None, "error": done.stderr[-500:]}


def _working(info: dict, version: str) -> bool:
    return (
        info.get("version") == version
        and info.get("extension")
        and info.get("mpi")
        and info.get("gloo")
        and info.get("built_for") == info.get("torch")
    )


def linked_mpi_problem(python: str = sys.executable) -> Optional[str]:
    """Why the horovod installed in `python` does not link the MPI its ``mpicc`` builds against
    (another family, or a library outside a PyPI MPI's environment); None when it does."""
    mpi = wrapper_mpi(python)
    linked = linked_library("horovod.torch", python)
    if mpi is None or not linked.get("library"):
        return None
    family = mpi_family(linked["library"])
    environment = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    outside = mpi.source == "pypi" and not any(p.startswith(environment + os.sep) for p in linked["paths"])
    if (family and family != mpi.family) or outside:
        return f"it loads {', '.join(linked['paths'])}, while this environment's MPI is {mpi.describe()}"
    return None


def _cmake_wrapper(workdir: Path, cmake: str, gpu: GpuChoice) -> Path:
    include = workdir / "project.cmake"
    include.write_text(_CXX17 + cmake_include(gpu))
    wrapper = workdir / "cmake"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# configure steps get the C++17 project include; --build and --version pass through\n"
        f'case "$1" in --build|--version) exec "{cmake}" "$@";; esac\n'
        f'exec "{cmake}" -DCMAKE_PROJECT_INCLUDE="{include}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return wrapper


def _pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True)


def build_wheel(python: str, directory: Path, version: str = HOROVOD_VERSION, gpu: Optional[GpuChoice] = None) -> Path:
    """Compile horovod `version` for `python`'s torch into a wheel in `directory`, its output in build.log there.

    Raises:
        HorovodBuildError: the build failed; the message names the cause, the fix and the log.
    """
    gpu = gpu or build_gpu(python)
    directory.mkdir(parents=True, exist_ok=True)
    _pip(python, "install", "-q", *BUILD_REQUIREMENTS)
    log = directory / "build.log"
    with tempfile.TemporaryDirectory(prefix="paraflow-horovod-") as tmp:
        env = {
            **os.environ,
            "PATH": _tool_path(python),
            "HOROVOD_CMAKE": str(_cmake_wrapper(Path(tmp), find_tool("cmake", python), gpu)),
            "CMAKE_POLICY_VERSION_MINIMUM": "3.5",  # gloo's old cmake_minimum_required
            "HOROVOD_WITH_PYTORCH": "1",
            "HOROVOD_WITH_GLOO": "1",
            "HOROVOD_WITH_MPI": "1",
            "HOROVOD_WITHOUT_TENSORFLOW": "1",
            "HOROVOD_WITHOUT_MXNET": "1",
            **gpu.build_env(),
            "MAKEFLAGS": f"-j{os.cpu_count() or 1}",
        }
        with open(log, "w") as out:
            done = subprocess.run(
                [
                    python,
                    "-m",
                    "pip",
                    "wheel",
                    "--verbose",
                    "--no-build-isolation",
                    "--no-deps",
                    "--no-cache-dir",
                    "-w",
                    str(directory),
                    f"horovod=={version}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
    if done.returncode != 0:
        raise HorovodBuildError(failure_message(log.read_text(errors="replace"), str(log)))
    wheels = sorted(directory.glob(f"horovod-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"error: pip reported success but left no horovod wheel in {directory}")
    return wheels[-1]


def build_and_install(python: str = sys.executable, force: bool = False, version: str = HOROVOD_VERSION) -> int:
    """Install a working horovod into `python`: cached wheel if there is one, else build it.

    Returns:
        0 when horovod imports afterwards with its PyTorch extension, MPI and gloo.
    """
    before = probe(python)
    if _working(before, version) and not force:
        other_mpi = linked_mpi_problem(python)
        if other_mpi is None:
            print(
                f"horovod {version} is already installed for torch {before['torch']} (MPI and gloo); "
                "`--force` rebuilds it"
            )
            return 0
        print(f"reinstalling horovod: {other_mpi}", flush=True)
    gpu = build_gpu(python)
    directory = wheel_cache() / cache_key(python, version, gpu)
    print(
        f"horovod with GPU operations ({gpu.operations or 'CUDA'}): {gpu.reason}"
        if gpu.enabled
        else f"horovod without GPU operations (CPU tensors, MPI and gloo): {gpu.reason}",
        flush=True,
    )
    cached = sorted(directory.glob(f"horovod-{version}-*.whl"))
    if cached and not force:
        wheel = cached[-1]
        print(f"installing the cached {wheel}")
    else:
        missing = missing_tools(python)
        if missing:
            packages = " ".join(_APT[m] for m in missing)
            hint = ""
            if set(missing) <= set(_PIP):
                hint = f", or without root: `{python} -m pip install {' '.join(_PIP[m] for m in missing)}`"
            print(
                f"error: building horovod needs {', '.join(missing)}, missing here. Install them "
                f"first: `apt-get install {packages}` (as root or with sudo){hint}, then run this again.",
                file=sys.stderr,
            )
            return 1
        mpi = wrapper_mpi(python)
        print(
            f"building horovod {version} for this torch against {mpi.describe() if mpi else 'no MPI'} "
            f"(a few minutes, once; log in {directory / 'build.log'}); the wheel is kept in {directory}",
            flush=True,
        )
        for old in cached:
            old.unlink()
        try:
            wheel = build_wheel(python, directory, version, gpu)
        except HorovodBuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    _pip(python, "install", "-q", "--force-reinstall", "--no-deps", str(wheel))
    _pip(python, "install", "-q", *RUNTIME_REQUIREMENTS)
    after = probe(python)
    problem = linked_mpi_problem(python) if _working(after, version) else None
    if problem:
        print(f"error: horovod from {wheel} does not use this environment's MPI: {problem}", file=sys.stderr)
        return 1
    if not _working(after, version):
        print(
            f"error: horovod still does not work after installing {wheel}: {after}. "
            "Rebuild it with `paraflow build-horovod --force`.",
            file=sys.stderr,
        )
        return 1
    print(f"horovod {after['version']} works: PyTorch {after['torch']}, MPI and gloo controllers")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``paraflow build-horovod``."""
    parser.add_argument(
        "--python", default=sys.executable, help="the Python (with torch) to install into; default: this one"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if a wheel is cached")
    return parser
