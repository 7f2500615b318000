"""Options every backend takes, checked at construction: timeout, compression, accumulation."""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigurationError

__all__ = [
    "COMMON_OPTIONS",
    "COMPRESSIONS",
    "DEFAULT_TIMEOUT_S",
    "REDUCE_OPS",
    "check_accumulation_steps",
    "check_compression",
    "check_one_of",
    "timeout_seconds",
]

#: Options every backend accepts besides its own OPTIONS.
COMMON_OPTIONS = frozenset(
    "num_threads timeout world_size device precision compression accumulation_steps banner stall_threshold "
    "check_collectives".split()
)
#: Gradient compressions any backend may offer; each backend lists the ones it can do.
COMPRESSIONS = ("none", "fp16", "bf16")
#: Reductions the public allreduce takes.
REDUCE_OPS = ("sum", "mean", "min", "max")
#: Seconds a collective or the start-up rendezvous may wait (PARAFLOW_TIMEOUT overrides it): long
#: enough for a rank-0 checkpoint write or evaluation, short enough that a hung job frees its
#: machines within minutes; torch's own default for NCCL. See README, "Failures".
DEFAULT_TIMEOUT_S = 600.0


def check_one_of(what: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return `value` if it is in `allowed`, else raise ConfigurationError listing the choices."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigurationError(f"{what} {value!r} is not one of {', '.join(map(repr, allowed))}.")
    return value


def check_compression(backend: str, compression: str, supported: Iterable[str], why: str = "") -> str:
    """Return `compression` if `backend` supports it; otherwise raise ConfigurationError naming it.

    Args:
        backend: the backend's name, for the message.
        compression: the requested value.
        supported: the values this backend can do.
        why: the reason the others are missing, appended to the message.
    """
    check_one_of("compression", compression, COMPRESSIONS)
    supported = [c for c in COMPRESSIONS if c in set(supported)]
    if compression not in supported:
        raise ConfigurationError(
            f"backend {backend!r} cannot do gradient compression {compression!r}"
            f"{': ' + why if why else ''}; it supports: {', '.join(map(repr, supported))}."
        )
    return compression


def check_accumulation_steps(value: Any) -> int:
    """Return `value` if it is an integer >= 1, else raise ConfigurationError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"accumulation_steps must be an integer >= 1, got {value!r}.")
    return value


def timeout_seconds(timeout: Any) -> float:
    """Seconds from `timeout` (number or timedelta), else PARAFLOW_TIMEOUT, else the default.

    Anything but a positive, finite number of seconds is a ConfigurationError naming where it
    came from.
    """
    source = "timeout"
    if timeout is None:
        if not os.environ.get("PARAFLOW_TIMEOUT"):
            return DEFAULT_TIMEOUT_S
        timeout, source = os.environ["PARAFLOW_TIMEOUT"], "PARAFLOW_TIMEOUT"
    if isinstance(timeout, datetime.timedelta):
        value = timeout.total_seconds()
    else:
        try:
            value = float(timeout)
        except (TypeError, ValueError):
            value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigurationError(
            f"{source}={timeout!r} is not a positive, finite number of seconds; "
            f"set it to e.g. 600 (the default) or 30 for a quick failure."
        )
    return value
