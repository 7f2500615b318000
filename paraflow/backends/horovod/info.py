"""What horovod build is installed here, and importing it.

:func:`import_horovod` imports ``horovod.torch`` lazily, turning every way it can be missing or
broken into one clear error: horovod's own ``import horovod.torch`` prints a warning and carries
on when its compiled extension is missing; paraflow raises :class:`MissingDependencyError`
instead, naming the command that installs a working build. :func:`build_report` describes the
build (version, the torch it was built for, frameworks, controllers, tensor operations and the
MPI library it loads) for ``paraflow check``, and :func:`summary` in one line for the
benchmark's header.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
from types import ModuleType
from typing import Any, Optional

from ...environment.mpi_library import first_line, linked_library
from ...errors import MissingDependencyError

__all__ = ["HOROVOD_VERSION", "INSTALL_HINT", "import_horovod", "horovod_missing_reason", "build_report", "summary"]

#: The horovod release paraflow builds and tests against.
HOROVOD_VERSION = "0.28.1"

#: How to get a horovod built for the installed torch, with MPI and gloo.
INSTALL_HINT = (
    "Install it with `make install` in a paraflow checkout, or on any machine: "
    "`apt-get install openmpi-bin libopenmpi-dev cmake g++` then "
    "`pip install 'paraflow[horovod]' && paraflow build-horovod` "
    f"(builds horovod {HOROVOD_VERSION} against your torch in a few minutes, once; later installs "
    "reuse the cached wheel). A plain `pip install horovod` does not compile against torch >= 2.1."
)


def import_horovod() -> ModuleType:
    """Return ``horovod.torch``, built with its PyTorch extension.

    Raises:
        MissingDependencyError: horovod is not installed, lacks its PyTorch extension, or was
            built for another torch; the message says how to install a working build.
    """
    reason = _import_error()
    if reason:
        raise MissingDependencyError(f"{reason}. {INSTALL_HINT}")
    import horovod.torch as hvd

    return hvd


def horovod_missing_reason() -> Optional[str]:
    """None when ``horovod.torch`` imports with its extension, else why not and how to fix it."""
    reason = _import_error()
    return f"{reason}. {INSTALL_HINT}" if reason else None


def _import_error() -> Optional[str]:
    """Why ``horovod.torch`` cannot be used, or None; horovod's own prints are swallowed."""
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise):
            import horovod.torch as hvd
    except Exception as exc:  # an ImportError, HorovodVersionMismatchError and friends
        if isinstance(exc, ImportError) and getattr(exc, "name", None) in ("horovod", "horovod.torch"):
            return "horovod is not installed"
        return f"horovod is installed but `import horovod.torch` fails ({_first_line(exc)})"
    if not hasattr(hvd, "init"):
        return (
            "horovod is installed without its PyTorch extension "
            f"({_first_line(noise.getvalue()) or 'mpi_lib_v2 is missing'})"
        )
    return None


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else ""


def build_report() -> dict[str, Any]:
    """horovod's build as JSON-ready values; ``reason`` says why it cannot be used, if it cannot."""
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
        "mpi_library": None,
        "mpi_library_paths": [],
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
        # In a child process: the MPI library horovod's extension loads (never started here).
        linked = linked_library("horovod.torch")
        info["mpi_library"] = first_line(linked.get("library"))
        info["mpi_library_paths"] = linked.get("paths", [])
    return info


def summary() -> str:
    """``0.28.1 (built with MPI, gloo)``, ``not installed`` or why it does not load."""
    version = _distribution_version("horovod")
    if version is None:
        return "not installed"
    try:
        import horovod.torch as hvd

        parts = [
            name
            for name, built in (("MPI", hvd.mpi_built()), ("gloo", hvd.gloo_built()), ("NCCL", hvd.nccl_built()))
            if built
        ]
        return f"{version} (built with {', '.join(parts) or 'no controller'})"
    except Exception as exc:  # installed but its extension does not load
        return f"{version} (does not load: {exc})"


def _distribution_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
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
