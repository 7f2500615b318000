"""DistributedDataParallel: the backend (with its checked DDP module, its join) and its compression hooks."""

from ...core.registry import register

register(
    "ddp",
    "paraflow.backends.ddp.backend:DDPBackend",
    "DistributedDataParallel, NCCL when CUDA is available else gloo",
    alias_of="ddp-gloo or ddp-nccl",
    process_group="auto",
)
register(
    "ddp-gloo", "paraflow.backends.ddp.backend:DDPBackend", "DistributedDataParallel over gloo", process_group="gloo"
)
register(
    "ddp-nccl",
    "paraflow.backends.ddp.backend:DDPBackend",
    "DistributedDataParallel over NCCL (CUDA)",
    process_group="nccl",
)
