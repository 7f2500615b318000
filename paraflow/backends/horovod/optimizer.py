"""Horovod's DistributedOptimizer under paraflow: built from the user's optimizer and model,
rank 0's state given to every rank, the wait in ``step()`` bounded (by the watchdog, which costs
nothing while the wait ends in time), and ``no_sync`` for horovod.

Horovod averages gradients in the optimizer: hooks on each gradient accumulator start an
allreduce when a parameter's backward-pass count reaches ``backward_passes_per_step``, and
``step()`` (``synchronize()``) waits for them.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ...errors import ConfigurationError

__all__ = ["distributed_optimizer", "stop_gradient_allreduce", "resume_gradient_allreduce", "GRADIENT_OPS"]

GRADIENT_OPS = {"average": "Average", "sum": "Sum", "adasum": "Adasum"}
# Added to every gradient's pass counter inside no_sync, so horovod's hooks never reach zero there.
_NO_SYNC_PASSES = 1 << 30


def distributed_optimizer(
    backend: Any, hvd: Any, optimizer: torch.optim.Optimizer, model: Optional[nn.Module]
) -> torch.optim.Optimizer:
    """Horovod's DistributedOptimizer over the optimizer's parameters, with rank 0's state.

    Gradients are named after `model`'s parameters when it is given, else after their place in
    the optimizer's parameter groups (the same on every rank), so ``wrap_optimizer(optimizer)``
    works here as it does on DDP.

    Raises:
        ConfigurationError: `model` does not own the optimizer's parameters.
    """
    named = list(model.named_parameters()) if model is not None else _named_by_position(optimizer)
    state = optimizer.state_dict()
    try:
        wrapped = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=named,
            compression=getattr(hvd.Compression, backend.compression),
            backward_passes_per_step=backend.accumulation_steps,
            op=getattr(hvd, GRADIENT_OPS[backend.reduce_op]),
            gradient_predivide_factor=backend.gradient_predivide_factor,
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
    _broadcast_optimizer_state(backend, hvd, wrapped, named)
    _bound_gradient_sync(backend, wrapped)
    return wrapped


def _named_by_position(optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """Names for the optimizer's parameters from their group and index: the same on every rank."""
    return [
        (f"group{g}.param{i}", p)
        for g, group in enumerate(optimizer.param_groups)
        for i, p in enumerate(group["params"])
    ]


def _broadcast_optimizer_state(
    backend: Any, hvd: Any, optimizer: torch.optim.Optimizer, named: list[tuple[str, torch.Tensor]]
) -> None:
    """Give every rank rank 0's optimizer state and hyperparameters.

    A fresh optimizer has no state; horovod's ``broadcast_optimizer_state`` would create one
    with a zero-gradient step (which counts as a step for Adam and moves parameters under
    weight decay), so then only the hyperparameters are broadcast.
    """
    what = "broadcast of the optimizer state in wrap_optimizer"
    with backend.horovod_errors(what), backend.bounded(what):
        if hvd.broadcast_object(
            bool(optimizer.state_dict()["state"]), root_rank=0, name="paraflow.optimizer.has_state"
        ):
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            # Ranks with no state of their own took that zero-gradient step: undo it.
            hvd.broadcast_parameters([(f"paraflow.param.{n}", p.detach()) for n, p in named], root_rank=0)
        else:
            groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
            groups = hvd.broadcast_object(groups, root_rank=0, name="paraflow.optimizer.groups")
            for group, options in zip(optimizer.param_groups, groups):
                group.update(options)


def _bound_gradient_sync(backend: Any, optimizer: torch.optim.Optimizer) -> None:
    """Bound ``optimizer.step``'s wait for the gradient allreduces by the timeout; errors become paraflow's."""
    synchronize = optimizer.synchronize
    what = "gradient allreduce in optimizer.step"
    # Made once: every step enters them, one step at a time.
    errors, bounded = backend.horovod_errors(what), backend.bounded(what)

    def bounded_synchronize() -> None:
        if optimizer._synchronized and not optimizer._handles:
            return  # reduced already, and no backward pass since: a second allreduce would average again
        activity = backend._activity  # what backend._marked("optimizer.step") does, inline
        if activity is not None:
            activity.enter("optimizer.step")
        try:
            with errors, bounded:
                return synchronize()
        finally:
            if activity is not None:
                activity.leave("optimizer.step")

    optimizer.synchronize = bounded_synchronize
    _step_after_synchronize(type(optimizer))


def _step_after_synchronize(cls: type) -> None:
    """Make ``step()`` right after ``synchronize()`` step without reducing again.

    Horovod's own step would allreduce every gradient a second time (and warn) unless the script
    wraps it in ``skip_synchronize()``; a script written for DDP, or one that clipped through
    ``backend.clip_grad_norm_``, calls a bare ``optimizer.step()``.
    """
    horovod_step = cls.step

    def step(self, closure: Any = None) -> Any:
        if self._synchronized and self._should_synchronize:
            if self._handles:  # backward passes since that synchronize(): reduce them as usual
                self._synchronized = False
            else:
                with self.skip_synchronize():
                    return horovod_step(self, closure)
        return horovod_step(self, closure)

    cls.step = step


def stop_gradient_allreduce(optimizers: list) -> list:
    """Lift every gradient's pass counter out of reach, so horovod's hooks neither reduce nor
    count the backward passes to come; returns what :func:`resume_gradient_allreduce` restores."""
    saved = [(o, dict(o._allreduce_delay), set(o._handles)) for o in optimizers]
    for optimizer, delays, handles in saved:
        for p in delays:
            optimizer._allreduce_delay[p] += _NO_SYNC_PASSES
        optimizer._paraflow_handles_before_no_sync = handles
    return saved


def resume_gradient_allreduce(saved: list) -> None:
    """Undo :func:`stop_gradient_allreduce`: the next backward pass reduces what accumulated."""
    for optimizer, delays, handles in saved:
        optimizer._allreduce_delay.update(delays)
        _drop_no_sync_placeholders(optimizer, handles)
        optimizer._paraflow_handles_before_no_sync = None


def _drop_no_sync_placeholders(optimizer: torch.optim.Optimizer, handles: set) -> None:
    """Passes while stopped left (None, None) placeholders; drop them so zero_grad stays legal."""
    for p in [p for p, h in optimizer._handles.items() if p not in handles and h[0] is None]:
        del optimizer._handles[p]


def _accept_set_to_none(cls: type) -> None:
    """Let horovod's optimizer class take torch's ``zero_grad(set_to_none=...)``, keeping its check."""
    horovod_zero_grad = cls.zero_grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        before_no_sync = getattr(self, "_paraflow_handles_before_no_sync", None)
        if before_no_sync is not None:  # after a step under no_sync, before the next forward outside it
            _drop_no_sync_placeholders(self, before_no_sync)
        if self._handles:
            horovod_zero_grad(self)  # raises: zero_grad between backward and step
        super(cls, self).zero_grad(set_to_none=set_to_none)

    cls.zero_grad = zero_grad
