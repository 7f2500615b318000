"""paraflow: one PyTorch training loop under any data-parallel method.

import paraflow
backend = paraflow.init("ddp")          # or None: PARAFLOW_BACKEND, else by launcher
paraflow.current(), paraflow.rank()     # the same backend, from anywhere in the script
model = backend.wrap_model(model)
optimizer = backend.wrap_optimizer(optimizer, model)
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from . import (
    backends,  # noqa: F401  (registers the built-in backends)
    errors,
)
from .core.backend import Backend
from .core.current import current, is_main, local_rank, rank, world_size
from .core.registry import available_backends, register, registered_names, spec
from .environment.launchers import ProcessEnvironment, detect_environment
from .errors import *  # noqa: F403  (every error class, listed in errors.__all__)
from .errors import ConfigurationError
from .training.checkpoint import load_checkpoint, save_checkpoint
from .training.sampler import ShardSampler

__version__ = "0.1.0"

__all__ = [
    "init",
    "launch",
    "get_backend",
    "available_backends",
    "registered_names",
    "register_backend",
    "default_backend_name",
    "current",
    "rank",
    "world_size",
    "local_rank",
    "is_main",
    "ShardSampler",
    "save_checkpoint",
    "load_checkpoint",
    "Backend",
    "ProcessEnvironment",
    "detect_environment",
    *errors.__all__,
]


def default_backend_name(environment: Optional[ProcessEnvironment] = None) -> str:
    """PARAFLOW_BACKEND if set, else "ddp" when a launcher started several processes, else "single"."""
    if os.environ.get("PARAFLOW_BACKEND"):
        return os.environ["PARAFLOW_BACKEND"]
    env = environment or detect_environment()
    return "ddp" if env.is_distributed else "single"


def get_backend(name: str, **options: Any) -> Backend:
    """Create the backend registered as `name` with `options`, not yet initialised."""
    from .core.registry import create

    return create(name, **options)


#: `module:function` called with every backend paraflow.init starts (`paraflow bench --script`
#: installs its step counter this way, in the unmodified script).
INIT_HOOK = "PARAFLOW_INIT_HOOK"


def init(backend: Optional[str] = None, **options: Any) -> Backend:
    """Create and initialise a backend; `backend=None` picks one (see default_backend_name)."""
    started = get_backend(backend or default_backend_name(), **options).init()
    hook = os.environ.get(INIT_HOOK)
    if hook:
        import importlib

        module, _, function = hook.partition(":")
        getattr(importlib.import_module(module), function)(started)
    return started


def launch(fn: Any, *args: Any, nprocs: int, backend: str = "ddp", **options: Any) -> list:
    """Run ``fn(backend, *args)`` in `nprocs` new processes, each inside an initialised backend.

    Returns the per-rank return values in rank order; works from scripts, ``python -`` and
    notebooks. See :func:`paraflow.tools.spawn.launch` for ``time_limit`` and the errors.
    """
    from .tools.spawn import launch as _launch

    return _launch(fn, *args, nprocs=nprocs, backend=backend, **options)


def register_backend(
    name: str, backend: Union[str, type], *, description: str = "", replace: bool = False, **presets: Any
) -> None:
    """Make a backend available to :func:`paraflow.init` and ``--backend`` under `name`.

    Args:
        name: the name users pick it by (``paraflow.init(name)``, ``PARAFLOW_BACKEND``).
        backend: a :class:`paraflow.Backend` subclass, or ``"module:Class"`` imported on first use
            (so a backend with heavy dependencies costs nothing until chosen).
        description: one line for ``paraflow list``.
        replace: allow `name` to replace an existing registration (else an error).
        **presets: keyword options passed to the class whenever it is created under `name`;
            one class can be registered under several names with different presets.
    """
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ConfigurationError(f"a backend name is a non-empty word, got {name!r}.")
    if isinstance(backend, str):
        if ":" not in backend:
            raise ConfigurationError(f"register {name!r} with a class or 'module:Class', got {backend!r}.")
    else:
        if not (isinstance(backend, type) and issubclass(backend, Backend)):
            raise ConfigurationError(f"backend {name!r} must be a paraflow.Backend subclass, got {backend!r}.")
    if name in registered_names() and not replace:
        raise ConfigurationError(
            f"backend {name!r} is already registered ({spec(name).target}); pick another name or pass replace=True."
        )
    register(name, backend, description, **presets)
