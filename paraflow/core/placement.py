"""Where a process computes: its device, its share of the host's CPU cores, and a launch that fits."""

from __future__ import annotations

import os
from typing import Optional

import torch

from ..errors import ConfigurationError, LauncherError

__all__ = ["check_launch", "cores", "select_device", "threads_per_process"]


def cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def select_device(requested: Optional[str], uses_cuda: bool, local_rank: int) -> torch.device:
    """The device for a process: `requested` ("cpu"/"cuda"), else CUDA when `uses_cuda`.

    CUDA puts local rank i on GPU i and fails when the host has fewer GPUs than processes.
    """
    want = requested or ("cuda" if uses_cuda else "cpu")
    if want == "cpu":
        return torch.device("cpu")
    if want == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError("device='cuda' was requested but torch sees no GPU.")
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise LauncherError(
                f"local rank {local_rank} has no GPU: this host has {count}. Start at most "
                f"{count} processes per host (`torchrun --nproc_per_node {count} ...`)."
            )
        return torch.device("cuda", local_rank)
    raise ConfigurationError(f"device={want!r} is not 'cpu' or 'cuda'.")


def threads_per_process(requested: Optional[int], local_world_size: int) -> int:
    """torch threads for one process: `requested`, else PARAFLOW_NUM_THREADS, else its share of cores."""
    if requested is not None:
        return max(1, int(requested))
    if os.environ.get("PARAFLOW_NUM_THREADS"):
        return max(1, int(os.environ["PARAFLOW_NUM_THREADS"]))
    return max(1, cores() // max(1, local_world_size))


def check_launch(name: str, expected_world_size: Optional[int], multi_process: bool, env) -> None:
    """Refuse a launch that does not match the backend: the wrong process count, or a one-process
    backend started as several processes; the message gives the command that fits."""
    if expected_world_size is not None and expected_world_size != env.world_size:
        if env.launched_by.is_plain:
            raise LauncherError(
                f"world_size={expected_world_size} was requested but no launcher started "
                f"this process (plain python is one process). Launch it with `torchrun "
                f"--nproc_per_node {expected_world_size} train.py --backend {name}` "
                f"or `mpirun -np {expected_world_size} python train.py --backend {name}`."
            )
        raise LauncherError(
            f"world_size={expected_world_size} was requested but {env.launcher} started "
            f"{env.world_size} processes; make the two agree."
        )
    if not multi_process and env.world_size > 1:
        raise LauncherError(
            f"backend {name!r} runs in one process, but {env.launcher} started "
            f"{env.world_size}. Run it with plain python (`python train.py --backend {name}`),"
            f" or use a multi-process backend: `torchrun --nproc_per_node {env.world_size} "
            f"train.py --backend ddp`."
        )
