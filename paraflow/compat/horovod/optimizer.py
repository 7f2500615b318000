"""Horovod's ``DistributedOptimizer`` over torch.distributed: the same hooks, counts and waits.

As in Horovod: the returned optimizer is an instance of a subclass of the given optimizer's class,
built over its parameter groups; a hook after each parameter's gradient is accumulated counts
backward passes, and when the count reaches ``backward_passes_per_step`` starts that gradient's
allreduce at once (overlapping the rest of the backward pass); ``synchronize()`` reduces any
gradient not started yet and waits for all of them; ``step()`` synchronizes unless inside
``skip_synchronize()``. The average is the sum times ``1 / size`` (split by
``gradient_predivide_factor`` into a factor before and one after the sum), as Horovod computes
it on the CPU. In one process nothing is reduced.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Optional

import torch

from ...errors import ConfigurationError
from . import ops, runtime
from .layers import Compression

__all__ = ["DistributedOptimizer"]


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = ops.Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = ops.global_process_set,
) -> torch.optim.Optimizer:
    """Wrap `optimizer` so that ``step()`` applies gradients reduced over every rank.

    Args:
        optimizer: the optimizer over the model's parameters.
        named_parameters: ``model.named_parameters()``, naming each gradient (default: by position).
        compression: ``hvd.Compression.none`` or ``hvd.Compression.fp16`` (gradients sent as float16).
        backward_passes_per_step: backward passes accumulated locally before one reduction.
        op: ``hvd.Average`` (default) or ``hvd.Sum``; ``hvd.Adasum`` is Horovod's alone.
        gradient_predivide_factor: with Average, scale by ``1 / factor`` before the sum and by
            ``factor / size`` after it.
        num_groups, groups: Horovod's grouping of allreduces; checked and accepted, the values are
            the same without it (each gradient is one torch allreduce).
        sparse_as_dense: sparse gradients are reduced as dense tensors in any case.
        process_set: the global process set only.
    """
    what = "hvd.DistributedOptimizer"
    ops._process_set(process_set, what)
    op = ops._op(None, op, what)
    if op not in (ops.Average, ops.Sum):
        raise ConfigurationError(f"{what}: op must be hvd.Average or hvd.Sum, got hvd.{ops.OP_NAMES[op]}.")
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise ConfigurationError(f"{what}: gradient_predivide_factor applies to op=hvd.Average only, as in Horovod.")
    if backward_passes_per_step <= 0:
        raise ConfigurationError(f"{what}: backward_passes_per_step must be > 0, got {backward_passes_per_step}.")
    _check_groups(groups if groups is not None else (num_groups or None))
    cls = type(optimizer.__class__.__name__, (_Distributed, optimizer.__class__), {})
    return cls(
        optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor
    )


def _check_groups(groups: Any) -> None:
    if groups is None:
        return
    if isinstance(groups, list):
        seen: set = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ConfigurationError("hvd.DistributedOptimizer: groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ConfigurationError("hvd.DistributedOptimizer: a parameter can only appear once in groups.")
                seen.add(id(p))
    elif not (isinstance(groups, int) and groups > 0):
        raise ConfigurationError(
            "hvd.DistributedOptimizer: groups should be a non-negative integer or a list of lists of torch.Tensor."
        )


class _Distributed(torch.optim.Optimizer):
    """The methods every DistributedOptimizer class adds to the user's optimizer class."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op, predivide) -> None:
        super().__init__(params)
        self._compression = compression
        named = (
            list(named_parameters)
            if named_parameters is not None
            else [
                (f"allreduce.noname.{i}.{j}", p)
                for i, g in enumerate(self.param_groups)
                for j, p in enumerate(g["params"])
            ]
        )
        _check_names(named, self.param_groups)
        self._parameter_names = {p: name for name, p in named}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for _, p in named}
        self.op = op
        self._scales = (1.0 / predivide, predivide) if op == ops.Average else (1.0, 1.0)
        self._handles: dict = {}
        self._requires_update: list = []
        self._synchronized = False
        self._should_synchronize = True
        self._hooks: list = []
        if runtime.backend().world_size > 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.requires_grad:
                        self._requires_update.append(p)
                        self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        super().load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(_: torch.Tensor) -> None:
            if self._handles.get(p, (None,))[0] is not None and self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before call to step(). "
                    "Increase backward_passes_per_step to accumulate gradients locally."
                )
            self._allreduce_delay[p] -= 1
            self._handles[p] = self._start(p) if self._allreduce_delay[p] == 0 else (None, None)

        return hook

    def _start(self, p: torch.Tensor) -> tuple:
        """Start the allreduce of `p`'s gradient: (handle, what decompression needs)."""
        if p.grad is None:  # this rank's forward did not use it; another's may have
            p.grad = torch.zeros_like(p)
        tensor = p.grad.to_dense() if p.grad.is_sparse else p.grad
        compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scales
        return ops.allreduce_async_(compressed, op=self.op, prescale_factor=prescale, postscale_factor=postscale), ctx

    def synchronize(self) -> None:
        """Finish every gradient's allreduce (starting those not started); ``p.grad`` then holds the result."""
        for p in self._requires_update:  # in parameter order: every rank must start them in the same order
            if p not in self._handles:
                self._handles[p] = self._start(p)
        for p, (handle, _) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._start(p)
        for p, (handle, ctx) in self._handles.items():
            output = self._compression.decompress(ops.synchronize(handle), ctx)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if p.grad.is_sparse:
                p.grad.zero_().add_(output.to_sparse())
            elif output is not p.grad:
                p.grad.copy_(output)
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside, ``step()`` does not synchronize: after ``synchronize()`` and clipping, say."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Optional[Any] = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after optimizer.synchronize(): "
                    "the gradients are reduced a second time.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). This is prohibited as it can cause a race condition."
            )
        super().zero_grad(set_to_none=set_to_none)


def _check_names(named: list, param_groups: list) -> None:
    if any(not isinstance(item, tuple) for item in named):
        raise ConfigurationError(
            "hvd.DistributedOptimizer: named_parameters should be a sequence of (name, parameter) tuples, "
            "usually model.named_parameters()."
        )
    names = [name for name, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigurationError(f"hvd.DistributedOptimizer: parameter names must be unique; found {duplicates}.")
    unnamed = {id(p) for g in param_groups for p in g["params"]} - {id(p) for _, p in named}
    if unnamed:
        raise ConfigurationError(
            f"hvd.DistributedOptimizer: named_parameters was given, but {len(unnamed)} of the optimizer's "
            "parameters are not in it; pass the named_parameters() of the model the optimizer trains."
        )
