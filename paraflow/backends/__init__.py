"""Backend implementations, one module or folder each; each registers its own names here.

Registration names a class as "module:Class", so no backend module is imported until used.
"""

from ..core.registry import register

register("single", "paraflow.backends.single:SingleProcessBackend", "one process, no wrapper: the baseline")
register("dp", "paraflow.backends.dp:DataParallelBackend", "torch.nn.DataParallel over the visible GPUs, one process")

from . import ddp, fsdp, horovod  # noqa: E402,F401  (each registers its names, in this order)
