"""Old spellings of command-line flags, kept for one release: they work, and say the new spelling.

The command line uses one word per idea across subcommands (``--backend``, ``--launcher``,
``-n/--nprocs`` for total processes, timeouts named for what they bound, ``--nodes`` for a count of
hosts). A flag renamed to fit stays accepted under its old name for one release::

    parser.add_argument("--job-timeout", type=float, help="...")
    deprecated_alias(parser, "--timeout", "--job-timeout")

``--timeout 5`` then sets ``job_timeout`` and prints
``paraflow run: --timeout is deprecated; use --job-timeout`` on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

__all__ = ["deprecated_alias", "deprecated_flag", "DeprecatedAction"]


class DeprecatedAction(argparse.Action):
    """Store like the flag it stands for, after printing the new spelling on stderr."""

    def __init__(self, option_strings: list, dest: str, use: str, kind: str = "store", **kwargs: Any) -> None:
        self.use = use
        self.kind = kind  # "store", "const" (a switch) or "append"
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: Optional[str] = None,
    ) -> None:
        print(f"{parser.prog}: {option_string} is deprecated; use {self.use}", file=sys.stderr)
        if self.kind == "const":
            values = self.const
        elif self.kind == "append":
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


def deprecated_flag(
    parser: argparse.ArgumentParser, *names: str, use: str, kind: str = "store", **kwargs: Any
) -> argparse.Action:
    """Add option `names`, which works as `kwargs` say and prints "use `use`" whenever it is given.

    Args:
        parser: the parser to add it to.
        *names: the old option strings, e.g. ``"--timeout"``.
        use: the spelling to use instead, e.g. ``"--job-timeout"`` or ``"paraflow check comm"``.
        kind: ``"store"`` (takes a value), ``"const"`` (a switch storing ``const``) or ``"append"``.
        **kwargs: ``dest``, ``type``, ``default``, ``const``, ``choices``, ``metavar`` as for
            ``add_argument``.
    """
    if kind == "const":
        kwargs.setdefault("const", True)
        kwargs["nargs"] = 0
    return parser.add_argument(
        *names,
        action=DeprecatedAction,
        use=use,
        kind=kind,
        help=f"deprecated: use {use} (this spelling goes in the next release)",
        **kwargs,
    )


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str) -> argparse.Action:
    """Accept `old` as a deprecated spelling of `new`, an option `parser` already has.

    The alias stores into `new`'s destination with its type and choices, and prints
    ``PROG: OLD is deprecated; use NEW`` on stderr when given.
    """
    target = parser._option_string_actions.get(new)
    if target is None:
        raise ValueError(f"{parser.prog} has no option {new!r} to alias {old!r} to")
    kwargs: dict = {"dest": target.dest, "default": argparse.SUPPRESS}
    if target.nargs == 0:
        return deprecated_flag(parser, old, use=new, kind="const", const=target.const, **kwargs)
    kind = "append" if isinstance(target, argparse._AppendAction) else "store"
    kwargs.update(type=target.type, choices=target.choices, metavar=target.metavar or target.dest.upper())
    return deprecated_flag(parser, old, use=new, kind=kind, **kwargs)
