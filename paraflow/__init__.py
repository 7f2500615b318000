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
    elastic,  # noqa: F401  (paraflow.elastic: training that survives lost workers)
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
    """Create and initialise a backend: the one call a training script needs.

    ```python
    with paraflow.init() as backend:        # or paraflow.init("fsdp", timeout=120, precision="bf16")
        model = backend.wrap_model(model)
    ```

    Leaving the `with` block (or `backend.shutdown()`) ends with a barrier, so no rank reports
    success while another still needs the job. A second `init` after a shutdown starts afresh.

    Args:
        backend: a registered name (`single`, `dp`, `ddp`, `ddp-gloo`, `ddp-nccl`, `fsdp`,
            `horovod`, or one added with `register_backend`). None picks one: `PARAFLOW_BACKEND`
            (which `paraflow run --backend` sets), else `ddp` when a launcher started several
            processes, else `single` (see `default_backend_name`).
        **options: keyword options. Every backend takes these:

            - `timeout`: seconds any wait may last before it fails on every rank (default 600,
              or `PARAFLOW_TIMEOUT`).
            - `stall_threshold`: seconds ranks may wait on each other before every rank prints a
              `paraflow stall:` report (default 30, or `PARAFLOW_STALL_THRESHOLD`; at most half
              the timeout; 0 turns it off).
            - `check_collectives`: check before each public collective that every rank makes the
              same call (default: on under `PARAFLOW_DEBUG=1`).
            - `precision`: `"fp32"` (default), `"bf16"` or `"fp16"`, the dtype `backend.autocast()`
              computes in; `"fp16"` also turns on `backend.grad_scaler()`'s loss scaling.
            - `compression`: the gradients' dtype on the wire, `"none"` (default), `"fp16"` or
              `"bf16"` (ddp and fsdp: both; horovod: fp16).
            - `accumulation_steps`: micro-batches per optimizer step under `backend.accumulate`
              (default 1).
            - `num_threads`: torch threads per process on the CPU (default: cores divided by the
              processes on this host, or `PARAFLOW_NUM_THREADS`).
            - `world_size`: the number of processes you expect; another number from the launcher
              fails at once.
            - `device`: `"cpu"` or `"cuda"` (default: CUDA when the backend uses it and a GPU is
              visible).
            - `banner`: print the one-line start-up banner on rank 0 (default True, or
              `PARAFLOW_BANNER=0` to silence it).

            Each backend adds its own:

            - `ddp`, `ddp-gloo`, `ddp-nccl`: `process_group` (`"nccl"`, `"gloo"` or `"auto"`),
              and DistributedDataParallel's `bucket_cap_mb`, `gradient_as_bucket_view`,
              `static_graph`, `find_unused_parameters`, `broadcast_buffers`, passed unchanged.
            - `fsdp`: `process_group`; `blocks` (the module classes sharded as units of their own,
              like `"Block"` or `[nn.TransformerEncoderLayer]`); `min_block_params` (the size from
              which a submodule is a unit by default, 50,000); `reshard_after_forward`
              (`fully_shard`'s); `async_save` (`save` returns once the shards are in memory).
            - `horovod`: `controller` (`"auto"`, `"mpi"` or `"gloo"`), `reduce_op` (`"average"`,
              `"sum"` or `"adasum"`), `gradient_predivide_factor`, `fusion_threshold_mb`,
              `cycle_time_ms`.
            - `dp`: `device_ids`, `output_device`, as `nn.DataParallel` takes them.

            An option of another registered backend is accepted and ignored (rank 0 says so
            once), so one script can carry every backend's tuning; a name no backend takes is a
            `ConfigurationError`.

    Returns:
        The initialised backend (a `paraflow.Backend`), also a context manager.

    Raises:
        UnknownBackendError: `backend` is not a registered name; the message lists the known ones.
        BackendUnavailableError: the backend cannot run here (`ddp-nccl` without a GPU); the
            reason is the one `paraflow backends` prints.
        MissingDependencyError: an optional package is missing (horovod, mpi4py), with the
            command that installs it.
        LauncherError: the launcher's variables are incomplete or disagree, or the rendezvous
            port is taken.
        ConfigurationError: an option no backend takes, or a value it refuses.
    """
    started = get_backend(backend or default_backend_name(), **options).init()
    hook = os.environ.get(INIT_HOOK)
    if hook:
        import importlib

        module, _, function = hook.partition(":")
        getattr(importlib.import_module(module), function)(started)
    return started


def launch(
    fn: Any, *args: Any, nprocs: int, backend: str = "ddp", time_limit: Optional[float] = 3600.0, **options: Any
) -> list:
    """Run `fn(backend, *args)` in `nprocs` new processes, each inside an initialised backend.

    Works from a script, from `python -` and in a Jupyter kernel: `fn` may be defined anywhere,
    it is sent by value. Each worker's output is printed here with a `[rankN]` prefix.

    Args:
        fn: called on every rank with the initialised backend and `args`; what it returns must
            be picklable.
        *args: passed to `fn` after the backend (picklable).
        nprocs: the number of processes (ranks), all on this host.
        backend: the registered backend name ("ddp", "ddp-gloo", "horovod", ...).
        time_limit: seconds the whole call may take before every worker is stopped (default an
            hour; None: no limit).
        **options: backend options, as for `paraflow.init` (`timeout` is the collectives').

    Returns:
        The return values of `fn`, in rank order.

    Raises:
        RankFailedError: a rank raised or died; names the rank and carries its traceback. The
            other ranks are stopped.
        LaunchTimeoutError: ranks were still running after `time_limit` seconds; all were stopped.
        MissingDependencyError: cloudpickle is not installed.
    """
    from .tools.spawn import launch as _launch

    return _launch(fn, *args, nprocs=nprocs, backend=backend, time_limit=time_limit, **options)


def register_backend(
    name: str, backend: Union[str, type], *, description: str = "", replace: bool = False, **presets: Any
) -> None:
    """Make a backend available to `paraflow.init` and `--backend` under `name`.

    Args:
        name: the name users pick it by (`paraflow.init(name)`, `PARAFLOW_BACKEND`).
        backend: a `paraflow.Backend` subclass, or `"module:Class"` imported on first use
            (so a backend with heavy dependencies costs nothing until chosen).
        description: one line for `paraflow backends`.
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
