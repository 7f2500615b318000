"""Horovod's DistributedOptimizer under paraflow: built from the user's optimizer and model,
rank 0's state given to every rank, the wait in ``step()`` bounded (by the watchdog, which costs
nothing while the wait ends in time), and ``no_sync`` for horovod.

Horovod averages gradients in the optimizer: hooks on each gradient accumulator start an
allreduce when a parameter's backward-pass count reaches ``backward_passes_per_step``, and
``step()`` (``synchronize()``) waits for them. Here the wait comes sooner, as on DDP: a backward
pass that started allreduces waits for them as it ends (a callback queued on torch's autograd
engine), so ``p.grad`` holds the average when ``backward()`` returns and code between backward
and step (``torch.nn.utils.clip_grad_norm_``, gradient logging) sees what DDP would show. The
allreduces still overlap the rest of the backward pass; micro-batches that start none (the first
``backward_passes_per_step - 1``, or under ``no_sync``) wait for nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

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
    wait = _bound_gradient_sync(backend, wrapped)
    _wait_when_backward_ends(wrapped, wait)
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
    if backend._state_synced_by_elastic_run():
        return
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


def _bound_gradient_sync(backend: Any, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """Bound the wait for the gradient allreduces by the timeout, errors becoming paraflow's, in
    ``optimizer.synchronize`` (and so ``step``); returns that wait unmarked, for the end of backward."""
    synchronize = optimizer.synchronize
    what = "gradient allreduce"
    # Made once: every step enters them, one step at a time.
    errors, bounded = backend.horovod_errors(what), backend.bounded(what)

    def wait() -> None:
        """Wait for the allreduces the backward passes started (the stall report's phase unchanged)."""
        optimizer._paraflow_wait_queued = False  # also after a backward pass that failed before its end
        if optimizer._synchronized and not optimizer._handles:
            return  # reduced already, and no backward pass since: a second allreduce would average again
        with errors, bounded:
            synchronize()
        if getattr(optimizer, "_paraflow_stopped", False):  # a step inside no_sync: horovod reset the counts
            _lift(optimizer)

    def bounded_synchronize() -> None:
        activity = backend._activity  # what backend._marked("optimizer.step") does, inline
        if activity is not None:
            activity.enter("optimizer.step")
        try:
            wait()
        finally:
            if activity is not None:
                activity.leave("optimizer.step")

    optimizer.synchronize = bounded_synchronize
    _step_after_synchronize(type(optimizer))
    return wait


def _wait_when_backward_ends(optimizer: torch.optim.Optimizer, wait: Callable[[], None]) -> None:
    """Run `wait` at the end of every backward pass in which one of horovod's hooks started an allreduce.

    A hook of ours follows horovod's on each gradient accumulator: once horovod's has brought the
    parameter's pass count to zero (its allreduce started, or its group's will), it queues `wait`
    on the autograd engine, once per backward pass, to run when the pass ends.
    """
    queue_callback = torch.autograd.Variable._execution_engine.queue_callback
    delays = optimizer._allreduce_delay
    optimizer._paraflow_wait_queued = False

    def after_horovods_hook(p: torch.Tensor) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            if delays[p] <= 0 and not optimizer._paraflow_wait_queued:
                optimizer._paraflow_wait_queued = True
                queue_callback(wait)

        return hook

    trainable = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    # horovod registered its hooks in this order, keeping each accumulator in _grad_accs (none in one process)
    for p, accumulator in zip(trainable, optimizer._grad_accs):
        accumulator.register_hook(after_horovods_hook(p))


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
    for optimizer, _, _ in saved:
        _lift(optimizer)
        optimizer._paraflow_stopped = True
    return saved


def _lift(optimizer: torch.optim.Optimizer) -> None:
    for p in optimizer._allreduce_delay:
        optimizer._allreduce_delay[p] += _NO_SYNC_PASSES


def resume_gradient_allreduce(saved: list) -> None:
    """Undo :func:`stop_gradient_allreduce`: the next backward pass reduces what accumulated."""
    for optimizer, delays, handles in saved:
        optimizer._paraflow_stopped = False
        optimizer._allreduce_delay.update(delays)
        _drop_placeholders(optimizer, keep=handles)


def _drop_placeholders(optimizer: torch.optim.Optimizer, keep: Any = ()) -> None:
    """Drop the (None, None) handles passes left while reduction was stopped (zero_grad refuses them)."""
    for p in [p for p, h in optimizer._handles.items() if p not in keep and h[0] is None]:
        del optimizer._handles[p]


def _accept_set_to_none(cls: type) -> None:
    """Let horovod's optimizer class take torch's ``zero_grad(set_to_none=...)``, keeping its check."""
    horovod_zero_grad = cls.zero_grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        if getattr(self, "_paraflow_stopped", False):  # passes under no_sync: nothing in flight to race
            _drop_placeholders(self)
        if self._handles:
            horovod_zero_grad(self)  # raises: zero_grad between backward and step
        super(cls, self).zero_grad(set_to_none=set_to_none)

    cls.zero_grad = zero_grad
