"""Import horovod.torch lazily, turning every way it can be missing or broken into one clear error.

horovod's own ``import horovod.torch`` prints a warning and carries on when its compiled
extension is missing; paraflow raises :class:`MissingDependencyError` instead, naming the
command that installs a working build.
"""

from __future__ import annotations

import contextlib
import io
from types import ModuleType
from typing import Optional

from ...errors import MissingDependencyError

__all__ = ["HOROVOD_VERSION", "INSTALL_HINT", "import_horovod", "horovod_missing_reason"]

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
    except ImportError as exc:
        if getattr(exc, "name", None) in ("horovod", "horovod.torch"):
            return "horovod is not installed"
        return f"horovod is installed but `import horovod.torch` fails ({_first_line(exc)})"
    except Exception as exc:  # HorovodVersionMismatchError and friends
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
