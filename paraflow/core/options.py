"""Options every backend takes, checked at construction: timeout, compression, accumulation.

Options that belong to another registered backend are accepted, ignored and said once: one
script can then carry every backend's tuning (``reduce_op="adasum"`` for horovod,
``bucket_cap_mb=50`` for DDP) and run unchanged on any of them. A name that no registered
backend knows is still a typo, and an error listing what is accepted. The list is built from
the registry (each class's ``OPTIONS`` and presets), so a backend registered later counts too.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigurationError

__all__ = [
    "COMMON_OPTIONS",
    "COMPRESSIONS",
    "DEFAULT_TIMEOUT_S",
    "REDUCE_OPS",
    "check_compression",
    "check_count",
    "check_number",
    "check_one_of",
    "seconds_option",
    "split_foreign_options",
    "announce_ignored",
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


def check_count(name: str, value: Any) -> int:
    """Return `value` if it is an integer >= 1, else raise ConfigurationError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}.")
    return value


def check_number(name: str, value: Any, zero: bool = False) -> float:
    """`value` as a float if it is a positive number (or 0, where `zero`), else ConfigurationError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (number > 0 or (zero and number == 0)):
        raise ConfigurationError(f"{name} must be a {'non-negative' if zero else 'positive'} number, got {value!r}.")
    return number


def seconds_option(name: str, value: Any, env: str, default: float, zero_turns_off: bool = False) -> float:
    """Seconds from `value` (a number or timedelta), else the variable `env`, else `default`.

    Anything but a positive, finite number of seconds (or 0, where `zero_turns_off`) is a
    ConfigurationError naming where it came from.
    """
    source = name
    if value is None:
        if not os.environ.get(env):
            return default
        value, source = os.environ[env], env
    try:
        seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and (seconds > 0 or (zero_turns_off and seconds == 0))):
        wanted = "a number of seconds >= 0" if zero_turns_off else "a positive, finite number of seconds"
        raise ConfigurationError(
            f"{source}={value!r} is not {wanted}; set it to e.g. {default:g} (the default)"
            f"{', or 0 to turn it off' if zero_turns_off else ''}."
        )
    return seconds


# ---------------------------------------------------------------- other backends' options
_announced: set = set()  # (backend name, option names) already said in this process


def _options_by_backend() -> dict[str, frozenset]:
    """Every registered name -> the option names its class takes (its OPTIONS and presets)."""
    from .registry import registered_names, spec

    known: dict[str, frozenset] = {}
    for name in registered_names():
        s = spec(name)
        try:
            cls = s.load()
        except (ImportError, ConfigurationError):  # a backend that cannot be loaded here takes nothing here
            continue
        known[name] = frozenset(getattr(cls, "OPTIONS", ())) | frozenset(s.presets)
    return known


def split_foreign_options(name: str, own: frozenset, options: dict[str, Any]) -> dict[str, list[str]]:
    """Remove from `options` those another registered backend takes; return them by option name.

    Args:
        name: the backend being created.
        own: the option names it takes besides the common ones.
        options: the keyword options left after its own and the common ones; edited in place.

    Returns:
        option name -> the registered backends that take it.

    Raises:
        ConfigurationError: an option no registered backend takes (a typo), listing this
            backend's options and the other backends' ones.
    """
    if not set(options) - own:
        return {}
    known = _options_by_backend()
    owners = {
        option: sorted(n for n, names in known.items() if option in names and n != name)
        for option in options
        if option not in own
    }
    typos = sorted(o for o, who in owners.items() if not who)
    if typos:
        others = sorted(set().union(*known.values()) - own - COMMON_OPTIONS)
        raise ConfigurationError(
            f"backend {name!r} does not take option(s) {', '.join(typos)}, and no registered backend does "
            f"(a typo?). It accepts: {', '.join(sorted(own | COMMON_OPTIONS))}; other backends' options, "
            f"accepted and ignored here: {', '.join(others) or 'none'}."
        )
    for option in owners:
        del options[option]
    return owners


def announce_ignored(name: str, ignored: dict[str, list[str]], is_main: bool) -> None:
    """Say on stderr which options `name` ignores and whose they are, on rank 0 only, once per process."""
    key = (name, tuple(sorted(ignored)))
    if not ignored or not is_main or key in _announced:
        return
    _announced.add(key)
    parts = [f"{option} ({' / '.join(owners)})" for option, owners in sorted(ignored.items())]
    print(
        f"paraflow: backend {name!r} ignores option(s) of other backends: {', '.join(parts)}",
        file=sys.stderr,
        flush=True,
    )
