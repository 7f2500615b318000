"""``paraflow.launch``: worker processes paraflow starts from a notebook or a script."""

from __future__ import annotations

from .base import Launcher

__all__ = ["ParaflowLaunch"]


class ParaflowLaunch(Launcher):
    """Its own variable names, so that a torchrun started inside a worker still wins."""

    name = "paraflow-launch"
    command = "paraflow.launch(fn, nprocs=N)"
    rank_variable, world_size_variable = "PARAFLOW_RANK", "PARAFLOW_WORLD_SIZE"
    local_rank_variable, local_world_size_variable = "PARAFLOW_LOCAL_RANK", "PARAFLOW_LOCAL_WORLD_SIZE"
    job_variables = ("MASTER_ADDR", "MASTER_PORT")
    stray_variables = ("PARAFLOW_WORLD_SIZE",)
