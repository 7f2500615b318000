"""The Backend interface: one API for every data-parallel method."""

from __future__ import annotations

import abc
import atexit
import contextlib
import sys
import weakref
from typing import Any, ContextManager, Optional

import torch
from torch import nn

from ..environment.launchers import ProcessEnvironment, detect_environment, get_launcher
from ..environment.launchers.openmpi import apply_mpi_yield
from ..errors import BackendUnavailableError
from ..reliability.activity import attach_markers, attach_step_marker
from ..reliability.collective_check import debug_enabled
from ..reliability.last_words import LastWordsWatch, end_last_words, start_last_words
from ..reliability.mpi_abort import abort_mpi_job_on_uncaught_error, leave_job_on_exit
from ..reliability.stall import DEFAULT_STALL_S, STALL_ENV, StallWatch, start_stall_watch
from ..reliability.translation import translate_escaped_error
from ..training.precision import check_precision, check_precision_on
from .banner import banner_enabled, banner_line
from .collectives import Collectives
from .compiling import CompileOption, uncompiled
from .current import clear_current, set_current
from .features import TrainingFeatures
from .options import (
    DEFAULT_TIMEOUT_S,
    announce_ignored,
    check_compression,
    check_count,
    seconds_option,
    split_foreign_options,
)
from .placement import check_launch, cores, select_device, threads_per_process

__all__ = ["Backend"]


def _from_environment(field: str, doc: str) -> property:
    """A read-only property giving the launcher's value of `field` once the backend is initialised."""
    return property(lambda self: getattr(self._env(), field), doc=doc)


class Backend(TrainingFeatures, Collectives, abc.ABC):
    """A data-parallel method behind one API.

    Create with `paraflow.get_backend` or `paraflow.init`, then ``init()``;
    use as a context manager to shut down on exit.

    Args:
        name: the registered name this backend was created under.
        num_threads: torch threads per process on CPU (default: cores // local processes,
            or PARAFLOW_NUM_THREADS).
        timeout: seconds a collective may wait before failing (default 600, or PARAFLOW_TIMEOUT).
        world_size: the number of processes you expect; a mismatch with the launcher fails.
        device: "cpu" or "cuda" (default: CUDA when the backend uses it and it is available).
        precision: "fp32" (default), "bf16" or "fp16": the dtype `autocast` computes in;
            "fp16" also turns on `grad_scaler`'s loss scaling.
        compression: gradient compression on the wire, "none" (default), "fp16" or "bf16";
            a backend that cannot do the one asked for raises ConfigurationError (COMPRESSIONS).
        accumulation_steps: micro-batches per optimizer step under `accumulate` (default 1).
        banner: print the one-line start-up banner on rank 0 (default: True unless PARAFLOW_BANNER=0).
        stall_threshold: seconds ranks may wait on each other before every rank prints a
            ``paraflow stall:`` report (default 30, or PARAFLOW_STALL_THRESHOLD; at most half the
            timeout; 0 turns it off). See `paraflow.reliability.stall`.
        check_collectives: check before every public collective that all ranks make the same
            call, and raise CollectiveError naming each rank's call and call site if not (one
            small allgather more per call; default: on under PARAFLOW_DEBUG=1, else off).

    Options of other registered backends are accepted and ignored (rank 0 says so once), so one
    script can carry every backend's tuning; a name no backend takes is a ConfigurationError.

    Attributes:
        name: the registered name (`"ddp-gloo"`, `"fsdp"`, ...).
        rank: this process's global rank, from the launcher (after `init()`).
        world_size: the number of processes in the job.
        local_rank: this process's rank on its host.
        local_world_size: the number of processes on its host.
        launcher: the launcher that started this process (`torchrun`, `openmpi`, `slurm`, ...).
        device: where `wrap_model` puts the model (`cpu`, or this rank's `cuda:N`).
        is_main: True on rank 0: print, log and write files there.

    The contract a subclass fills (docs/architecture.md, "Where things go"):

    - ``_init()``: start communication; ``_shutdown()``: stop it.
    - ``wrap_model(model, compile=None)``: move and wrap the model for gradient synchronisation,
      compiling it in the backend's order when asked (`paraflow.core.compiling`).
    - ``_allreduce(tensor, op)``, ``_broadcast(tensor, src)``, ``_allgather(tensor)``, optionally
      ``_barrier()``: one library collective each, behind the public collectives.
    - optionally ``wrap_optimizer``, ``no_sync``, ``join``, ``transport``, ``unavailable_reason``,
      ``process_limit``, ``_synchronize_gradients`` and ``_gradient_norm_power`` (where gradients
      are reduced after backward, or sharded: `clip_grad_norm_`); class attributes
      ``OPTIONS``, ``LAUNCHERS``, ``COMPRESSIONS``, ``MULTI_PROCESS``.
    """

    #: Backend-specific option names accepted besides the common ones.
    OPTIONS: frozenset = frozenset()
    #: Whether one process may be one of several started by a launcher.
    MULTI_PROCESS = True
    #: The registered launchers this backend is started with (their names, as ``launcher`` reports
    #: them), preferred first; the benchmark and `paraflow run` start each one's program.
    LAUNCHERS: tuple = ("torchrun",)
    #: Gradient compressions this backend can do; anything else fails at construction.
    COMPRESSIONS: frozenset = frozenset({"none"})
    #: Why the compressions missing from COMPRESSIONS are missing (for the error message).
    COMPRESSION_LIMIT = "it communicates no gradients between processes"

    def __init__(
        self,
        name: str,
        *,
        num_threads: Optional[int] = None,
        timeout: Optional[float] = None,
        world_size: Optional[int] = None,
        device: Optional[str] = None,
        precision: str = "fp32",
        compression: str = "none",
        accumulation_steps: int = 1,
        banner: Optional[bool] = None,
        stall_threshold: Optional[float] = None,
        check_collectives: Optional[bool] = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.ignored_options = split_foreign_options(name, self.OPTIONS, options)
        self.name = name
        self.options = options
        self.num_threads = num_threads
        self.timeout = seconds_option("timeout", timeout, "PARAFLOW_TIMEOUT", DEFAULT_TIMEOUT_S)
        self.expected_world_size = world_size
        self.requested_device = device
        self.precision = check_precision(precision)
        self.compression = check_compression(name, compression, self.COMPRESSIONS, self.COMPRESSION_LIMIT)
        self.accumulation_steps = check_count("accumulation_steps", accumulation_steps)
        self.banner = banner_enabled(banner)
        self.stall_threshold = seconds_option("stall_threshold", stall_threshold, STALL_ENV, DEFAULT_STALL_S, True)
        self.check_collectives = debug_enabled() if check_collectives is None else bool(check_collectives)
        self._stall: Optional[StallWatch] = None
        self._last_words: Optional[LastWordsWatch] = None
        self._micro_batches = 0
        self._optimizer_refs: list = []  # weak references to what wrap_optimizer returned
        self._scalers: weakref.WeakSet = weakref.WeakSet()  # enabled scalers grad_scaler() made
        self.env: Optional[ProcessEnvironment] = None
        self.device = torch.device("cpu")
        self._initialized = False
        self._connected = False  # from the end of _init() to shutdown: collectives may run (also inside init)
        self._leaving_on_error = False  # then shutdown skips its final barrier: others may be elsewhere

    # ---------------------------------------------------------------- what tools ask the class
    @classmethod
    def unavailable_reason(cls, **presets: Any) -> Optional[str]:
        """None when this backend can run on this machine, else why it cannot."""
        return None

    @classmethod
    def process_limit(cls, cuda_devices: int, **presets: Any) -> Optional[int]:
        """The most processes one host can run (None: no limit); one-process backends say 1."""
        return None if cls.MULTI_PROCESS else 1

    # ---------------------------------------------------------------- lifecycle
    def init(self, environment: Optional[ProcessEnvironment] = None) -> Backend:
        """Join the job: detect the launcher, pin the device and threads, start communication."""
        if self._initialized:
            return self
        reason = self.unavailable_reason(**self._presets())
        if reason:
            raise BackendUnavailableError(f"backend {self.name!r} cannot run here: {reason}")
        self.env = environment or detect_environment()
        check_launch(self.name, self.expected_world_size, self.MULTI_PROCESS, self.env)
        self.device = select_device(self.requested_device, self._uses_cuda(), self.local_rank)
        check_precision_on(self.precision, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(threads_per_process(self.num_threads, self.local_world_size))
        apply_mpi_yield(self.env, torch.get_num_threads(), cores())  # before anything starts MPI
        self._init()
        self._connected = True
        try:
            recorded, self._last_words = start_last_words(self) if self.world_size > 1 else (None, None)
            self._activity, self._stall = start_stall_watch(self, recorded)
        except BaseException:
            self._connected = False
            self._shutdown()
            raise
        if (self.env.is_mpi or self.world_size > 1) and not self.env.launched_by.ends_job_on_a_failed_rank:
            abort_mpi_job_on_uncaught_error(self.rank, self.world_size, mpi_launcher=self.env.is_mpi)
        self._initialized = True
        set_current(self)
        if self.banner and self.rank == 0:
            print(banner_line(self), file=sys.stderr, flush=True)
        announce_ignored(self.name, self.ignored_options, self.rank == 0)
        return self

    def shutdown(self) -> None:
        """Leave the job and release communication resources; safe to call twice."""
        if self._initialized:
            self._initialized = self._connected = False
            clear_current(self)
            if self._stall is not None:
                self._stall.stop()
            end_last_words(self._activity, self._last_words, clean=not self._leaving_on_error)
            self._shutdown()

    def _restart_stall_watch(self) -> None:
        """After the membership changed: the stall report watches the ranks there are now (a
        collective call), with this rank's record as it was."""
        if self._stall is not None:
            self._stall.stop()
        self._activity, self._stall = start_stall_watch(self, self._activity)

    def _in_process_recovery(self) -> Any:
        """How this backend's survivors of a lost worker go on in process, when its launcher
        allows it (horovod under horovodrun's elastic mode), else None."""
        return None

    def __enter__(self) -> Backend:
        return self.init()

    def __exit__(self, exc_type: Any, exc: Any = None, traceback: Any = None) -> None:
        self._leaving_on_error = exc_type is not None
        if exc_type is None or self.env is None or self.world_size == 1:
            self.shutdown()
            return
        # Leaving on an error: stay connected until the process exits, so that its traceback
        # is printed before the other ranks see it go (and report their own, later, errors).
        atexit.register(self.shutdown)
        leave_job_on_exit(exc, self.rank, self.world_size)
        translated = translate_escaped_error(self, exc)  # torch's own error from inside backward()
        if translated is not None:
            raise translated from exc

    def __repr__(self) -> str:
        where = f"rank {self.rank}/{self.world_size}" if self.env else "not initialised"
        return f"<{type(self).__name__} {self.name!r} {where} on {self.device}>"

    # ---------------------------------------------------------------- identity
    rank = _from_environment("rank", "Global rank of this process.")
    world_size = _from_environment("world_size", "Number of processes in the job.")
    local_rank = _from_environment("local_rank", "Rank of this process on its host.")
    local_world_size = _from_environment("local_world_size", "Number of processes on this host.")
    launcher = _from_environment("launcher", "The launcher that started this process (torchrun, openmpi, slurm, ...).")

    @classmethod
    def launch_programs(cls) -> tuple:
        """The programs that start this backend (``LAUNCHERS``' tools: mpirun for openmpi), preferred first."""
        return tuple(get_launcher(name).tool for name in cls.LAUNCHERS)

    @property
    def transport(self) -> Optional[str]:
        """What moves tensors between replicas ("gloo", "nccl", "mpi", ...), "none" for one process."""
        return "none"

    @property
    def replicas(self) -> int:
        """Model replicas one step trains: the processes (DataParallel: the GPUs it splits over)."""
        return self.world_size

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that logs and writes."""
        return self.rank == 0

    # ---------------------------------------------------------------- training
    @abc.abstractmethod
    def wrap_model(self, model: nn.Module, compile: CompileOption = None) -> nn.Module:
        """Move `model` to this process's device and wrap it for gradient synchronisation.

        Every rank starts from rank 0's parameters. `ddp`: `DistributedDataParallel` with the
        DDP options given to `paraflow.init`; `fsdp`: `fully_shard` on each unit (`blocks=`),
        in place; `horovod`: rank 0's parameters broadcast, gradients reduced by the optimizer
        `wrap_optimizer` returns; `dp`: `nn.DataParallel`; `single`: the model itself. Train and
        call the model it returns; `unwrap` gives back your own module (for `state_dict`,
        attributes).

        Args:
            model: the module; it may be compiled already (`torch.compile(model)`), and the
                returned model may be compiled too (`torch.compile(backend.wrap_model(model))`):
                both orders train the same parameters (see the compiled-models page).
            compile: True, or a dict of `torch.compile` arguments (`mode`, `dynamic`,
                `backend`, `fullgraph`, `options`, `disable`), to compile in the order this
                backend wants; None or False (default) leaves the model as it is.

        Raises:
            ConfigurationError: `compile` is not one of those, or asks to compile a compiled model.
        """

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, model: Optional[nn.Module] = None
    ) -> torch.optim.Optimizer:
        """Return an optimizer whose step sees synchronised gradients (unchanged by default).

        Build the optimizer on the wrapped model's parameters, after `wrap_model` (fsdp also takes
        one built before and rebuilds it over its shards). `model` is optional on every backend
        (horovod names gradients after it when given).
        Every backend's optimizer has horovod's ``synchronize()`` and ``skip_synchronize()``;
        here, where backward has reduced the gradients already, they do nothing.
        """
        if not hasattr(optimizer, "synchronize"):
            optimizer.synchronize = _already_synchronized
        if not hasattr(optimizer, "skip_synchronize"):
            optimizer.skip_synchronize = contextlib.nullcontext
        self._mark_optimizer(optimizer)
        return optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's own module inside whatever `wrap_model` returned (and torch.compile's wrapper)."""
        inner = uncompiled(model)
        return uncompiled(getattr(inner, "module", inner))

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Context in which backward passes accumulate gradients locally without communicating.

        DDP's meaning on every backend: a backward whose forward ran inside the context is not
        reduced, and the next backward of a forward outside it reduces everything accumulated.
        `accumulate` does the counting for you with `accumulation_steps`.
        """
        return contextlib.nullcontext()

    # ---------------------------------------------------------------- for subclasses
    @abc.abstractmethod
    def _init(self) -> None:
        """Start this backend's communication; the environment and device are set."""

    def _shutdown(self) -> None:
        """Tear down what `_init` started."""

    def _uses_cuda(self) -> bool:
        """Whether this backend puts models on CUDA when a GPU is present."""
        return torch.cuda.is_available()

    def _presets(self) -> dict:
        return {}

    def _mark_model(self, model: nn.Module) -> nn.Module:
        """Let the stall report and the uneven-shard check see `model`'s forward passes; returns it."""
        if self._activity is not None:
            attach_markers(self._activity, model)
        return model

    def _mark_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Let the stall report see the end of each ``optimizer.step()``; clipping finds it here."""
        self._optimizer_refs = [r for r in self._optimizer_refs if r() is not None] + [weakref.ref(optimizer)]
        if self._activity is not None:
            attach_step_marker(self._activity, optimizer)

    # ---------------------------------------------------------------- helpers
    def _env(self) -> ProcessEnvironment:
        if self.env is None:
            raise self._not_initialized()
        return self.env


def _already_synchronized() -> None:
    """``optimizer.synchronize()`` where backward reduces the gradients: nothing left to do."""
