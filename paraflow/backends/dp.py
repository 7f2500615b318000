"""torch.nn.DataParallel: one process splitting each batch over the visible GPUs."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..core.compiling import CompileOption, compile_model, compile_options, uncompiled
from ..errors import ConfigurationError
from .single import SingleProcessBackend

__all__ = ["DataParallelBackend"]


class DataParallelBackend(SingleProcessBackend):
    """nn.DataParallel over every visible GPU; a pass-through on a CPU-only host.

    Options:
        device_ids: GPUs to use (default: all visible).
        output_device: GPU that gathers outputs (default: the first of device_ids).
    """

    OPTIONS = frozenset({"device_ids", "output_device"})
    _warned_cpu = False

    @property
    def replicas(self) -> int:
        """Every visible GPU when on CUDA, else one."""
        return self._gpus() if self.device.type == "cuda" else 1

    @property
    def transport(self) -> str:
        """Copies between GPUs inside one process when it splits over several, else none."""
        return "cuda copies" if self.device.type == "cuda" and self._gpus() > 1 else "none"

    def _gpus(self) -> int:
        return len(self.options.get("device_ids") or range(torch.cuda.device_count()))

    def _init(self) -> None:
        if self.device.type != "cuda" and not DataParallelBackend._warned_cpu:
            DataParallelBackend._warned_cpu = True
            warnings.warn(
                "dp: no GPU visible, so DataParallel runs as a pass-through on the CPU (one replica, no splitting).",
                stacklevel=3,
            )

    def wrap_model(self, model: nn.Module, compile: CompileOption = None) -> nn.Module:
        """Move `model` to the first GPU and wrap it in nn.DataParallel.

        With no GPU, torch's DataParallel keeps no device ids and calls the module directly.
        `compile` compiles the module inside DataParallel; over several GPUs, whose replicas
        DataParallel copies at every forward, a compiled model is refused (use ddp-nccl).
        """
        options = compile_options(compile)
        if isinstance(uncompiled(model), nn.DataParallel):
            raise ConfigurationError(
                "wrap_model was given a model it already wrapped (nn.DataParallel); wrapping it again would nest "
                "DataParallel in DataParallel. Pass the module itself (backend.unwrap(model)), or keep using the "
                "wrapped one."
            )
        if (options is not None or uncompiled(model) is not model) and self.device.type == "cuda" and self._gpus() > 1:
            raise ConfigurationError(
                "dp over several GPUs cannot train a compiled model: DataParallel copies the module to each GPU "
                "at every forward, which torch.compile does not follow. Use ddp-nccl (`paraflow run ddp-nccl "
                "train.py --compile`), or dp without compiling."
            )
        model = compile_model(model.to(self.device), options)
        if self.device.type != "cuda":
            return nn.DataParallel(model)
        ids = self.options.get("device_ids") or list(range(torch.cuda.device_count()))
        return nn.DataParallel(model, device_ids=ids, output_device=self.options.get("output_device"))
