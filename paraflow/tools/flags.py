"""Renamed command-line flags: an old spelling is an error that names the new one.

The command line uses one word per idea across subcommands (``--backend``, ``--launcher``,
``-n/--nprocs`` for total processes, timeouts named for what they bound, ``--nodes`` for a count of
hosts). A flag renamed to fit is kept as an error naming its new spelling::

    renamed(parser, "--timeout", use="--job-timeout")

``paraflow run --timeout 5`` then exits with status 2 and
``paraflow run: error: --timeout was renamed: use --job-timeout``.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

__all__ = ["renamed", "RenamedFlag"]


class RenamedFlag(argparse.Action):
    """Fail the parse, naming the spelling to use instead."""

    def __init__(self, option_strings: list, dest: str, use: str, **kwargs: Any) -> None:
        self.use = use
        super().__init__(option_strings, dest, nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: Optional[str] = None,
    ) -> None:
        parser.error(f"{option_string} was renamed: use {self.use}")


def renamed(parser: argparse.ArgumentParser, *old: str, use: str) -> argparse.Action:
    """Make the option strings `old` an error telling to `use` another spelling."""
    return parser.add_argument(*old, action=RenamedFlag, use=use, dest=f"renamed_{old[-1].lstrip('-')}")
