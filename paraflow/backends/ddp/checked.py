"""DistributedDataParallel whose unused-parameter error names the parameters and the fix."""

from __future__ import annotations

import re
from typing import Any, Optional

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...errors import ConfigurationError

__all__ = ["CheckedDistributedDataParallel", "unused_parameters_error"]

_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank \d+: ([^\n]+)")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


def unused_parameters_error(
    exc: BaseException, module: nn.Module, rank: int, option_hint: str
) -> Optional[ConfigurationError]:
    """The paraflow error for DDP's "parameters that were not used in producing loss", or None.

    Args:
        exc: what DistributedDataParallel raised.
        module: the user's module inside the DDP wrapper, to name parameters by index.
        rank: this process's global rank.
        option_hint: how to pass find_unused_parameters with this backend.
    """
    text = str(exc)
    if "find_unused_parameters" not in text:
        return None
    names = _UNUSED_NAMES.search(text)
    if names:
        unused = names.group(1).strip()
    else:
        indices = _UNUSED_INDICES.search(text)
        trained = [n for n, p in module.named_parameters() if p.requires_grad]
        numbers = [int(i) for i in indices.group(1).split()] if indices else []
        picked = [trained[i] for i in numbers if i < len(trained)]
        unused = ", ".join(picked) or "(see the error below)"
    return ConfigurationError(
        f"rank {rank}: parameters received no gradient in the last backward pass: {unused}. "
        f"DistributedDataParallel must be told: pass find_unused_parameters=True "
        f"({option_hint}); it costs one extra walk over the autograd graph per step. Or make "
        f"every parameter contribute to the loss, or freeze the unused ones with "
        f"requires_grad=False before wrap_model. Horovod needs no option: its "
        f"DistributedOptimizer allreduces a zero gradient for a parameter that got none (so "
        f"momentum and weight decay still move it); freeze such parameters there too."
    )


class CheckedDistributedDataParallel(DistributedDataParallel):
    """torch's DistributedDataParallel, whose unused-parameter error names the parameters and
    says how to pass find_unused_parameters through paraflow."""

    paraflow_backend_name = "ddp"

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """DistributedDataParallel.forward, with its unused-parameter error translated."""
        try:
            return super().forward(*inputs, **kwargs)
        except RuntimeError as exc:
            hint = f"paraflow.init({self.paraflow_backend_name!r}, find_unused_parameters=True)"
            error = unused_parameters_error(exc, self.module, self.process_group.rank(), hint)
            if error is None:
                raise
            raise error from exc
