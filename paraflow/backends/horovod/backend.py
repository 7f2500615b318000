"""Horovod: DistributedOptimizer for gradients, horovod collectives, MPI or gloo controller.

The controller follows the launcher: MPI under ``mpirun`` (Open MPI, MPICH, MVAPICH2), gloo under
``horovodrun --gloo``, and gloo through rank 0's own horovod rendezvous server under ``torchrun``,
``srun`` and plain ``python`` (see :mod:`paraflow.backends.horovod.rendezvous`); starting it lives in
:mod:`paraflow.backends.horovod.start`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any, ContextManager, Optional

import torch
from torch import nn

from ...core.backend import Backend
from ...environment.launchers import ProcessEnvironment
from ...environment.scoped_env import ScopedEnv
from ...errors import CollectiveError, ConfigurationError, ParaflowError
from ...reliability.deadlines import wait_until
from ...reliability.translation import translate_collective_error
from .imports import horovod_missing_reason, import_horovod
from .start import check_horovod_world, choose_controller, note_mpi_shut_down, set_knobs, start_gloo, start_mpi

__all__ = ["HorovodBackend", "HOROVOD_OPTIONS", "COMPRESSIONS", "REDUCE_OPS", "CONTROLLERS"]

#: Options this backend takes besides the common ones.
HOROVOD_OPTIONS = frozenset(
    {
        "compression",
        "accumulation_steps",
        "reduce_op",
        "gradient_predivide_factor",
        "fusion_threshold_mb",
        "cycle_time_ms",
        "controller",
    }
)
COMPRESSIONS = ("none", "fp16")
REDUCE_OPS = ("average", "sum", "adasum")
CONTROLLERS = ("auto", "mpi", "gloo")

_COLLECTIVE_OPS = {"sum": "Sum", "mean": "Average", "min": "Min", "max": "Max"}
_GRADIENT_OPS = {"average": "Average", "sum": "Sum", "adasum": "Adasum"}
# Added to every gradient's pass counter inside no_sync, so horovod's hooks never reach zero there.
_NO_SYNC_PASSES = 1 << 30


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

    OPTIONS = HOROVOD_OPTIONS
    COMPRESSIONS = frozenset(COMPRESSIONS)
    COMPRESSION_LIMIT = "horovod's allreduce refuses bfloat16"
    LAUNCHERS = ("mpirun", "horovodrun")

    def __init__(
        self,
        name: str,
        *,
        compression: str = "none",
        accumulation_steps: int = 1,
        reduce_op: str = "average",
        gradient_predivide_factor: float = 1.0,
        fusion_threshold_mb: Optional[float] = None,
        cycle_time_ms: Optional[float] = None,
        controller: str = "auto",
        **options: Any,
    ) -> None:
        self._timeout_given = options.get("timeout") is not None or "PARAFLOW_TIMEOUT" in os.environ
        super().__init__(name, compression=compression, accumulation_steps=accumulation_steps, **options)
        self.reduce_op = _choice("reduce_op", reduce_op, REDUCE_OPS)
        self.requested_controller = _choice("controller", controller, CONTROLLERS)
        self.gradient_predivide_factor = _positive("gradient_predivide_factor", gradient_predivide_factor)
        if self.gradient_predivide_factor != 1.0 and self.reduce_op != "average":
            raise ConfigurationError(
                f"gradient_predivide_factor={gradient_predivide_factor} applies to "
                f"reduce_op='average' only, not {self.reduce_op!r}."
            )
        self.fusion_threshold_mb = (
            None if fusion_threshold_mb is None else _positive("fusion_threshold_mb", fusion_threshold_mb, zero=True)
        )
        self.cycle_time_ms = None if cycle_time_ms is None else _positive("cycle_time_ms", cycle_time_ms)
        self.controller: Optional[str] = None
        self._hvd = None
        self._owns_horovod = False
        self._uses_mpi4py = False
        self._rendezvous = None
        self._env_vars = ScopedEnv()
        self._optimizers: list[torch.optim.Optimizer] = []
        self._leaving_on_error = False

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
        if hvd.is_initialized():  # the user started horovod already: join it, leave it running
            check_horovod_world(hvd, self.env)
            self.controller = "mpi" if hvd.mpi_enabled() else "gloo"
            self._check_reduce_op()
            return
        try:
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
            check_horovod_world(hvd, self.env)
            self.controller = "mpi" if hvd.mpi_enabled() else "gloo"
            self._check_reduce_op()
        except BaseException:
            self._leaving_on_error = True
            self._shutdown()
            raise

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        # Leaving on an error: other ranks may sit in another collective, so skip the final barrier.
        self._leaving_on_error = exc_type is not None
        super().__exit__(exc_type, *rest)

    def _shutdown(self) -> None:
        hvd = self._hvd
        if getattr(self, "_stuck", False):  # a timed-out wait: horovod.shutdown() would block too
            hvd = None
        if hvd is not None and self._owns_horovod and hvd.is_initialized():
            mpi = hvd.mpi_enabled()
            try:
                if not self._leaving_on_error:
                    hvd.barrier()  # nobody leaves while a rank still needs the job
            except Exception:  # noqa: BLE001 - a broken job still has to shut down
                pass
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

    def _check_reduce_op(self) -> None:
        if self.reduce_op == "adasum" and self.controller != "mpi" and self.device.type != "cuda":
            raise ConfigurationError(
                "reduce_op='adasum' on the CPU needs horovod's MPI controller; launch with "
                f"`mpirun -np {self.world_size} python train.py --backend horovod`."
            )

    # ---------------------------------------------------------------- training
    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move `model` to this rank's device and give every rank rank 0's parameters and buffers.

        Horovod puts no wrapper around the model; gradients are averaged by the optimizer that
        :meth:`wrap_optimizer` returns.
        """
        hvd = self._horovod()
        model = model.to(self.device)
        with self._collective("broadcast of the model's parameters and buffers"):
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The model itself: horovod does not wrap it."""
        return model

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, model: Optional[nn.Module] = None
    ) -> torch.optim.Optimizer:
        """Horovod's DistributedOptimizer over `model`'s named parameters, with rank 0's state.

        Args:
            optimizer: the optimizer built over ``model.parameters()``.
            model: the model from :meth:`wrap_model`; horovod names each gradient after it.

        Raises:
            ConfigurationError: `model` is missing or does not own the optimizer's parameters.
        """
        hvd = self._horovod()
        if model is None:
            raise ConfigurationError(
                "horovod names each gradient after the model's parameters: pass the model, "
                "`backend.wrap_optimizer(optimizer, model)`."
            )
        state = optimizer.state_dict()
        try:
            wrapped = hvd.DistributedOptimizer(
                optimizer,
                named_parameters=model.named_parameters(),
                compression=getattr(hvd.Compression, self.compression),
                backward_passes_per_step=self.accumulation_steps,
                op=getattr(hvd, _GRADIENT_OPS[self.reduce_op]),
                gradient_predivide_factor=self.gradient_predivide_factor,
            )
        except ValueError as exc:
            raise ConfigurationError(
                f"horovod cannot wrap this optimizer: {exc}. Build the optimizer over "
                "model.parameters() of the model you pass."
            ) from None
        wrapped.defaults = optimizer.defaults
        _accept_set_to_none(type(wrapped))
        if state["state"]:
            wrapped.load_state_dict(state)  # keep state loaded into the optimizer before wrapping
        self._broadcast_optimizer_state(hvd, wrapped, model)
        self._bound_gradient_sync(wrapped)
        self._optimizers.append(wrapped)
        return wrapped

    def _broadcast_optimizer_state(self, hvd, optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
        """Give every rank rank 0's optimizer state and hyperparameters.

        A fresh optimizer has no state; horovod's ``broadcast_optimizer_state`` would create one
        with a zero-gradient step (which counts as a step for Adam and moves parameters under
        weight decay), so then only the hyperparameters are broadcast.
        """
        with self._collective("broadcast of the optimizer state"):
            if hvd.broadcast_object(
                bool(optimizer.state_dict()["state"]), root_rank=0, name="paraflow.optimizer.has_state"
            ):
                hvd.broadcast_optimizer_state(optimizer, root_rank=0)
                # Ranks with no state of their own took that zero-gradient step: undo it.
                hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            else:
                groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
                groups = hvd.broadcast_object(groups, root_rank=0, name="paraflow.optimizer.groups")
                for group, options in zip(optimizer.param_groups, groups):
                    group.update(options)

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Backward passes inside accumulate gradients locally; the next one outside averages them.

        Same result as DDP's ``no_sync``: horovod's gradient hooks count backward passes per
        parameter and communicate when the count reaches zero; inside this context the counts are
        lifted out of reach, and restored on leaving, so those passes neither communicate nor count.
        """
        self._horovod()
        params = {id(p) for p in model.parameters()}
        optimizers = [o for o in self._optimizers if any(id(p) in params for p in o._allreduce_delay)]
        return _skip_gradient_allreduce(optimizers)

    def _skip_gradient_sync(self, model: nn.Module) -> ContextManager:
        """Nothing to skip: ``accumulation_steps`` is horovod's ``backward_passes_per_step``."""
        return contextlib.nullcontext()

    def join(self, model: nn.Module, *stateful: Any, enable: bool = True) -> ContextManager:
        """``hvd.join()`` on leaving; then the model and `stateful` come from the last rank to finish."""
        self._horovod()
        from ...training.join import horovod_join

        return horovod_join(self, model, stateful, enable)

    # ---------------------------------------------------------------- collectives
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        hvd = self._horovod()
        with self._collective(f"allreduce ({op}) of a {_describe(tensor)}"):
            return self._wait(
                hvd.allreduce_async_(
                    tensor.contiguous(), name=f"paraflow.allreduce.{op}", op=getattr(hvd, _COLLECTIVE_OPS[op])
                )
            )

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        hvd = self._horovod()
        with self._collective(f"broadcast from rank {src} of a {_describe(tensor)}"):
            return self._wait(
                hvd.broadcast_async_(tensor.contiguous(), root_rank=src, name=f"paraflow.broadcast.{src}")
            )

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        hvd = self._horovod()
        # One leading row per rank: horovod then requires every other dimension to agree.
        with self._collective(f"allgather of a {_describe(tensor)}"):
            gathered = self._wait(hvd.allgather_async(tensor.reshape(1, *tensor.shape), name="paraflow.allgather"))
        return list(gathered.unbind(0))

    def _barrier(self) -> None:
        """Wait for every rank (horovod's barrier)."""
        hvd = self._horovod()
        with self._collective("barrier"):
            hvd.barrier()

    # ---------------------------------------------------------------- helpers
    def _wait(self, handle: int) -> Any:
        """``hvd.synchronize(handle)``, failing after the timeout instead of waiting forever.

        Under the MPI controller horovod's own wait has no timeout: a rank that stops answering
        would block the others for good. After a timeout horovod's background thread may be
        stuck, so shutdown leaves horovod alone (MPI_Abort or horovod's exit handler ends it).
        """
        self._poll(handle)
        return self._hvd.synchronize(handle)

    def _poll(self, handle: int) -> None:
        """Return once `handle` is done; raise after the timeout (see :meth:`_wait`)."""
        try:
            wait_until(lambda: self._hvd.poll(handle), self.timeout, "waiting for the other ranks")
        except RuntimeError:
            self._stuck = True
            raise

    def _bound_gradient_sync(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer.step``'s wait for the gradient allreduces fail after the timeout."""
        synchronize = optimizer.synchronize

        def bounded_synchronize() -> None:
            with self._collective("gradient allreduce in optimizer.step"):
                for handle, _ in list(optimizer._handles.values()):
                    if isinstance(handle, int):
                        self._poll(handle)
                return synchronize()

        optimizer.synchronize = bounded_synchronize

    def _horovod(self):
        if self._hvd is None or self.controller is None:
            raise ParaflowError(f"backend {self.name!r} is not initialised; call init() first.")
        return self._hvd

    @contextlib.contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        """Turn horovod's errors into paraflow's, naming the collective and this rank."""
        start = time.monotonic()
        try:
            yield
        except ValueError as exc:  # horovod refuses the tensor itself (dtype, layout)
            raise ConfigurationError(f"horovod cannot run the {what}: {exc}") from exc
        except RuntimeError as exc:  # HorovodInternalError: ranks disagree, or the job broke
            translated = translate_collective_error(  # a timeout or a lost rank: paraflow.reliability.translation
                exc,
                collective=f"horovod {what}",
                rank=self.rank,
                world_size=self.world_size,
                backend=self.name,
                timeout=self.timeout,
                waited=time.monotonic() - start,
            )
            if translated is not None:
                raise translated from exc
            raise CollectiveError(
                f"horovod {what} failed on rank {self.rank}: {str(exc).rstrip('.')}. Every rank must call the same "
                "collectives in the same order with tensors of the same shape and dtype."
            ) from exc


@contextlib.contextmanager
def _skip_gradient_allreduce(optimizers: list) -> Iterator[None]:
    saved = [(o, dict(o._allreduce_delay), set(o._handles)) for o in optimizers]
    for optimizer, delays, _ in saved:
        for p in delays:
            optimizer._allreduce_delay[p] += _NO_SYNC_PASSES
    try:
        yield
    finally:
        for optimizer, delays, handles in saved:
            optimizer._allreduce_delay.update(delays)
            # Passes inside left (None, None) placeholders; drop them so zero_grad stays legal.
            for p in [p for p, h in optimizer._handles.items() if p not in handles and h[0] is None]:
                del optimizer._handles[p]


def _accept_set_to_none(cls: type) -> None:
    """Let horovod's optimizer class take torch's ``zero_grad(set_to_none=...)``, keeping its check."""
    horovod_zero_grad = cls.zero_grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            horovod_zero_grad(self)  # raises: zero_grad between backward and step
        super(cls, self).zero_grad(set_to_none=set_to_none)

    cls.zero_grad = zero_grad


def _describe(tensor: torch.Tensor) -> str:
    return f"{tensor.dtype} tensor of shape {list(tensor.shape)}"


def _choice(option: str, value: Any, accepted: tuple) -> str:
    if value not in accepted:
        raise ConfigurationError(f"{option}={value!r} is not one of {', '.join(map(repr, accepted))}.")
    return value


def _positive(option: str, value: Any, zero: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (number > 0 or (zero and number == 0)):
        raise ConfigurationError(f"{option} must be a {'non-negative' if zero else 'positive'} number, got {value!r}.")
    return number
