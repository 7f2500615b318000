"""DistributedDataParallel over NCCL or gloo, with torch.distributed collectives, whose unused-parameter
error names the parameters and the fix, and uneven inputs through torch's ``Join``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any, ContextManager, Optional

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...core.compiling import CompileOption, compile_model, compile_options, refuse_skipped_inner_module, uncompiled
from ...errors import ConfigurationError
from ...reliability.translation import collective_errors
from ...training.object_collectives import copy_state_from
from ...training.precision import HALF_DTYPES
from ..torch_distributed import TorchDistributedBackend
from .comm_hooks import compress_hook, release_continuations

__all__ = ["DDPBackend", "CheckedDistributedDataParallel", "unused_parameters_error"]


class DDPBackend(TorchDistributedBackend):
    """torch DistributedDataParallel; one process per device, any launcher.

    Options:
        process_group: "nccl", "gloo" or "auto" (NCCL when CUDA is available, else gloo).
        bucket_cap_mb, gradient_as_bucket_view, static_graph, find_unused_parameters,
        broadcast_buffers: passed to DistributedDataParallel unchanged.

    ``compression`` "fp16" / "bf16" registers torch's fp16/bf16 compression communication hook.
    """

    OPTIONS = TorchDistributedBackend.OPTIONS | {
        "bucket_cap_mb",
        "gradient_as_bucket_view",
        "static_graph",
        "find_unused_parameters",
        "broadcast_buffers",
    }
    COMPRESSIONS = frozenset({"none", "fp16", "bf16"})

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.ddp_options = dict(self.options)  # what is left is DistributedDataParallel's
        if (
            self.compression == "bf16"
            and self.transport == "nccl"
            and not (torch.cuda.is_bf16_supported() and torch.cuda.nccl.version() >= (2, 10))
        ):
            raise ConfigurationError(
                "compression 'bf16' over NCCL needs a GPU with bfloat16 support and "
                "NCCL >= 2.10; use compression='fp16'."
            )

    def _before_destroy(self) -> None:
        release_continuations()  # a gloo thread still releasing a hook's continuation needs the GIL

    def wrap_model(self, model: nn.Module, compile: CompileOption = None) -> nn.Module:
        """Move `model` to this rank's device and wrap it in DistributedDataParallel.

        DDP's constructor broadcasts rank 0's parameters and buffers: a rank that does not join
        it fails with CollectiveTimeoutError after the timeout. `compile` compiles the module
        inside DDP (``DDP(torch.compile(model))``): torch's compiler still splits its graph at
        DDP's buckets, so gradients are sent while backward runs.
        """
        self._live()
        options = compile_options(compile)
        if isinstance(uncompiled(model), DistributedDataParallel):
            raise ConfigurationError(
                "wrap_model was given a model it already wrapped (DistributedDataParallel); wrapping it again "
                "would nest DDP in DDP. Pass the module itself (backend.unwrap(model)), or keep using the wrapped one."
            )
        if options is not None or uncompiled(model) is not model:
            self._check_buckets_for_compiler()
        model = compile_model(model.to(self.device), options)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        with collective_errors(self, "wrap_model (DDP's broadcast of rank 0's parameters and buffers)"):
            wrapped = CheckedDistributedDataParallel(model, device_ids=device_ids, **self.ddp_options)
        wrapped.paraflow_backend_name = self.name
        if self.compression != "none":  # gradients cross at half their size (comm_hooks.compress_hook)
            wrapped.register_comm_hook(state=None, hook=compress_hook(HALF_DTYPES[self.compression]))
        return self._mark_model(wrapped)

    def _check_buckets_for_compiler(self) -> None:
        """torch's compiler splits a DDP model's graph at its buckets, none under the first (1 MB)."""
        first_mb = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", 0) / 2**20
        if self.ddp_options.get("bucket_cap_mb", 25) < first_mb:
            raise ConfigurationError(
                f"bucket_cap_mb={self.ddp_options['bucket_cap_mb']} is smaller than DDP's first bucket "
                f"({first_mb:g} MB), which torch's compiler does not accept for a compiled model: pass "
                f"bucket_cap_mb={first_mb:g} or more, or do not compile."
            )

    def no_sync(self, model: nn.Module) -> ContextManager:
        """DDP's own no_sync: gradients accumulate locally until a backward outside it."""
        if not isinstance(model, DistributedDataParallel):
            raise ConfigurationError("no_sync needs the model returned by wrap_model (a DDP module).")
        return model.no_sync()

    def join(self, model: nn.Module, *stateful: Any, enable: bool = True) -> ContextManager:
        """torch's ``Join`` over the DDP model; then `stateful` is copied from the last rank to finish."""
        if not isinstance(model, DistributedDataParallel):
            raise ConfigurationError("join needs the model returned by wrap_model (a DDP module).")
        return self._joined_while(self._ddp_join(model, stateful, enable), enable)

    @contextlib.contextmanager
    def _ddp_join(self, model: DistributedDataParallel, stateful: Sequence[Any], enable: bool) -> Iterator[None]:
        """torch's Join over the DDP model and the Joinables in `stateful`; then the other
        `stateful` objects are copied from the last rank to finish.

        DDP's join hook shadows the gradient allreduce on ranks that finished early (a finished
        rank counts as a zero gradient) and gives every rank the last rank's model afterwards.
        """
        from torch.distributed.algorithms.join import Join, Joinable

        joinables = [model] + [s for s in stateful if isinstance(s, Joinable)]
        others = [s for s in stateful if not isinstance(s, Joinable)]
        tracker = _last_joiner_tracker(model)
        with Join(joinables + [tracker], enable=enable):
            yield
        if enable and others:
            last = self.allgather(torch.tensor([int(tracker.is_last_joiner)], dtype=torch.int64))
            flags = [int(t.item()) for t in last]
            if not all(flags):  # some rank stopped early and missed optimizer steps
                copy_state_from(self, others, src=max(r for r, f in enumerate(flags) if f))


def _last_joiner_tracker(model: nn.Module):
    """A Joinable that only records whether this rank was among the last to join."""
    from torch.distributed.algorithms.join import Joinable, JoinHook

    class _Hook(JoinHook):
        def __init__(self, owner: _Tracker) -> None:
            self.owner = owner

        def post_hook(self, is_last_joiner: bool) -> None:
            self.owner.is_last_joiner = is_last_joiner

    class _Tracker(Joinable):
        def __init__(self) -> None:
            super().__init__()
            self.is_last_joiner = True

        def join_hook(self, **kwargs: Any) -> JoinHook:
            return _Hook(self)

        @property
        def join_device(self) -> torch.device:
            return model.join_device

        @property
        def join_process_group(self) -> Any:
            return model.join_process_group

    return _Tracker()


_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank \d+: ([^\n]+)")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


def unused_parameters_error(
    exc: BaseException, module: nn.Module, rank: int, option_hint: str
) -> Optional[ConfigurationError]:
    """The paraflow error for DDP's "parameters that were not used in producing loss", or None.

    Args:
        exc: what DistributedDataParallel raised.
        module: the user's module inside the DDP wrapper, to name parameters by index.
        rank: this process's global rank.
        option_hint: how to pass find_unused_parameters with this backend.
    """
    text = str(exc)
    if "find_unused_parameters" not in text:
        return None
    names = _UNUSED_NAMES.search(text)
    if names:
        unused = names.group(1).strip()
    else:
        indices = _UNUSED_INDICES.search(text)
        trained = [n for n, p in module.named_parameters() if p.requires_grad]
        numbers = [int(i) for i in indices.group(1).split()] if indices else []
        picked = [trained[i] for i in numbers if i < len(trained)]
        unused = ", ".join(picked) or "(see the error below)"
    return ConfigurationError(
        f"rank {rank}: parameters received no gradient in the last backward pass: {unused}. "
        f"DistributedDataParallel must be told: pass find_unused_parameters=True "
        f"({option_hint}); it costs one extra walk over the autograd graph per step. Or make "
        f"every parameter contribute to the loss, or freeze the unused ones with "
        f"requires_grad=False before wrap_model. Horovod needs no option: its "
        f"DistributedOptimizer allreduces a zero gradient for a parameter that got none (so "
        f"momentum and weight decay still move it); freeze such parameters there too."
    )


class CheckedDistributedDataParallel(DistributedDataParallel):
    """torch's DistributedDataParallel, whose unused-parameter error names the parameters and
    says how to pass find_unused_parameters through paraflow."""

    paraflow_backend_name = "ddp"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Freeing a gloo process group joins its worker threads. When DDP's reducer (C++) frees the
        # last reference, it does so holding the GIL, while a worker may still be freeing the last
        # backward's work, which needs the GIL (it holds a copy of autograd's thread-local Python
        # context): the process hangs in `del model` after destroy_process_group. Python's own
        # ProcessGroup object frees it with the GIL released; this attribute, set after the
        # reducer, is dropped after it, so that object always holds the last reference.
        self._process_group_outliving_reducer = self.process_group

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_process_group_outliving_reducer", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._process_group_outliving_reducer = self.process_group

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """DistributedDataParallel.forward, with its unused-parameter error translated; under
        ``torch.compile``, refused where the compiler would leave the module inside uncompiled."""
        if torch.compiler.is_compiling():
            refuse_skipped_inner_module(self.module)
        try:
            return super().forward(*inputs, **kwargs)
        except RuntimeError as exc:
            hint = f"paraflow.init({self.paraflow_backend_name!r}, find_unused_parameters=True)"
            error = unused_parameters_error(exc, self.module, self.process_group.rank(), hint)
            if error is None:
                raise
            raise error from exc
