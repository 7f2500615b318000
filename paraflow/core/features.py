"""The training features every backend offers through one API: gradient accumulation, mixed
precision, uneven inputs, data sharding and checkpoints.

Each maps to the backend's own mechanism through a few hooks (``no_sync``,
``_skip_gradient_sync``, ``join``); the rest is backend-neutral.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, ContextManager, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from ..training.checkpoint import load_checkpoint, restore_state, save_checkpoint, state_to_save
from ..training.clipping import check_norm_type, clip_by_norm_, local_gradient, norm_power, total_norm
from ..training.precision import GradScaler, autocast, unscale_once
from ..training.sampler import ShardSampler
from ..training.shard_check import watch_epoch
from .options import check_number

__all__ = ["TrainingFeatures"]


class TrainingFeatures:
    """Accumulation, autocast, loss scaling, join, sampler, save, load and export for `Backend`."""

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
        """What `accumulate` enters on micro-batches that must not communicate."""
        return self.no_sync(model)

    # ---------------------------------------------------------------- gradient clipping
    def clip_grad_norm_(self, model: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the synchronised gradients of `model` to a total norm of `max_norm`; return that norm.

        Call it between ``backward()`` and ``optimizer.step()``, as torch's
        ``clip_grad_norm_``. It clips the gradients the optimizer will apply, on every backend:
        horovod finishes its allreduce first (the step then does not reduce again), fsdp sums
        the norm over every rank's shards, and with ``precision="fp16"`` the scaler from
        `grad_scaler` unscales first. The total norm (a tensor, ``inf`` allowed as
        `norm_type`) is the same on every rank and on every backend for the same global batch
        (`paraflow.training.clipping`).
        """
        max_norm = check_number("max_norm", max_norm, zero=True)
        norm_type = check_norm_type(norm_type)
        with self._marked("clip_grad_norm_"):
            grads = self._synchronised_gradients(model)
            power = self._gradient_norm_power(grads, norm_type)
            dtypes = {g.dtype for g in grads}
            total = total_norm(power, norm_type, dtypes.pop() if len(dtypes) == 1 else torch.float32)
            clip_by_norm_([local_gradient(g) for g in grads], max_norm, total)
        return total

    def clip_grad_value_(self, model: nn.Module, clip_value: float) -> None:
        """Clamp every synchronised gradient entry of `model` to ``[-clip_value, clip_value]``.

        Between ``backward()`` and ``optimizer.step()``, as `clip_grad_norm_` (horovod
        reduces first, the fp16 scaler unscales first).
        """
        clip_value = check_number("clip_value", clip_value, zero=True)
        with self._marked("clip_grad_value_"):
            for grad in self._synchronised_gradients(model):
                local_gradient(grad).clamp_(min=-clip_value, max=clip_value)

    def _synchronised_gradients(self, model: nn.Module) -> list:
        """`model`'s gradients once reduced across ranks and unscaled: what the next step applies."""
        self._synchronize_gradients(model)
        params = {id(p) for p in model.parameters()}
        optimizers = [o for o in self._wrapped_optimizers() if any(id(p) in params for p in _parameters(o))]
        for scaler in list(self._scalers):
            for optimizer in optimizers:
                unscale_once(scaler, optimizer)
        return [p.grad for p in model.parameters() if p.grad is not None]

    def _synchronize_gradients(self, model: nn.Module) -> None:
        """Finish reducing `model`'s gradients now (nothing to do where backward reduced them)."""

    def _gradient_norm_power(self, grads: list, norm_type: float) -> torch.Tensor:
        """Σ ‖g‖ᵖ over `grads` (max for inf) in float64, over all ranks' shards where they are sharded."""
        return norm_power(grads, norm_type, grads[0].device if grads else self.device)

    def _wrapped_optimizers(self) -> list:
        """The optimizers wrap_optimizer returned that are still alive."""
        return [o for o in (ref() for ref in self._optimizer_refs) if o is not None]

    def autocast(self) -> ContextManager:
        """torch.autocast to this backend's ``precision`` on its device; a no-op for fp32."""
        return autocast(self.precision, self.device)

    def grad_scaler(self, **kwargs: Any) -> GradScaler:
        """A gradient scaler, enabled for ``precision="fp16"`` only (a pass-through otherwise).

        Use it the torch way whatever the precision: ``scaler.scale(loss).backward()``,
        ``scaler.step(optimizer)``, ``scaler.update()``; its ``state_dict`` goes in checkpoints.
        `kwargs` go to ``torch.amp.GradScaler`` (init_scale, growth_interval, ...).
        """
        scaler = GradScaler(self.device.type, enabled=self.precision == "fp16", **kwargs)
        if scaler.is_enabled():
            self._scalers.add(scaler)  # clip_grad_norm_ unscales with it
        return scaler

    def join(self, model: nn.Module, *stateful: Any, enable: bool = True) -> ContextManager:
        """Context around a training loop whose ranks may run different numbers of batches.

        Ranks that finish early keep serving the others' gradient allreduces (a finished rank
        counts as a zero gradient) instead of hanging; on leaving, the model and every object in
        `stateful` (optimizer, grad scaler: anything with ``state_dict``) are copied from the last
        rank to finish. Other collectives must not run inside. One-process backends: no-op.
        """
        return contextlib.nullcontext()

    def distributed_sampler(
        self, dataset: Dataset, shuffle: bool = True, seed: int = 0, drop_last: bool = False
    ) -> ShardSampler:
        """A sampler giving this rank its shard of `dataset`; call ``set_epoch`` each epoch.

        Every sample goes to exactly one rank per epoch, reshuffled each epoch from `seed`. With
        ``drop_last=False`` shard lengths may differ by one (train under `join`); with
        ``drop_last=True`` the ``len(dataset) % world_size`` remainder is left out of each epoch
        so all shards are equal. Shards that give the ranks different numbers of batches outside
        `join` raise ConfigurationError at the epoch's first training forward, on every rank
        (`paraflow.training.shard_check`). See `paraflow.training.sampler.ShardSampler`.
        """
        sampler = ShardSampler(
            dataset, num_replicas=self.world_size, rank=self.rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        if self._activity is not None:  # uneven batch counts fail before the epoch's first step
            sampler.on_iteration = functools.partial(watch_epoch, self._activity)
        return sampler

    @contextlib.contextmanager
    def _joined_while(self, context: ContextManager, enable: bool) -> Iterator[None]:
        """Enter a backend's `join` context; while it is on, uneven batch counts are allowed."""
        counted = enable and self._activity is not None
        if counted:
            self._activity.joins += 1
        try:
            with context:
                yield
        finally:
            if counted:
                self._activity.joins -= 1

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: str, state: Mapping[str, Any]) -> None:
        """Write `state` to `path` atomically from rank 0; call on every rank.

        Modules are saved unwrapped, objects with ``state_dict`` by their state dict, anything
        else as it is; every rank's RNG states are added. See `paraflow.training.checkpoint`.
        """
        with self._marked("save"):
            save_checkpoint(self, path, state)

    def load(self, path: str, state: Optional[MutableMapping[str, Any]] = None) -> dict:
        """Restore `state` in place from `path` on every rank, after a barrier, on this device.

        Returns the saved entries not restored into an object (epoch, step, ...); RNG states are
        restored too. Works across backends. See `paraflow.training.checkpoint`.
        """
        with self._marked("load"):
            return load_checkpoint(self, path, state)

    def export(self, path: str, state: Mapping[str, Any]) -> None:
        """Write `state` as one full, unsharded checkpoint file that every backend's ``load`` reads.

        The same file as `save` on backends that hold whole models; a sharding backend
        gathers its shards into it. A collective call.
        """
        with self._marked("export"):
            save_checkpoint(self, path, state)

    def _state_to_save(self, state: Mapping[str, Any]) -> dict:
        """`state` as a full checkpoint stores it; called on every rank, rank 0's result is written.

        Override where models or optimizers are spread over ranks (gather them here).
        """
        return state_to_save(self, state)

    def _restore_state(self, state: Optional[MutableMapping[str, Any]], saved: Mapping[str, Any], path: str) -> dict:
        """Restore `state` in place from a full checkpoint's entries; return those not restored."""
        return restore_state(self, state, saved, path)


def _parameters(optimizer: torch.optim.Optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]
