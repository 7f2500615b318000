"""Sharded data parallelism on torch's FSDP2 (``fully_shard``): DTensor parameters on a 1-D mesh.

Every rank holds 1/n of each parameter, its gradient and its optimizer state. Before each
unit's forward (and again in backward) its parameters are all-gathered, and gradients are
reduce-scattered and averaged after backward. The process group, rendezvous, deadlines and
collectives are the shared torch.distributed ones (:class:`TorchDistributedBackend`).
"""

from __future__ import annotations

import contextlib
import math
import os
import weakref
from collections.abc import Mapping, MutableMapping
from typing import Any, ContextManager, Optional

import torch
import torch.distributed as dist
from torch import nn

from ...core.compiling import (
    CompileOption,
    compile_forwards,
    compile_model,
    compile_options,
    compiler_of,
    refuse_eager_under_compile,
    skipped_by_compiler,
    skipped_message,
    uncompiled,
)
from ...core.options import check_count
from ...errors import ConfigurationError
from ...training.no_sync import forward_decided_sync
from ..torch_distributed import TorchDistributedBackend
from .checkpoint import (
    ShardedCheckpointer,
    full_model_state,
    full_optimizer_state,
    is_sharded,
    load_full_model_state,
    load_full_optimizer_state,
    owner_of,
    reshard,
)
from .optimizer import model_of, rebuild_optimizer, remember_parameters
from .wrap import DEFAULT_MIN_BLOCK_PARAMS, check_blocks, choose_blocks, mixed_precision_policy

__all__ = ["FSDPBackend"]


class FSDPBackend(TorchDistributedBackend):
    """torch's fully_shard over NCCL or gloo; one process per device, any launcher DDP takes.

    Options:
        process_group: "nccl", "gloo" or "auto" (NCCL when CUDA is available, else gloo).
        blocks: module classes sharded as units of their own ("TransformerEncoderLayer",
            [nn.Linear], "Linear,Conv2d"; ``()`` for the root alone). Default: transformer
            layers, and any submodule with at least `min_block_params` parameters of its own.
        min_block_params: the size threshold of the default choice (50,000).
        reshard_after_forward: fully_shard's option: free gathered parameters after forward
            (True) or keep them for backward (False); default torch's (True except the root).
        async_save: ``save`` returns once the shards are copied to memory; they are written
            and committed in the background (the next save, load or shutdown waits).

    ``precision`` sets FSDP's MixedPrecisionPolicy(param_dtype), ``compression`` its
    reduce_dtype; ``accumulation_steps`` and ``no_sync`` use its gradient-sync switch.
    """

    OPTIONS = TorchDistributedBackend.OPTIONS | {"blocks", "min_block_params", "reshard_after_forward", "async_save"}
    COMPRESSIONS = frozenset({"none", "fp16", "bf16"})

    def __init__(
        self,
        name: str,
        *,
        blocks: Any = None,
        min_block_params: Optional[int] = None,
        reshard_after_forward: Optional[bool] = None,
        async_save: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(name, **options)
        if blocks is not None and min_block_params is not None:
            raise ConfigurationError("pass blocks or min_block_params, not both: blocks names them outright.")
        self.blocks = check_blocks(blocks)
        self.min_block_params = check_count(
            "min_block_params", DEFAULT_MIN_BLOCK_PARAMS if min_block_params is None else min_block_params
        )
        if reshard_after_forward not in (None, True, False):
            raise ConfigurationError(
                f"reshard_after_forward must be True, False or None, got {reshard_after_forward!r}."
            )
        self.reshard_after_forward = reshard_after_forward
        if not isinstance(async_save, bool):
            raise ConfigurationError(f"async_save must be True or False, got {async_save!r}.")
        self.async_save = async_save
        self._mesh = None
        self._originals: dict = {}
        self._owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._checkpointer = ShardedCheckpointer(self)

    @classmethod
    def unavailable_reason(cls, process_group: str = "auto", **presets: Any) -> Optional[str]:
        """Why fsdp cannot run here: the process group's reasons, an old torch, or no NumPy."""
        reason = super().unavailable_reason(process_group=process_group, **presets)
        if reason:
            return reason
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no fully_shard (FSDP2); pip install 'torch>=2.6'"
        try:
            import numpy  # noqa: F401  (torch.distributed.checkpoint needs it)
        except ImportError:
            return "torch.distributed.checkpoint needs NumPy: pip install 'paraflow[fsdp]' (or pip install numpy)"
        return None

    # ---------------------------------------------------------------- model and optimizer
    def wrap_model(self, model: nn.Module, compile: CompileOption = None) -> nn.Module:
        """Move `model` to this rank's device, copy rank 0's weights, shard each block, then the root.

        The module is changed in place (its parameters become DTensor shards) and returned;
        compiled after sharding, as FSDP2 wants, with `compile`. A model compiled before
        (``torch.compile(model)``) has its module sharded inside the compiled wrapper, which is
        returned: it compiles the sharded module, with the options it was given.
        """
        from torch.distributed.fsdp import FSDPModule, fully_shard

        options_to_compile = compile_options(compile)
        compiled = model if uncompiled(model) is not model else None
        if compiled is not None and options_to_compile is not None:
            compile_model(compiled, options_to_compile)  # raises: compiling a compiled model
        model = uncompiled(model)
        if isinstance(model, FSDPModule) or is_sharded(model):
            raise ConfigurationError("this model is already sharded; call wrap_model once per model.")
        model = model.to(self.device)
        with torch.no_grad():  # start from rank 0's weights, as DDP does
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        self._originals.update(remember_parameters(model))
        first = next(model.parameters(), None)
        policy = mixed_precision_policy(
            self.precision, self.compression, first.dtype if first is not None else torch.float32
        )
        options = {
            "mesh": self._device_mesh(),
            "mp_policy": policy,
            "reshard_after_forward": self.reshard_after_forward,
        }
        blocks = choose_blocks(model, self.blocks, self.min_block_params)
        if blocks and (compiled is not None or options_to_compile is not None) and skipped_by_compiler(model):
            raise ConfigurationError(skipped_message(model, "fsdp-root"))
        for block in blocks:
            fully_shard(block, **options)
        fully_shard(model, **options)
        model.paraflow_blocks = [name for name, m in model.named_modules() if any(m is b for b in blocks)]
        for sharded in [*blocks, model]:  # a torch.compile(wrapped) that would leave one eager is refused
            sharded.register_forward_pre_hook(refuse_eager_under_compile, prepend=True)
        if compiled is not None:  # sharded in place inside it: its first forward compiles the shards
            compile_forwards([*blocks, model], compiler_of(compiled))
            return self._mark_model(compiled)
        if options_to_compile is not None:
            compile_forwards([*blocks, model], lambda forward: torch.compile(forward, **options_to_compile))
        return self._mark_model(compile_model(model, options_to_compile))

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, model: Optional[nn.Module] = None
    ) -> torch.optim.Optimizer:
        """`optimizer` over `model`'s sharded parameters: the same one if built after wrap_model,
        else one rebuilt with the same class, param groups and hyperparameters. Without `model`,
        the model wrap_model sharded from the optimizer's parameters."""
        model = None if model is None else uncompiled(model)
        if model is None:
            if is_sharded(optimizer):
                return super().wrap_optimizer(optimizer)
            model = model_of(optimizer, self._originals)
            if model is None:
                raise ConfigurationError(
                    "fsdp replaced the model's parameters with shards, and this optimizer's parameters are not "
                    "those of one model wrap_model sharded; pass the model: backend.wrap_optimizer(optimizer, model)."
                )
        reshard([model])
        rebuilt = rebuild_optimizer(optimizer, model, self._originals)
        self._owners[rebuilt] = model
        return super().wrap_optimizer(rebuilt, model)  # the stall report sees its steps

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The model itself (fully_shard changes it in place), without torch.compile's wrapper."""
        return uncompiled(model)

    def no_sync(self, model: nn.Module) -> ContextManager:
        """FSDP's gradient-sync switch off for backward passes inside, and for those of forwards
        run inside (DDP's meaning, :mod:`paraflow.training.no_sync`): gradients accumulate
        unsharded on each rank, uncommunicated, until the backward of a forward outside."""
        from torch.distributed.fsdp import FSDPModule

        model = uncompiled(model)
        if not isinstance(model, FSDPModule):
            raise ConfigurationError("no_sync needs the model returned by wrap_model (a sharded module).")

        def stop() -> None:
            model.set_requires_gradient_sync(False)

        def resume(_: Any) -> None:
            model.set_requires_gradient_sync(True)

        return forward_decided_sync(model, stop, resume, owner=self).context()

    def _gradient_norm_power(self, grads: list, norm_type: float) -> torch.Tensor:
        """Each rank's shards' Σ ‖g‖ᵖ, summed over ranks (max for inf); whole gradients added once."""
        from torch.distributed.tensor import DTensor

        from ...training.clipping import norm_power

        sharded = [isinstance(g, DTensor) and any(p.is_shard() for p in g.placements) for g in grads]
        shards = [g.to_local() for g, s in zip(grads, sharded) if s]
        whole = [g.to_local() if isinstance(g, DTensor) else g for g, s in zip(grads, sharded) if not s]
        inf = math.isinf(norm_type)
        power = self.allreduce(norm_power(shards, norm_type, self.device), op="max" if inf else "sum")
        if not whole:
            return power
        rest = norm_power(whole, norm_type, self.device)
        return torch.maximum(power, rest) if inf else power + rest

    def join(self, model: nn.Module, *stateful: Any, enable: bool = True) -> ContextManager:
        """Refused when enabled: every rank must run every forward under fsdp."""
        if not enable:
            return contextlib.nullcontext()
        raise ConfigurationError(
            "fsdp cannot let ranks finish early: each forward all-gathers parameters from every rank, so "
            "every rank must run every batch. Give ranks equal shards: "
            "backend.distributed_sampler(dataset, drop_last=True) (train.py --drop-last)."
        )

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: str, state: Mapping[str, Any]) -> None:
        """Write a sharded checkpoint (a directory, each rank its own shards), committed atomically.

        With ``async_save=True`` it returns once the shards are staged in memory. Any number of
        fsdp ranks can load it, resharded; ddp, horovod and single load it too, read whole. For
        one full file instead, :meth:`export`.
        """
        with self._marked("save"):  # a wait on a missing rank shows in the stall report
            reshard(state.values())
            self._checkpointer.save(path, state, self.async_save)

    def load(self, path: str, state: Optional[MutableMapping[str, Any]] = None) -> dict:
        """Restore `state` from a sharded checkpoint directory or a full file of any backend."""
        with self._marked("load"):
            reshard((state or {}).values())
            if os.path.isdir(path):
                return self._checkpointer.load(path, state)
            self._checkpointer.wait()
            return super().load(path, state)

    def export(self, path: str, state: Mapping[str, Any]) -> None:
        """Gather the shards into one full checkpoint file, as ddp, horovod and single write it."""
        self._checkpointer.wait()
        reshard(state.values())
        super().export(path, state)

    def wait_for_checkpoint(self) -> None:
        """Wait until an asynchronous save is written and committed (raises if it failed)."""
        self._checkpointer.wait()

    def _state_to_save(self, state: Mapping[str, Any]) -> dict:
        saved = {}
        for key, value in state.items():
            if isinstance(value, nn.Module) and is_sharded(value):
                saved[key] = full_model_state(uncompiled(value))
            elif isinstance(value, torch.optim.Optimizer) and is_sharded(value):
                saved[key] = full_optimizer_state(self._owner(value, state), value)
            else:
                saved.update(super()._state_to_save({key: value}))
        return saved

    def _restore_state(self, state: Optional[MutableMapping[str, Any]], saved: Mapping[str, Any], path: str) -> dict:
        state = state if state is not None else {}
        sharded = {k: v for k, v in state.items() if is_sharded(v)}
        others = {k: v for k, v in state.items() if k not in sharded}
        rest = super()._restore_state(others, saved, path)
        state.update(others)  # plain entries (epoch, step) were replaced in `others`
        for key, target in sharded.items():
            if key not in saved:
                raise ConfigurationError(f"checkpoint {path} has no entry {key!r}; it has: {', '.join(saved)}.")
            try:
                if isinstance(target, nn.Module):
                    load_full_model_state(uncompiled(target), saved[key])
                else:
                    load_full_optimizer_state(self._owner(target, state), target, saved[key])
            except (RuntimeError, KeyError, ValueError) as exc:
                raise ConfigurationError(
                    f"checkpoint entry {key!r} does not fit this {type(target).__name__}: {exc}"
                ) from exc
            rest.pop(key, None)
        return rest

    def _owner(self, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> nn.Module:
        return owner_of(optimizer, self._owners.get(optimizer), state)

    # ---------------------------------------------------------------- lifecycle
    def _device_mesh(self):
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device.type, (self.world_size,))
        return self._mesh

    def _shutdown(self) -> None:
        try:
            self._checkpointer.close()  # an asynchronous save still writing needs the process group
        finally:
            self._mesh = None
            super()._shutdown()
