"""Horovod: the backend, its start-up (controller, knobs, rendezvous), optimizer, import and build."""

from ...core.registry import register

register(
    "horovod",
    "paraflow.backends.horovod.backend:HorovodBackend",
    "Horovod DistributedOptimizer; MPI controller under mpirun, gloo otherwise",
)
