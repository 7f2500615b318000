"""Options that belong to another registered backend: accepted, ignored, said once.

One script can then carry every backend's tuning (``reduce_op="adasum"`` for horovod,
``bucket_cap_mb=50`` for DDP) and run unchanged on any of them. A name that no registered
backend knows is still a typo, and an error listing what is accepted. The list is built from
the registry (each class's ``OPTIONS`` and presets), so a backend registered later counts too.
"""

from __future__ import annotations

import sys
from typing import Any

from ..errors import ConfigurationError
from .options import COMMON_OPTIONS

__all__ = ["split_foreign_options", "foreign_options_note", "announce_ignored"]

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


def foreign_options_note(name: str, ignored: dict[str, list[str]]) -> str:
    """The one line that says which options `name` ignores, and whose they are."""
    parts = [f"{option} ({' / '.join(owners)})" for option, owners in sorted(ignored.items())]
    return f"paraflow: backend {name!r} ignores option(s) of other backends: {', '.join(parts)}"


def announce_ignored(name: str, ignored: dict[str, list[str]], is_main: bool) -> None:
    """Print :func:`foreign_options_note` on stderr, on rank 0 only, once per process."""
    key = (name, tuple(sorted(ignored)))
    if not ignored or not is_main or key in _announced:
        return
    _announced.add(key)
    print(foreign_options_note(name, ignored), file=sys.stderr, flush=True)
