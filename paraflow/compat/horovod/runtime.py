"""Which backend the Horovod API runs on: started by ``hvd.init()``, left by ``hvd.shutdown()``.

``hvd.init()`` starts the backend ``paraflow.init()`` would pick (``PARAFLOW_BACKEND``, which
``paraflow run --backend`` sets, else ddp under a launcher of several processes, else single),
or joins one the script started already. On a backend whose processes run Horovod itself
(``NATIVE_API``), every call goes to the real ``horovod.torch``; elsewhere to
:mod:`paraflow.compat.horovod.ops` over the backend's torch.distributed process group.
"""

from __future__ import annotations

import atexit
import sys
from types import ModuleType
from typing import Any, Optional

from ...errors import NotInitializedError

__all__ = ["start", "stop", "backend", "native", "started", "watch_optimizers", "optimizer_made"]

#: The module a backend's class names in NATIVE_API when its processes run Horovod itself.
HOROVOD_API = "horovod.torch"


class _State:
    backend: Any = None  # the paraflow backend the calls run on
    native: Optional[ModuleType] = None  # the real horovod.torch, on a backend that runs it
    owned = False  # whether hvd.init() started the backend (then hvd.shutdown() ends it)
    failed = False  # an uncaught exception is ending the process: leave without the final barrier
    watching_exit = False  # stop() runs at exit, and uncaught errors are noted


_state = _State()
#: Called with every DistributedOptimizer the script makes (``paraflow bench --script --horovod-api`` counts its steps).
_optimizer_watchers: list = []


def start() -> None:
    """Start (or join) the backend; a second call does nothing, as in Horovod."""
    if _state.backend is not None:
        return
    import paraflow  # the top-level API (paraflow.init runs PARAFLOW_INIT_HOOK, as for any script)

    from ...core.current import current
    from ...core.registry import spec

    try:
        running = current()
    except NotInitializedError:
        running = None
    name = running.name if running is not None else paraflow.default_backend_name()
    runs_horovod = getattr(spec(name).load(), "NATIVE_API", None) == HOROVOD_API
    if runs_horovod:
        _let_the_real_horovod_load()
    _state.backend = running or paraflow.init(name)
    _state.owned = running is None
    if runs_horovod:
        from ...backends.horovod.info import import_horovod

        _state.native = import_horovod()
    if _state.owned and not _state.watching_exit:  # once per process: stop() ends whichever backend runs then
        _state.watching_exit = True
        atexit.register(stop)
        _note_uncaught_errors()


def stop() -> None:
    """End the backend ``start`` began (with its final barrier, unless an error is ending the process)."""
    backend, owned = _state.backend, _state.owned
    _state.backend, _state.native, _state.owned = None, None, False
    if backend is not None and owned:
        if _state.failed:
            backend._leaving_on_error = True  # the other ranks may be inside another collective
        backend.shutdown()


def started() -> bool:
    return _state.backend is not None


def backend() -> Any:
    """The backend the calls run on.

    Raises:
        NotInitializedError: ``hvd.init()`` was not called (or ``hvd.shutdown()`` was).
    """
    if _state.backend is None:
        raise NotInitializedError(
            "Horovod's API is not initialised in this process: call hvd.init() first "
            "(paraflow.compat.horovod starts the backend PARAFLOW_BACKEND names there)."
        )
    return _state.backend


def native() -> Optional[ModuleType]:
    """The real ``horovod.torch`` on a backend that runs Horovod itself, else None."""
    return _state.native


def _let_the_real_horovod_load() -> None:
    """Under ``--horovod-api`` the name ``horovod.torch`` is this module: give it back to Horovod."""
    from ...tools import horovod_api

    horovod_api.uninstall()


def _note_uncaught_errors() -> None:
    previous = sys.excepthook

    def excepthook(kind, value, traceback) -> None:
        _state.failed = True
        previous(kind, value, traceback)

    sys.excepthook = excepthook


def watch_optimizers(watcher: Any) -> None:
    """Call `watcher(optimizer)` with every ``hvd.DistributedOptimizer`` made from now on."""
    _optimizer_watchers.append(watcher)


def optimizer_made(optimizer: Any) -> Any:
    """Hand a new DistributedOptimizer (the drop-in's or Horovod's) to the watchers; returns it."""
    for watcher in _optimizer_watchers:
        watcher(optimizer)
    return optimizer
