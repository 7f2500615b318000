"""The Backend interface: one API for every data-parallel method."""

from __future__ import annotations

import abc
import atexit
import contextlib
import datetime
import os
from typing import Any, ContextManager, Iterator, Mapping, MutableMapping, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from ..environment import ProcessEnvironment, detect_environment
from ..compression import check_compression
from ..errors import BackendUnavailableError, ConfigurationError, LauncherError, ParaflowError
from ..collective_check import check_collective
from ..failures import abort_mpi_job_on_uncaught_error, collective_errors
from ..precision import GradScaler, autocast, check_precision, check_precision_on
from ..sharding import ShardSampler

__all__ = ["Backend", "LocalCollectives", "REDUCE_OPS", "DEFAULT_TIMEOUT_S"]

REDUCE_OPS = ("sum", "mean", "min", "max")
#: Seconds a collective or the start-up rendezvous may wait (PARAFLOW_TIMEOUT overrides it): long
#: enough for a rank-0 checkpoint write or evaluation, short enough that a hung job frees its
#: machines within minutes; torch's own default for NCCL. See README, "Failures".
DEFAULT_TIMEOUT_S = 600.0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Backend(abc.ABC):
    """A data-parallel method behind one API.

    Create with :func:`paraflow.get_backend` or :func:`paraflow.init`, then ``init()``;
    use as a context manager to shut down on exit.

    Args:
        name: the registered name this backend was created under.
        num_threads: torch threads per process on CPU (default: cores // local processes,
            or PARAFLOW_NUM_THREADS).
        timeout: seconds a collective may wait before failing (default 600, or PARAFLOW_TIMEOUT).
        world_size: the number of processes you expect; a mismatch with the launcher fails.
        device: "cpu" or "cuda" (default: CUDA when the backend uses it and it is available).
        precision: "fp32" (default), "bf16" or "fp16": the dtype :meth:`autocast` computes in;
            "fp16" also turns on :meth:`grad_scaler`'s loss scaling.
        compression: gradient compression on the wire, "none" (default), "fp16" or "bf16";
            a backend that cannot do the one asked for raises ConfigurationError (COMPRESSIONS).
        accumulation_steps: micro-batches per optimizer step under :meth:`accumulate` (default 1).
    """

    #: Backend-specific option names accepted besides the common ones.
    OPTIONS: frozenset = frozenset()
    #: Whether one process may be one of several started by a launcher.
    MULTI_PROCESS = True
    #: Gradient compressions this backend can do; anything else fails at construction.
    COMPRESSIONS: frozenset = frozenset({"none"})
    #: Why the compressions missing from COMPRESSIONS are missing (for the error message).
    COMPRESSION_LIMIT = "it communicates no gradients between processes"

    def __init__(self, name: str, *, num_threads: Optional[int] = None,
                 timeout: Optional[float] = None, world_size: Optional[int] = None,
                 device: Optional[str] = None, precision: str = "fp32", compression: str = "none",
                 accumulation_steps: int = 1, **options: Any) -> None:
        unknown = set(options) - self.OPTIONS
        if unknown:
            accepted = sorted(self.OPTIONS | {"num_threads", "timeout", "world_size", "device", "precision",
                                              "compression", "accumulation_steps"})
            raise ConfigurationError(
                f"backend {name!r} does not take option(s) {', '.join(sorted(unknown))}; "
                f"it accepts: {', '.join(accepted)}."
            )
        self.name = name
        self.options = options
        self.num_threads = num_threads
        self.timeout = self._timeout_seconds(timeout)
        self.expected_world_size = world_size
        self.requested_device = device
        self.precision = check_precision(precision)
        self.compression = check_compression(name, compression, self.COMPRESSIONS, self.COMPRESSION_LIMIT)
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ConfigurationError(f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}.")
        self.accumulation_steps = accumulation_steps
        self._micro_batches = 0
        self.env: Optional[ProcessEnvironment] = None
        self.device = torch.device("cpu")
        self._initialized = False

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def unavailable_reason(cls, **presets: Any) -> Optional[str]:
        """None when this backend can run on this machine, else why it cannot."""
        return None

    def init(self, environment: Optional[ProcessEnvironment] = None) -> "Backend":
        """Join the job: detect the launcher, pin the device and threads, start communication."""
        if self._initialized:
            return self
        reason = self.unavailable_reason(**self._presets())
        if reason:
            raise BackendUnavailableError(f"backend {self.name!r} cannot run here: {reason}")
        self.env = environment or detect_environment()
        self._check_launcher(self.env)
        self.device = self._select_device()
        check_precision_on(self.precision, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(self._threads_per_process())
        self._init()
        if self.env.is_mpi:
            abort_mpi_job_on_uncaught_error()
        self._initialized = True
        return self

    def shutdown(self) -> None:
        """Leave the job and release communication resources; safe to call twice."""
        if self._initialized:
            self._initialized = False
            self._shutdown()

    def __enter__(self) -> "Backend":
        return self.init()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None or self.env is None or self.world_size == 1:
            self.shutdown()
        else:
            # Leaving on an error: stay connected until the process exits, so that its traceback
            # is printed before the other ranks see it go (and report their own, later, errors).
            atexit.register(self.shutdown)

    def __repr__(self) -> str:
        where = f"rank {self.rank}/{self.world_size}" if self.env else "not initialised"
        return f"<{type(self).__name__} {self.name!r} {where} on {self.device}>"

    # ---------------------------------------------------------------- identity
    @property
    def rank(self) -> int:
        """Global rank of this process."""
        return self._env().rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self._env().world_size

    @property
    def local_rank(self) -> int:
        """Rank of this process on its host."""
        return self._env().local_rank

    @property
    def local_world_size(self) -> int:
        """Number of processes on this host."""
        return self._env().local_world_size

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that logs and writes."""
        return self.rank == 0

    @property
    def launcher(self) -> str:
        """The launcher that started this process (torchrun, openmpi, slurm, python, ...)."""
        return self._env().launcher

    # ---------------------------------------------------------------- training
    @abc.abstractmethod
    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move `model` to this process's device and wrap it for gradient synchronisation."""

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer,
                       model: Optional[nn.Module] = None) -> torch.optim.Optimizer:
        """Return an optimizer whose step sees synchronised gradients (unchanged by default)."""
        return optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's own module inside whatever `wrap_model` returned."""
        return getattr(model, "module", model)

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Context in which backward passes accumulate gradients locally without communicating."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def accumulate(self, model: nn.Module) -> Iterator[bool]:
        """Context for one micro-batch's forward and backward under gradient accumulation.

        Yields True on every ``accumulation_steps``-th micro-batch (counted across epochs): the
        backward inside it reduces the summed gradients across ranks, and the optimizer should
        step after it. On the others gradients only accumulate locally (DDP's ``no_sync``;
        Horovod's ``backward_passes_per_step``). Scale each loss by ``1 / accumulation_steps``.
        """
        self._micro_batches += 1
        sync = self._micro_batches % self.accumulation_steps == 0
        with contextlib.nullcontext() if sync else self._skip_gradient_sync(model):
            yield sync

    def _skip_gradient_sync(self, model: nn.Module) -> ContextManager:
        """What :meth:`accumulate` enters on micro-batches that must not communicate."""
        return self.no_sync(model)

    def autocast(self) -> ContextManager:
        """torch.autocast to this backend's ``precision`` on its device; a no-op for fp32."""
        return autocast(self.precision, self.device)

    def grad_scaler(self, **kwargs: Any) -> GradScaler:
        """A gradient scaler, enabled for ``precision="fp16"`` only (a pass-through otherwise).

        Use it the torch way whatever the precision: ``scaler.scale(loss).backward()``,
        ``scaler.step(optimizer)``, ``scaler.update()``; its ``state_dict`` goes in checkpoints.
        `kwargs` go to ``torch.amp.GradScaler`` (init_scale, growth_interval, ...).
        """
        return GradScaler(self.device.type, enabled=self.precision == "fp16", **kwargs)

    def join(self, model: nn.Module, *stateful: Any, enable: bool = True) -> ContextManager:
        """Context around a training loop whose ranks may run different numbers of batches.

        Ranks that finish early keep serving the others' gradient allreduces (a finished rank
        counts as a zero gradient) instead of hanging; on leaving, the model and every object in
        `stateful` (optimizer, grad scaler: anything with ``state_dict``) are copied from the last
        rank to finish. Other collectives must not run inside. One-process backends: no-op.
        """
        return contextlib.nullcontext()

    def distributed_sampler(self, dataset: Dataset, shuffle: bool = True, seed: int = 0,
                            drop_last: bool = False) -> ShardSampler:
        """A sampler giving this rank its shard of `dataset`; call ``set_epoch`` each epoch.

        Every sample goes to exactly one rank per epoch, reshuffled each epoch from `seed`. With
        ``drop_last=False`` shard lengths may differ by one (train under :meth:`join`); with
        ``drop_last=True`` the ``len(dataset) % world_size`` remainder is left out of each epoch
        so all shards are equal. See :class:`paraflow.sharding.ShardSampler`.
        """
        return ShardSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                            shuffle=shuffle, seed=seed, drop_last=drop_last)

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: str, state: Mapping[str, Any]) -> None:
        """Write `state` to `path` atomically from rank 0; call on every rank.

        Modules are saved unwrapped, objects with ``state_dict`` by their state dict, anything
        else as it is; every rank's RNG states are added. See :mod:`paraflow.checkpoint`.
        """
        from ..checkpoint import save_checkpoint
        save_checkpoint(self, path, state)

    def load(self, path: str, state: Optional[MutableMapping[str, Any]] = None) -> dict:
        """Restore `state` in place from `path` on every rank, after a barrier, on this device.

        Returns the saved entries not restored into an object (epoch, step, ...); RNG states are
        restored too. Works across backends. See :mod:`paraflow.checkpoint`.
        """
        from ..checkpoint import load_checkpoint
        return load_checkpoint(self, path, state)

    # ---------------------------------------------------------------- collectives
    def allreduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op` (sum, mean, min, max); input is unchanged."""
        self._check_tensor(tensor, "allreduce")
        if op not in REDUCE_OPS:
            raise ConfigurationError(f"allreduce op {op!r} is not one of {', '.join(REDUCE_OPS)}.")
        if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
            raise ConfigurationError(
                f"allreduce op 'mean' needs a floating-point tensor, got {tensor.dtype}; "
                "use op='sum' and divide, or convert with tensor.double()."
            )
        with self._guard("allreduce", tensor, op=op):
            return self._allreduce(tensor.detach().clone(), op)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Return rank `src`'s `tensor` on every rank; input is unchanged."""
        self._check_tensor(tensor, "broadcast")
        if not 0 <= src < self.world_size:
            raise ConfigurationError(f"broadcast src={src} is outside ranks 0..{self.world_size - 1}.")
        with self._guard("broadcast", tensor, src=src):
            return self._broadcast(tensor.detach().clone(), src)

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Return every rank's `tensor` (same shape on all ranks), indexed by rank."""
        self._check_tensor(tensor, "allgather")
        with self._guard("allgather", tensor):
            return self._allgather(tensor.detach().contiguous())

    def barrier(self) -> None:
        """Wait until every rank reaches this call."""
        self._env()
        with self._guard("barrier"):
            self._barrier()

    @contextlib.contextmanager
    def _guard(self, collective: str, tensor: Optional[torch.Tensor] = None,
               **arguments: Any) -> Iterator[None]:
        """Around one collective: all ranks must agree on it (paraflow.collective_check), and
        communication failures leave as paraflow errors (paraflow.failures)."""
        with collective_errors(self, collective):
            if self.world_size > 1:
                check_collective(self, collective, tensor, **arguments)
            yield

    # ---------------------------------------------------------------- for subclasses
    @abc.abstractmethod
    def _init(self) -> None:
        """Start this backend's communication; the environment and device are set."""

    def _shutdown(self) -> None:
        """Tear down what `_init` started."""

    @abc.abstractmethod
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """Reduce the private copy `tensor` in place or not, and return the result."""

    @abc.abstractmethod
    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Broadcast the private copy `tensor` from `src` and return it."""

    @abc.abstractmethod
    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Gather `tensor` from every rank."""

    def _barrier(self) -> None:
        """Block until every rank arrives (default: a one-element allreduce)."""
        self._allreduce(torch.zeros(1, device=self.device), "sum")

    def _uses_cuda(self) -> bool:
        """Whether this backend puts models on CUDA when a GPU is present."""
        return torch.cuda.is_available()

    def _presets(self) -> dict:
        return {}

    # ---------------------------------------------------------------- helpers
    def _env(self) -> ProcessEnvironment:
        if self.env is None:
            raise ParaflowError(f"backend {self.name!r} is not initialised; call init() first.")
        return self.env

    def _check_launcher(self, env: ProcessEnvironment) -> None:
        if self.expected_world_size is not None and self.expected_world_size != env.world_size:
            if env.launcher == "python":
                raise LauncherError(
                    f"world_size={self.expected_world_size} was requested but no launcher started "
                    f"this process (plain python is one process). Launch it with `torchrun "
                    f"--nproc_per_node {self.expected_world_size} train.py --backend {self.name}` "
                    f"or `mpirun -np {self.expected_world_size} python train.py --backend {self.name}`."
                )
            raise LauncherError(
                f"world_size={self.expected_world_size} was requested but {env.launcher} started "
                f"{env.world_size} processes; make the two agree."
            )
        if not self.MULTI_PROCESS and env.world_size > 1:
            raise LauncherError(
                f"backend {self.name!r} runs in one process, but {env.launcher} started "
                f"{env.world_size}. Run it with plain python (`python train.py --backend {self.name}`),"
                f" or use a multi-process backend: `torchrun --nproc_per_node {env.world_size} "
                f"train.py --backend ddp`."
            )

    def _select_device(self) -> torch.device:
        want = self.requested_device
        if want is None:
            want = "cuda" if self._uses_cuda() else "cpu"
        if want == "cpu":
            return torch.device("cpu")
        if want == "cuda":
            if not torch.cuda.is_available():
                raise ConfigurationError("device='cuda' was requested but torch sees no GPU.")
            count = torch.cuda.device_count()
            if self.local_rank >= count:
                raise LauncherError(
                    f"local rank {self.local_rank} has no GPU: this host has {count}. Start at most "
                    f"{count} processes per host (`torchrun --nproc_per_node {count} ...`)."
                )
            return torch.device("cuda", self.local_rank)
        raise ConfigurationError(f"device={want!r} is not 'cpu' or 'cuda'.")

    def _threads_per_process(self) -> int:
        if self.num_threads is not None:
            return max(1, int(self.num_threads))
        if os.environ.get("PARAFLOW_NUM_THREADS"):
            return max(1, int(os.environ["PARAFLOW_NUM_THREADS"]))
        return max(1, _cores() // max(1, self.local_world_size))

    def _check_tensor(self, tensor: Any, collective: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise ConfigurationError(f"{collective} takes a torch.Tensor, got {type(tensor).__name__}.")
        self._env()

    @staticmethod
    def _timeout_seconds(timeout: Any) -> float:
        if timeout is None:
            return float(os.environ.get("PARAFLOW_TIMEOUT", DEFAULT_TIMEOUT_S))
        if isinstance(timeout, datetime.timedelta):
            return timeout.total_seconds()
        value = float(timeout)
        if value <= 0:
            raise ConfigurationError(f"timeout must be positive seconds, got {timeout!r}.")
        return value


class LocalCollectives:
    """Collectives for a single process: every result is this process's own tensor."""

    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        return tensor

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return tensor

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor.clone()]

    def barrier(self) -> None:
        """Nothing to wait for in one process."""

