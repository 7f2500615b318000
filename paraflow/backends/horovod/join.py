"""Uneven inputs under horovod: ``hvd.join()``, under which finished ranks contribute zeros.

Afterwards the model and the state passed in are copied from the last rank to finish.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from ...training.join import copy_state_from

if TYPE_CHECKING:
    from ...core.backend import Backend

__all__ = ["horovod_join"]


@contextlib.contextmanager
def horovod_join(backend: Backend, model: nn.Module, stateful: Sequence[Any], enable: bool = True) -> Iterator[None]:
    """``hvd.join()`` on leaving; then copy the model and `stateful` from the last rank to finish."""
    yield
    if not enable:
        return
    import horovod.torch as hvd

    what = "hvd.join() and broadcast of the last rank's model in backend.join"
    with backend.horovod_errors(what), backend.bounded(what):
        last = hvd.join(backend.device.index if backend.device.type == "cuda" else -1)
        hvd.broadcast_parameters(backend.unwrap(model).state_dict(), root_rank=last)
    copy_state_from(backend, stateful, src=last)
