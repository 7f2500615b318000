"""Sharded data parallelism on torch's FSDP2: the backend, block choice, optimizer rebuild, checkpoints."""

from ...core.registry import register

register(
    "fsdp",
    "paraflow.backends.fsdp.backend:FSDPBackend",
    "torch fully_shard (FSDP2): parameters, gradients and optimizer state sharded; NCCL with CUDA else gloo",
    process_group="auto",
)
