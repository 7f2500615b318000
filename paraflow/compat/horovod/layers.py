"""Horovod's ``Compression`` and ``SyncBatchNorm``; the drop-in's batch norm also runs on the CPU."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["Compression", "SyncBatchNorm"]


class NoneCompressor:
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor:
    """Sends floating-point tensors as float16 and restores their dtype on arrival."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple:
        return (tensor.to(torch.float16), tensor.dtype) if tensor.is_floating_point() else (tensor, tensor.dtype)

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    """``hvd.Compression.none`` and ``hvd.Compression.fp16``, as Horovod names them."""

    none = NoneCompressor
    fp16 = FP16Compressor


class SyncBatchNorm(_BatchNorm):
    """Batch norm whose statistics cover the batch of every rank, on the CPU or a GPU.

    Horovod's own needs a GPU. Here the per-channel sums are reduced with the drop-in's
    differentiable allreduce (mean first, then the squared deviations from it), so the backward
    pass is reduced too; in evaluation, or in one process, it is plain batch norm.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        from . import allreduce, size

        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        if (not self.training and self.track_running_stats) or size() == 1:
            use_batch = self.training or not self.track_running_stats
            return F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, use_batch, factor, self.eps
            )
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() // input.size(1)], dtype=input.dtype, device=input.device)
        total = allreduce(torch.cat([input.sum(dims), count]), op=1)  # hvd.Sum
        n = total[-1]
        mean = total[:-1] / n
        var = allreduce((input - mean.view(shape)).pow(2).sum(dims), op=1) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                unbiased = var.detach() * (n / (n - 1)) if n > 1 else var.detach()
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
