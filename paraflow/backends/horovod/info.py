"""What horovod build is installed here: version, the torch it was built for, frameworks,
controllers, tensor operations and the MPI library it loads (for ``paraflow check``), and a one-line summary (for the
benchmark header)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from typing import Any, Optional

from ...environment.mpi_library import first_line, linked_library
from .imports import horovod_missing_reason

__all__ = ["build_report", "summary"]


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
