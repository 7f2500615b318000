"""Horovod: DistributedOptimizer for gradients, horovod collectives, MPI or gloo controller.

The controller follows the launcher: MPI under ``mpirun`` (Open MPI, MPICH, MVAPICH2), gloo under
``horovodrun --gloo``, and gloo through rank 0's own horovod rendezvous server under ``torchrun``,
``srun`` and plain ``python``; starting it lives in :mod:`paraflow.backends.horovod.start`.

Horovod's own wait (``synchronize``) spins on the handle with no timeout. The public collectives
poll their handle the same way on the calling thread and give up after the backend's timeout
(so the error can be caught); every other horovod wait (broadcasts in ``wrap_model`` and
``wrap_optimizer``, the gradient wait in ``step()``, barriers, ``join``) runs under the watchdog
(:mod:`paraflow.reliability.deadlines`), which costs nothing while it ends in time. Horovod's
errors become paraflow's, naming the call and this rank.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any, ContextManager, Optional

import torch
from torch import nn

from ...core.backend import Backend
from ...core.compiling import CompileOption, compile_model, compile_options, uncompiled
from ...core.options import check_number, check_one_of
from ...environment.launchers import ProcessEnvironment
from ...errors import CollectiveError, ConfigurationError, ParaflowError
from ...reliability.deadlines import DeadlineExceeded, spin_until, watchdog
from ...reliability.translation import translate_collective_error, translate_on
from ...training.no_sync import forward_decided_sync
from ...training.object_collectives import copy_state_from
from .info import horovod_missing_reason, import_horovod
from .optimizer import distributed_optimizer, resume_gradient_allreduce, stop_gradient_allreduce
from .start import (
    ScopedEnv,
    check_horovod_world,
    choose_controller,
    note_mpi_shut_down,
    set_knobs,
    start_gloo,
    start_mpi,
)

__all__ = ["HorovodBackend", "REDUCE_OPS", "CONTROLLERS"]

REDUCE_OPS = ("average", "sum", "adasum")
CONTROLLERS = ("auto", "mpi", "gloo")
_COLLECTIVE_OPS = {"sum": "Sum", "mean": "Average", "min": "Min", "max": "Max"}
#: Under gloo horovod's own timeout (HOROVOD_GLOO_TIMEOUT_SECONDS) ends a wait with an error that
#: can be caught; the watchdog acts only this much later, if that did not happen.
_GLOO_GRACE_S = 10.0


class HorovodBackend(Backend):
    """Horovod's DistributedOptimizer and collectives, under any launcher.

    Options:
        compression: gradient compression on the wire, "none" or "fp16".
        accumulation_steps: backward passes per optimizer step; gradients are averaged over
            ranks once, after the last one (horovod's ``backward_passes_per_step``).
        reduce_op: how gradients are combined, "average" (default), "sum" or "adasum".
        gradient_predivide_factor: with "average", divide gradients by this before the sum and
            by ``world_size / factor`` after it.
        fusion_threshold_mb: tensor fusion buffer in MiB (HOROVOD_FUSION_THRESHOLD; 0 disables).
        cycle_time_ms: how often horovod's background thread batches tensors (HOROVOD_CYCLE_TIME).
        controller: "auto" (by launcher), "mpi" or "gloo".

    After ``init()``: ``controller`` is the controller in use ("mpi" or "gloo") and ``transport``
    the library moving this process's tensors ("mpi", "gloo", "nccl", ...).
    """

    OPTIONS = frozenset(
        {"reduce_op", "gradient_predivide_factor", "fusion_threshold_mb", "cycle_time_ms", "controller"}
    )
    COMPRESSIONS = frozenset({"none", "fp16"})
    COMPRESSION_LIMIT = "horovod's allreduce refuses bfloat16"
    LAUNCHERS = ("openmpi", "horovodrun")
    #: Its processes run horovod.torch itself: paraflow.compat.horovod hands every call to it.
    NATIVE_API = "horovod.torch"

    def __init__(
        self,
        name: str,
        *,
        reduce_op: str = "average",
        gradient_predivide_factor: float = 1.0,
        fusion_threshold_mb: Optional[float] = None,
        cycle_time_ms: Optional[float] = None,
        controller: str = "auto",
        **options: Any,
    ) -> None:
        self._timeout_given = options.get("timeout") is not None or bool(os.environ.get("PARAFLOW_TIMEOUT"))
        super().__init__(name, **options)
        self.reduce_op = check_one_of("reduce_op", reduce_op, REDUCE_OPS)
        self.requested_controller = check_one_of("controller", controller, CONTROLLERS)
        self.gradient_predivide_factor = check_number("gradient_predivide_factor", gradient_predivide_factor)
        if self.gradient_predivide_factor != 1.0 and self.reduce_op != "average":
            raise ConfigurationError(
                f"gradient_predivide_factor={gradient_predivide_factor} applies to "
                f"reduce_op='average' only, not {self.reduce_op!r}."
            )
        self.fusion_threshold_mb = (
            None if fusion_threshold_mb is None else check_number("fusion_threshold_mb", fusion_threshold_mb, zero=True)
        )
        self.cycle_time_ms = None if cycle_time_ms is None else check_number("cycle_time_ms", cycle_time_ms)
        self.controller: Optional[str] = None
        self._hvd = None
        self._owns_horovod = False
        self._uses_mpi4py = False
        self._rendezvous = None
        self._env_vars = ScopedEnv()
        self._optimizers: list[torch.optim.Optimizer] = []
        self._stuck = False  # a wait timed out: horovod's background thread may never come back

    # ---------------------------------------------------------------- availability
    @classmethod
    def unavailable_reason(cls, **_: Any) -> Optional[str]:
        """Why horovod cannot run here (not installed, no controller built), or None."""
        reason = horovod_missing_reason()
        if reason:
            return reason
        hvd = import_horovod()
        if not (hvd.mpi_built() or hvd.gloo_built()):
            return "horovod was built with neither MPI nor gloo; rebuild it with `paraflow build-horovod --force`"
        return None

    @property
    def transport(self) -> Optional[str]:
        """What moves this process's tensors: "nccl" on a GPU with NCCL, else the CPU operations."""
        if self.controller is None:
            return None
        if self.device.type == "cuda" and self._hvd is not None and self._hvd.nccl_built():
            return "nccl"
        return os.environ.get("HOROVOD_CPU_OPERATIONS", self.controller).lower()

    # ---------------------------------------------------------------- lifecycle
    def init(self, environment: Optional[ProcessEnvironment] = None) -> HorovodBackend:
        """Start horovod (see :meth:`Backend.init`).

        Raises:
            MissingDependencyError: horovod is not installed or not built for this torch; an
                ImportError whose message gives the install command.
        """
        if not self._initialized:
            import_horovod()
        return super().init(environment)

    def _init(self) -> None:
        hvd = self._hvd = import_horovod()
        try:
            if not hvd.is_initialized():  # else the user started horovod already: join it, leave it running
                controller = choose_controller(hvd, self.env, self.requested_controller)
                set_knobs(
                    self._env_vars,
                    fusion_threshold_mb=self.fusion_threshold_mb,
                    cycle_time_ms=self.cycle_time_ms,
                    timeout=self.timeout,
                    timeout_given=self._timeout_given,
                )
                if controller == "mpi":
                    self._uses_mpi4py = start_mpi(hvd, self._env_vars)
                else:
                    self._rendezvous = start_gloo(hvd, self.env, self.timeout)
                self._owns_horovod = True
                self._progress_at = time.monotonic()
            check_horovod_world(hvd, self.env)
            self.controller = "mpi" if hvd.mpi_enabled() else "gloo"
            self._check_reduce_op()
        except BaseException:
            self._leaving_on_error = True
            self._shutdown()
            raise

    def _shutdown(self) -> None:
        hvd = self._hvd
        error: Optional[Exception] = None
        if hvd is not None and self._owns_horovod and not self._stuck and hvd.is_initialized():
            mpi = hvd.mpi_enabled()
            if not self._leaving_on_error:  # leaving on an error: others may sit in another collective
                what = "barrier in shutdown() (leaving paraflow.init)"
                try:  # nobody leaves while a rank still needs the job; a rank that never comes is an error
                    with self.horovod_errors(what):
                        self._final_barrier()
                except Exception as exc:  # noqa: BLE001 - raised once horovod is shut down
                    error = exc
            # After a timed-out wait (that barrier's included) horovod's background thread is stuck
            # in the library and hvd.shutdown() would wait for it forever: leave horovod alone, and
            # let the error end the process (MPI_Abort under MPI, horovod's exit handler otherwise).
            if not self._stuck:
                hvd.shutdown()
                if mpi and not self._uses_mpi4py:
                    note_mpi_shut_down()
        self._owns_horovod = False
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None
        self._env_vars.restore()
        self._optimizers.clear()
        self._leaving_on_error = False
        self.controller = None
        if error is not None:
            raise error

    def _check_reduce_op(self) -> None:
        if self.reduce_op == "adasum" and self.controller != "mpi" and self.device.type != "cuda":
            raise ConfigurationError(
                "reduce_op='adasum' on the CPU needs horovod's MPI controller; launch with "
                f"`mpirun -np {self.world_size} python train.py --backend horovod`."
            )

    def _in_process_recovery(self) -> Any:
        """Horovod Elastic's restart in process, under horovodrun's elastic mode (else None)."""
        if self.controller != "gloo" or not self.env.launched_by.launched_elastic(os.environ):
            return None
        from .elastic import HorovodRecovery

        return HorovodRecovery(self)

    # ---------------------------------------------------------------- training
    def wrap_model(self, model: nn.Module, compile: CompileOption = None) -> nn.Module:
        """Move `model` to this rank's device and give every rank rank 0's parameters and buffers
        (under horovodrun's elastic mode, `paraflow.elastic.run` does that instead).

        Horovod puts no wrapper around the model; gradients are averaged by the optimizer that
        :meth:`wrap_optimizer` returns, from hooks on the parameters' gradient accumulators,
        which a compiled backward still runs. `compile` compiles the model after the broadcast.
        """
        hvd = self._horovod()
        options = compile_options(compile)
        model = model.to(self.device)
        what = "broadcast of the model's parameters and buffers in wrap_model"
        if not self._state_synced_by_elastic_run():
            with self.horovod_errors(what), self.bounded(what):
                hvd.broadcast_parameters(uncompiled(model).state_dict(), root_rank=0)
        return self._mark_model(compile_model(model, options))

    def _state_synced_by_elastic_run(self) -> bool:
        """Under horovodrun's elastic mode `paraflow.elastic.run` gives every rank rank 0's state as
        it enters the training function: a worker that joins later must not broadcast in
        wrap_model or wrap_optimizer, where the others are not (Horovod Elastic's own rule)."""
        return self._in_process_recovery() is not None

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The model itself (horovod does not wrap it), without torch.compile's wrapper."""
        return uncompiled(model)

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, model: Optional[nn.Module] = None
    ) -> torch.optim.Optimizer:
        """Horovod's DistributedOptimizer over the optimizer's parameters, with rank 0's state.

        Args:
            optimizer: the optimizer built over ``model.parameters()``.
            model: optional, as on every backend: the model from :meth:`wrap_model`, whose
                parameter names then name horovod's gradient messages (without it, their place
                in the optimizer's parameter groups does).

        Raises:
            ConfigurationError: `model` does not own the optimizer's parameters.
        """
        wrapped = distributed_optimizer(self, self._horovod(), optimizer, model)
        self._optimizers.append(wrapped)
        self._mark_optimizer(wrapped)
        return wrapped

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Backward passes inside, and those of forwards run inside, accumulate gradients locally.

        Same meaning as DDP's ``no_sync``: the forward decides, so the backward may run after
        leaving the context; the next backward of a forward outside averages what accumulated.
        Horovod's gradient hooks count backward passes per parameter and reduce when the count
        reaches zero; while reduction is off the counts are lifted out of reach, and restored at
        the next forward outside, so those passes neither communicate nor count
        (:mod:`paraflow.training.no_sync`).
        """
        self._horovod()
        params = {id(p) for p in model.parameters()}

        def stop() -> list:
            return stop_gradient_allreduce(self._optimizers_over(params))

        return forward_decided_sync(model, stop, resume_gradient_allreduce, owner=self).context()

    def _optimizers_over(self, params: set) -> list:
        """The DistributedOptimizers stepping any of `params` (given by id)."""
        return [o for o in self._optimizers if any(id(p) in params for p in o._allreduce_delay)]

    def _synchronize_gradients(self, model: nn.Module) -> None:
        """Finish the gradient allreduces of `model`'s optimizers now; their next step reduces nothing."""
        self._horovod()
        for optimizer in self._optimizers_over({id(p) for p in model.parameters()}):
            optimizer.synchronize()

    def _skip_gradient_sync(self, model: nn.Module) -> ContextManager:
        """Nothing to skip: ``accumulation_steps`` is horovod's ``backward_passes_per_step``."""
        return contextlib.nullcontext()

    def join(self, model: nn.Module, *stateful: Any, enable: bool = True) -> ContextManager:
        """``hvd.join()`` on leaving; then the model and `stateful` come from the last rank to finish."""
        self._horovod()
        return self._joined_while(self._horovod_join(model, stateful, enable), enable)

    @contextlib.contextmanager
    def _horovod_join(self, model: nn.Module, stateful: Sequence[Any], enable: bool) -> Iterator[None]:
        """Under ``hvd.join()`` ranks that finished early contribute zeros; on leaving, copy the
        model and `stateful` from the last rank to finish."""
        yield
        if not enable:
            return
        hvd = self._horovod()
        what = "hvd.join() and broadcast of the last rank's model in backend.join"
        with self.horovod_errors(what), self.bounded(what):
            last = hvd.join(self.device.index if self.device.type == "cuda" else -1)
            hvd.broadcast_parameters(self.unwrap(model).state_dict(), root_rank=last)
        copy_state_from(self, stateful, src=last)

    # ---------------------------------------------------------------- collectives
    # One horovod operation each, behind the public collectives (paraflow.core.collectives), which
    # translates a failure once, through _raise_failure.
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        hvd = self._started()
        handle = hvd.allreduce_async_(
            tensor.contiguous(), name=f"paraflow.allreduce.{op}", op=getattr(hvd, _COLLECTIVE_OPS[op])
        )
        return self._wait(handle)

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        hvd = self._started()
        return self._wait(hvd.broadcast_async_(tensor.contiguous(), root_rank=src, name=f"paraflow.broadcast.{src}"))

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        # One leading row per rank: horovod then requires every other dimension to agree.
        hvd = self._started()
        handle = hvd.allgather_async(tensor.reshape(1, *tensor.shape), name="paraflow.allgather")
        return list(self._wait(handle).unbind(0))

    def _raise_failure(self, collective: str, tensor: Any, argument: Any, exc: Exception, started: float) -> None:
        what = {"allreduce": f"allreduce ({argument})", "broadcast": f"broadcast from rank {argument}"}
        what = collective if tensor is None else f"{what.get(collective, collective)} of a {_describe(tensor)}"
        self._raise_horovod_error(what, exc, started, collective=collective)

    # ---------------------------------------------------------------- helpers
    def _wait(self, handle: int) -> Any:
        """``hvd.synchronize(handle)`` once ``hvd.poll`` finds it done, failing after the timeout
        instead of waiting forever.

        Horovod's own wait spins on the handle with no timeout: a rank that stops answering
        would block the others for good. This one spins the same way, on this thread, with a
        deadline (:func:`paraflow.reliability.deadlines.spin_until`). After a timeout horovod's
        background thread may be stuck, so shutdown leaves horovod alone (MPI_Abort or horovod's
        exit handler ends it).
        """
        hvd = self._hvd
        try:
            spin_until(lambda: hvd.poll(handle), self.timeout, "waiting for the other ranks")
        except DeadlineExceeded:
            self._stuck = True
            raise
        result = hvd.synchronize(handle)
        self._progress_at = time.monotonic()
        return result

    def bounded(self, what: str):
        """Context around a horovod wait that cannot be polled: once it outlives the timeout the
        watchdog prints its CollectiveTimeoutError and ends the process (MPI_Abort under MPI)."""
        grace = 0.0 if self.controller == "mpi" else _GLOO_GRACE_S
        return watchdog.watch(self.timeout + grace, lambda waited: self._past_timeout(what, waited))

    def _past_timeout(self, what: str, waited: float) -> str:
        error = translate_collective_error(
            DeadlineExceeded(f"waiting timed out after {waited:.0f} s"),
            collective=f"horovod {what}",
            rank=self.rank,
            world_size=self.world_size,
            backend=self.name,
            timeout=self.timeout,
            waited=waited,
        )
        kind = f"{type(error).__module__}.{type(error).__name__}"
        return (
            f"paraflow: rank {self.rank}: horovod's wait cannot be interrupted and outlived the timeout, so this "
            f"process ends now (the launcher then ends the job).\n{kind}: {error}"
        )

    def _horovod(self):
        self._live()
        return self._started()

    def _started(self):
        """horovod, for the collective hooks: the public call checked that the backend is live, and
        shutdown's final barrier runs after it stopped being so."""
        if self._hvd is None or self.controller is None:
            raise self._not_initialized()
        return self._hvd

    def horovod_errors(self, what: str) -> _HorovodErrors:
        """Context turning horovod's errors into paraflow's, naming the collective and this rank.

        Horovod's gloo controller reports a rank that stopped answering as "Horovod has been shut
        down" once its own timeout runs out, counted from when the job last made progress: so the
        wait is measured from the end of this rank's last horovod call, if that came earlier.
        """
        return _HorovodErrors(self, what)

    def _raise_horovod_error(self, what: str, exc: Exception, start: float, collective: Optional[str] = None) -> None:
        """Raise the paraflow error for horovod's `exc` in `what`, begun at time.monotonic() `start`; a
        timeout or a lost rank in a public `collective` is named as on every other backend."""
        if isinstance(exc, ParaflowError):  # translated inside: named again here only if it was translated
            if getattr(exc, "original", None) is None:
                return
            exc = exc.original
        if isinstance(exc, ValueError):  # horovod refuses the tensor itself (dtype, layout)
            raise ConfigurationError(f"horovod cannot run the {what}: {exc}") from exc
        waited = time.monotonic() - min(start, getattr(self, "_progress_at", start))
        translated = translate_on(self, exc, collective or f"horovod {what}", waited)  # a timeout or a lost rank
        if translated is not None:
            raise translated from exc
        if str(exc).startswith("Mismatched"):  # the coordinator's answer to every rank: name each one's call
            try:
                error = self._mismatch_seen_by_the_library(f"horovod {what} failed on rank {self.rank}")
            except Exception:  # noqa: BLE001 - the message below still says what horovod found
                error = None
            if error is not None:
                raise error from exc
        raise CollectiveError(  # HorovodInternalError: ranks disagree, or the job broke
            f"horovod {what} failed on rank {self.rank}: {str(exc).rstrip('.')}. Every rank must call the same "
            "collectives in the same order with tensors of the same shape and dtype."
        ) from exc


class _HorovodErrors:
    """What ``horovod_errors`` returns; an object, not a generator, since every training step enters one.
    Not re-entrant: one block at a time per object."""

    __slots__ = ("_backend", "_what", "_start")

    def __init__(self, backend: HorovodBackend, what: str) -> None:
        self._backend, self._what = backend, what

    def __enter__(self) -> None:
        self._start = time.monotonic()

    def __exit__(self, kind, exc, traceback) -> bool:
        if kind is None:
            self._backend._progress_at = time.monotonic()
        elif issubclass(kind, (ValueError, RuntimeError)):
            self._backend._raise_horovod_error(self._what, exc, self._start)
        return False


def _describe(tensor: torch.Tensor) -> str:
    return f"{tensor.dtype} tensor of shape {list(tensor.shape)}"
