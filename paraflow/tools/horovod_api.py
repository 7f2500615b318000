"""``import horovod.torch as hvd`` resolving to ``paraflow.compat.horovod``, for unchanged scripts.

``paraflow run --horovod-api`` puts :data:`SITE_DIR` first on the job's ``PYTHONPATH``; the
``sitecustomize`` there (run by Python at start-up in every process of the job, after the one it
shadows) installs :class:`HorovodApiFinder`, which answers ``horovod.torch`` with the drop-in.
Nothing is installed into site-packages, and Horovod need not be installed: ``horovod`` itself is
then an empty package. This module imports nothing of paraflow's, so that start-up stays light.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import types
from collections.abc import Mapping
from typing import Any, Optional

__all__ = ["SITE_DIR", "HorovodApiFinder", "install", "uninstall", "environment", "installed"]

#: The directory whose sitecustomize installs the finder in every process that has it on PYTHONPATH.
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_api_site")
DROP_IN = "paraflow.compat.horovod"
#: Horovod's PyTorch modules whose names scripts import: all of them are the drop-in's namespace.
_ALIASES = {
    "horovod.torch",
    "horovod.torch.mpi_ops",
    "horovod.torch.functions",
    "horovod.torch.optimizer",
    "horovod.torch.compression",
    "horovod.torch.sync_batch_norm",
}


class _DropIn(importlib.abc.Loader):
    """Loads a Horovod module name as the drop-in (or, for elastic, the drop-in's ``elastic``)."""

    def __init__(self, attribute: Optional[str] = None) -> None:
        self.attribute = attribute

    def create_module(self, spec: Any) -> types.ModuleType:
        module = importlib.import_module(DROP_IN)
        return getattr(module, self.attribute) if self.attribute else module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing: the module is already loaded under its own name."""


class _EmptyHorovod(importlib.abc.Loader):
    """``horovod`` where Horovod is not installed: only ``horovod.torch`` is there."""

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []

        def __getattr__(name: str) -> Any:
            raise AttributeError(
                f"horovod.{name} is not available: Horovod is not installed here, and paraflow's Horovod API "
                "(paraflow run --horovod-api) provides horovod.torch only."
            )

        module.__getattr__ = __getattr__


class HorovodApiFinder(importlib.abc.MetaPathFinder):
    """Answers ``horovod.torch`` (and its submodules' names) with paraflow's drop-in."""

    paraflow_horovod_api = True  # how uninstall() knows a finder, whichever copy of this module made it

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in _ALIASES:
            return importlib.util.spec_from_loader(fullname, _DropIn())
        if fullname == "horovod.torch.elastic":
            return importlib.util.spec_from_loader(fullname, _DropIn("elastic"))
        if fullname.startswith("horovod.torch."):
            raise ModuleNotFoundError(
                f"{fullname} is not part of paraflow's Horovod API; import horovod.torch as hvd and use its names "
                "(docs: Migrating from Horovod).",
                name=fullname,
            )
        if fullname == "horovod" and not _found_elsewhere(self, fullname):
            return importlib.util.spec_from_loader(fullname, _EmptyHorovod(), is_package=True)
        return None


def _found_elsewhere(finder: Any, name: str) -> bool:
    """Whether the finders after `finder` import `name`, asked in the import system's order."""
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        try:
            if other.find_spec(name, None) is not None:
                return True
        except ImportError:  # the import system would stop here
            return False
    return False


def installed() -> bool:
    return any(getattr(f, "paraflow_horovod_api", False) for f in sys.meta_path)


def install() -> None:
    """Answer ``import horovod.torch`` with the drop-in in this process from now on."""
    if not installed():
        sys.meta_path.insert(0, HorovodApiFinder())


def uninstall() -> None:
    """Give the name ``horovod.torch`` back to Horovod: the finder goes, and what it loaded."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "paraflow_horovod_api", False)]
    for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
        module = sys.modules[name]
        spec = getattr(module, "__spec__", None)
        if name != getattr(module, "__name__", name) or isinstance(getattr(spec, "loader", None), _EmptyHorovod):
            del sys.modules[name]  # the drop-in under Horovod's name, or the empty horovod
    parent = sys.modules.get("horovod")
    if parent is not None and getattr(parent, "torch", None) is not None and parent.torch.__name__ != "horovod.torch":
        del parent.torch


def environment(env: Mapping[str, str] = os.environ) -> dict:
    """The job's variables that install the finder in every process it starts."""
    path = [SITE_DIR, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}
