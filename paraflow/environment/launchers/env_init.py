"""torch's plain env:// contract: MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK, nothing more.

Kubernetes' PyTorchJob (Kubeflow's training operator) starts each pod's ``python train.py`` with
exactly these, as does any scheduler that follows ``init_process_group("env://")``. No local rank
is given: ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are read when set, else each process is taken to
be alone on its host (one process per pod), which the banner says.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Identity, Launcher

__all__ = ["EnvInit"]


class EnvInit(Launcher):
    """Ranks started by anything that sets torch's env:// variables (a PyTorchJob's pods)."""

    name = "env://"
    command = "torchrun --nproc_per_node N train.py"  # where no scheduler sets the four variables
    label = "torch's env:// variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK)"
    rank_variable, world_size_variable = "RANK", "WORLD_SIZE"
    other_variables = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    job_variables = ("MASTER_ADDR", "MASTER_PORT")
    sets_master = True
    # Each process is its own job to whatever started it: nothing ends the others when one fails,
    # but their next collective fails on the lost connection, within the timeout.

    def identity(self, env: Mapping[str, str]) -> Identity:
        rank, world = self.integer(env, "RANK"), self.integer(env, "WORLD_SIZE")
        if env.get("LOCAL_RANK"):
            local_rank = self.integer(env, "LOCAL_RANK")
            local_world = self.integer(env, "LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else world
            return Identity(rank, world, local_rank, local_world, "local rank from LOCAL_RANK")
        assumed = "one process per host assumed, as no LOCAL_RANK is set; set LOCAL_RANK and LOCAL_WORLD_SIZE otherwise"
        return Identity(rank, world, 0, 1, assumed, local_known=False)
