"""paraflow: one PyTorch training loop under any data-parallel method.

import paraflow
backend = paraflow.init("ddp")          # or None: PARAFLOW_BACKEND, else by launcher
paraflow.current(), paraflow.rank()     # the same backend, from anywhere in the script
model = backend.wrap_model(model)
optimizer = backend.wrap_optimizer(optimizer, model)
"""

from __future__ import annotations

import os
from typing import Any, Optional

from . import (
    backends,  # noqa: F401  (registers the built-in backends)
    errors,
)
from .core.backend import Backend
from .core.current import current, is_main, local_rank, rank, world_size
from .core.registry import available_backends, register_backend, registered_names
from .environment import ProcessEnvironment, detect_environment
from .errors import *  # noqa: F403  (every error class, listed in errors.__all__)
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


def init(backend: Optional[str] = None, **options: Any) -> Backend:
    """Create and initialise a backend; `backend=None` picks one (see default_backend_name)."""
    return get_backend(backend or default_backend_name(), **options).init()


def launch(fn: Any, *args: Any, nprocs: int, backend: str = "ddp", **options: Any) -> list:
    """Run ``fn(backend, *args)`` in `nprocs` new processes, each inside an initialised backend.

    Returns the per-rank return values in rank order; works from scripts, ``python -`` and
    notebooks. See :func:`paraflow.tools.spawn.launch` for ``time_limit`` and the errors.
    """
    from .tools.spawn import launch as _launch

    return _launch(fn, *args, nprocs=nprocs, backend=backend, **options)
